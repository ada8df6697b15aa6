"""The generated stubs of vz.api.v1 under public names, and the one conversion between them and the local wire.

``to_wire(message)`` turns a vz.api.v1 message into exactly the JSON object the local wire carries for it, and
``from_wire(data, cls)`` parses one (unknown keys are refused: a mismatch between the .proto and what the daemon
sends fails loudly). The rules are proto3's JSON mapping with the field names of the .proto, plus what the local
wire fixes and proto3 JSON leaves open (docs/api.md): 64-bit integers are numbers; a field marked
``(vz.api.v1.nullable)`` is ``null`` when unset, any other unset field with presence is absent; a repeated field
marked ``(vz.api.v1.omit_empty)`` is absent when empty; integral numbers inside free-form Struct/Value parts are
ints (protobuf keeps every JSON number as a double).

``METHODS`` describes every rpc: the rows of the one method table (``vz_core.wire.METHODS``, generated from the
descriptor) with their request and response classes. ``error_to_status`` and
``error_from_status`` carry the local wire's error object over gRPC.

Importing this module imports protobuf and grpc: the local transport of ``vz_core.api`` never does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from vz_core._proto.devsy.runtime.v1 import runtime_pb2
from vz_core._proto.vz.api.v1 import api_pb2, api_pb2_grpc

__all__ = [
    "API_ERROR_TYPE_URL",
    "METHODS",
    "RUNTIME_ERROR_TYPE_URL",
    "MethodSpec",
    "api_pb2",
    "api_pb2_grpc",
    "error_from_status_details",
    "error_to_status",
    "from_wire",
    "grpc_code_name",
    "method",
    "runtime_pb2",
    "to_wire",
]

RUNTIME_ERROR_TYPE_URL = "type.googleapis.com/devsy.runtime.v1.RuntimeError"
API_ERROR_TYPE_URL = "type.googleapis.com/vz.api.v1.ErrorInfo"

_M = TypeVar("_M", bound=Message)
_STRUCT = "google.protobuf.Struct"
_VALUE = "google.protobuf.Value"
_LIST = "google.protobuf.ListValue"


def _free(value: Any) -> Any:
    """A Struct/Value's JSON with integral doubles as ints (protobuf stores every JSON number as a double)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _free(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_free(v) for v in value]
    return value


