"""DriverError ↔ gRPC status, exactly once per boundary (PROTOCOL.md §5).

A server turns a ``DriverError`` into a status whose code comes from the category table and whose
``google.rpc.Status.details`` hold exactly one ``devsy.runtime.v1.RuntimeError`` (trailer
``grpc-status-details-bin``). A client turns any ``grpc.RpcError`` back into the matching ``DriverError``;
statuses without the detail (transport failures, foreign peers) are classified by gRPC code alone.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from vz_core._proto.devsy.runtime.v1 import runtime_pb2 as pb
from vz_core.errors import DriverError, error_class_for_code, error_class_for_grpc

__all__ = [
    "DETAILS_TRAILER",
    "RUNTIME_ERROR_TYPE_URL",
    "error_from_rpc",
    "error_to_runtime_error",
    "error_to_status",
    "runtime_errors_in",
]

DETAILS_TRAILER = "grpc-status-details-bin"
RUNTIME_ERROR_TYPE_URL = "type.googleapis.com/devsy.runtime.v1.RuntimeError"


def error_to_runtime_error(err: DriverError) -> pb.RuntimeError:
    return pb.RuntimeError(
        code=err.category.number,  # type: ignore[arg-type]
        message=err.message,
        runtime_message=err.runtime_message,
        retryable=err.retryable,
        details=dict(err.details),
    )


def error_to_status(err: DriverError) -> grpc.Status:
    """The status a server aborts with: category code + exactly one RuntimeError detail."""
    detail = any_pb2.Any()
    detail.Pack(error_to_runtime_error(err))
    status = status_pb2.Status(code=err.category.grpc_code.value[0], message=err.message, details=[detail])
    result: grpc.Status = rpc_status.to_status(status)
    return result


def runtime_errors_in(call: Any) -> list[pb.RuntimeError]:
    """Every RuntimeError detail carried by a failed call's trailing metadata (normally exactly one)."""
    raw: bytes | None = None
    for key, value in call.trailing_metadata() or ():
        if key == DETAILS_TRAILER:
            raw = value if isinstance(value, bytes) else value.encode()
    if raw is None:
        return []
    status = status_pb2.Status.FromString(raw)
    found: list[pb.RuntimeError] = []
    for detail in status.details:
        if detail.type_url == RUNTIME_ERROR_TYPE_URL:
            msg = pb.RuntimeError()
            detail.Unpack(msg)
            found.append(msg)
    return found


def error_from_rpc(err: grpc.RpcError, *, rpc: str = "") -> DriverError:
    """The DriverError a failed call stands for; ``rpc`` names the method for context."""
    code: grpc.StatusCode = err.code()
    text: str = err.details() or ""
    details = runtime_errors_in(err)
    if details:
        d = details[0]
        cls = error_class_for_code(d.code)
        extra = dict(d.details)
        if rpc:
            extra.setdefault("rpc", rpc)
        return cls(
            d.message or text or f"{rpc or 'call'} failed with {code.name}",
            runtime_message=d.runtime_message,
            details=extra,
            retryable=d.retryable,
        )
    cls = error_class_for_grpc(code)
    where = f"{rpc}: " if rpc else ""
    return cls(
        f"{where}{text or code.name.lower().replace('_', ' ')}",
        details={"grpc_code": code.name, **({"rpc": rpc} if rpc else {})},
    )