def _scalar(field: Any, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type.values_by_number.get(value)
        return enum.name if enum is not None else value
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _message(value)
    return value


def _message(msg: Message) -> Any:
    name = msg.DESCRIPTOR.full_name
    if name in (_STRUCT, _VALUE, _LIST):
        return _free(json_format.MessageToDict(msg))
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        options: Any = field.GetOptions()
        value = getattr(msg, field.name)
        if field.is_repeated:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                out[field.name] = {k: _scalar(value_field, v) for k, v in value.items()}
                continue
            items = [_scalar(field, v) for v in value]
            if not items and options.Extensions[api_pb2.omit_empty]:
                continue
            out[field.name] = items
        elif field.has_presence:
            if msg.HasField(field.name):
                out[field.name] = _scalar(field, value)
            elif options.Extensions[api_pb2.nullable]:
                out[field.name] = None
        else:
            out[field.name] = _scalar(field, value)
    return out


def to_wire(message: Message) -> dict[str, Any]:
    """The local wire's JSON object of a vz.api.v1 message (see the module docstring)."""
    out = _message(message)
    assert isinstance(out, dict)
    return out


def from_wire(data: Mapping[str, Any], cls: type[_M]) -> _M:
    """Parse a local-wire JSON object into ``cls``; unknown fields raise ``google.protobuf.json_format.ParseError``."""
    message = cls()
    json_format.ParseDict(dict(data), message, ignore_unknown_fields=False)
    return message


@dataclass(frozen=True)
class MethodSpec:
    """One rpc of vz.api.v1."""

    name: str
    """The local wire's method name, ``Service.Rpc`` (e.g. ``Environments.Up``)."""
    path: str
    """The gRPC method path (``/vz.api.v1.Environments/Up``)."""
    request: type[Message]
    response: type[Message]
    client_streaming: bool
    server_streaming: bool
    passive: bool
    """Not a Machine operation (``vz_core.wire.METHODS``)."""
    operation: str
    """The kind of its operation events, or "" (``vz_core.wire.METHODS``)."""


def _methods() -> dict[str, MethodSpec]:
    """The rows of the one method table (``vz_core.wire.METHODS``) with the stubs' message classes; the table
    must be the descriptor's (it is generated from it: a stale one fails here, naming what differs)."""
    from vz_core.wire import METHODS as TABLE

    out: dict[str, MethodSpec] = {}
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for rpc in service.methods:
            name = f"{service.name}.{rpc.name}"
            row = TABLE.get(name)
            if row is None or (row.client_streaming, row.server_streaming) != (
                rpc.client_streaming,
                rpc.server_streaming,
            ):
                raise RuntimeError(f"vz_core/wire/_methods.py is stale for {name}: run scripts/gen_protos.py")
            out[name] = MethodSpec(
                name=name,
                path=row.path,
                request=getattr(api_pb2, rpc.input_type.name),
                response=getattr(api_pb2, rpc.output_type.name),
                client_streaming=rpc.client_streaming,
                server_streaming=rpc.server_streaming,
                passive=row.passive,
                operation=row.operation,
            )
    if set(out) != set(TABLE):
        raise RuntimeError(f"vz_core/wire/_methods.py lists {sorted(set(TABLE) - set(out))}: run scripts/gen_protos.py")
    return out


METHODS: Mapping[str, MethodSpec] = _methods()
"""Every rpc by its local-wire name."""


def method(name: str) -> MethodSpec:
    """The rpc named ``name``; a ValueError naming the known ones otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown vz.api.v1 method {name!r}; methods: {', '.join(sorted(METHODS))}") from None


# --- errors ------------------------------------------------------------------------------------------------


def grpc_code_name(code: str) -> str:
    """The gRPC status code name of an error code name (docs/protocol.md's table; UNKNOWN for anything else)."""
    from vz_core.errors import CATEGORY_TABLE

    for cls in CATEGORY_TABLE:
        if cls.category.name == code:
            return cls.category.grpc_code_name
    return "UNKNOWN"


def _runtime_error_of(error: Mapping[str, Any]) -> runtime_pb2.RuntimeError:
    details = error.get("details")
    if isinstance(details, Mapping):
        return from_wire(details, runtime_pb2.RuntimeError)
    name = f"RUNTIME_ERROR_CODE_{error.get('code', 'UNKNOWN')}"
    known = name in runtime_pb2.RuntimeErrorCode.keys()
    code = runtime_pb2.RuntimeErrorCode.Value(name) if known else runtime_pb2.RUNTIME_ERROR_CODE_UNKNOWN
    message = runtime_pb2.RuntimeError(message=str(error.get("message", "")))
    message.code = code  # type: ignore[assignment]  # an enum number: the stubs only name the enum type
    return message


def error_to_status(error: Mapping[str, Any]) -> tuple[int, str, bytes]:
    """(gRPC status code number, message, ``grpc-status-details-bin`` value) of a local-wire error object E.

    The details hold one ``devsy.runtime.v1.RuntimeError`` (the driver's own, or one built from E's code) and
    one ``vz.api.v1.ErrorInfo`` (E itself). A malformed E raises ParseError (a daemon bug).
    """
    import grpc
    from google.protobuf import any_pb2
    from google.rpc import status_pb2

    info = from_wire(error, api_pb2.ErrorInfo)
    code: grpc.StatusCode = getattr(grpc.StatusCode, grpc_code_name(info.code))
    runtime = any_pb2.Any()
    runtime.Pack(_runtime_error_of(error))
    packed = any_pb2.Any()
    packed.Pack(info)
    status = status_pb2.Status(code=code.value[0], message=info.message, details=[runtime, packed])
    return code.value[0], info.message, status.SerializeToString()


def error_from_status_details(raw: bytes | None, code_name: str, message: str) -> dict[str, Any]:
    """The local-wire error object E carried by a failed gRPC call (its ``grpc-status-details-bin``).

    Without an ErrorInfo detail (a status from the transport itself, or from a server that is not vz), E is
    built from the status: its RuntimeError detail if any, else the gRPC code.
    """
    from google.rpc import status_pb2

    runtime: runtime_pb2.RuntimeError | None = None
    if raw:
        status = status_pb2.Status.FromString(raw)
        for detail in status.details:
            if detail.type_url == API_ERROR_TYPE_URL:
                info = api_pb2.ErrorInfo()
                detail.Unpack(info)
                return to_wire(info)
            if detail.type_url == RUNTIME_ERROR_TYPE_URL:
                runtime = runtime_pb2.RuntimeError()
                detail.Unpack(runtime)
    import grpc

    from vz_core.errors import error_class_for_code, error_class_for_grpc
    from vz_core.wire import classify_core

    if runtime is not None:
        cls = error_class_for_code(runtime.code)
    else:
        cls = error_class_for_grpc(getattr(grpc.StatusCode, code_name, grpc.StatusCode.UNKNOWN))
    text = (runtime.message if runtime is not None and runtime.message else message) or (
        f"the vz daemon's gRPC call failed with {code_name}"
    )
    exit_code, kind = classify_core(cls(text))  # the one exit-code table (vz_core.wire)
    category = cls.category.name
    return {
        "code": category,
        "message": text,
        "kind": kind,
        "exit_code": exit_code,
        "details": None if runtime is None else to_wire(runtime),
    }
