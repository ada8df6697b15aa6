"""vz.api.v1's generated descriptors: services, rpc names and streaming shapes as PLAN'd, field numbers of the
messages clients depend on, the wire options, and a comment on every message and field of the .proto."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from vz_core._proto.vz.api.v1 import api_pb2
from vz_core.api import pb

ROOT = Path(__file__).resolve().parents[3]
PROTO = ROOT / "protocol" / "vz" / "api" / "v1" / "api.proto"

UNARY, SERVER, BIDI = "unary", "server-stream", "bidi"

# service -> rpc -> (shape, request, response)
SERVICES: dict[str, dict[str, tuple[str, str, str]]] = {
    "Environments": {
        "Up": (SERVER, "UpRequest", "UpResponse"),
        "Get": (UNARY, "GetEnvironmentRequest", "StatusReport"),
        "List": (UNARY, "ListEnvironmentsRequest", "StatusReport"),
        "Watch": (SERVER, "WatchRequest", "WatchResponse"),
        "Stop": (SERVER, "StopRequest", "StopResponse"),
        "Delete": (SERVER, "DeleteRequest", "DeleteResponse"),
    },
    "Machines": {
        "Get": (UNARY, "GetMachineRequest", "MachineStatus"),
        "List": (UNARY, "ListMachinesRequest", "MachineList"),
        "Watch": (SERVER, "WatchRequest", "WatchResponse"),
        "Exec": (BIDI, "ExecClientMessage", "ExecServerMessage"),
        "Logs": (SERVER, "LogsRequest", "LogsResponse"),
    },
    "Volumes": {
        "List": (UNARY, "ListVolumesRequest", "VolumeList"),
        "Remove": (UNARY, "RemoveVolumeRequest", "VolumeList"),
    },
    "System": {
        "Capabilities": (UNARY, "CapabilitiesRequest", "CapabilitiesResponse"),
        "Events": (SERVER, "EventsRequest", "EventsResponse"),
        "Status": (UNARY, "StatusRequest", "DaemonStatus"),
        "Shutdown": (UNARY, "ShutdownRequest", "ShutdownResponse"),
    },
    "Drivers": {"Connect": (SERVER, "ConnectRequest", "ConnectResponse")},
}

S, B, I32, I64, D, BYTES, MSG = (
    F.TYPE_STRING,
    F.TYPE_BOOL,
    F.TYPE_INT32,
    F.TYPE_INT64,
    F.TYPE_DOUBLE,
    F.TYPE_BYTES,
    F.TYPE_MESSAGE,
)

# message -> {field: (number, type, message type or None)}
FIELDS: dict[str, dict[str, tuple[int, int, str | None]]] = {
    "Context": {
        "cwd": (1, S, None),
        "environ": (2, MSG, "vz.api.v1.Context.EnvironEntry"),
        "definition_file": (3, S, None),
    },
    "Event": {
        "revision": (1, I64, None),
        "time": (2, S, None),
        "kind": (3, S, None),
        "environment_id": (4, S, None),
        "machine_id": (5, S, None),
        "data": (6, MSG, "google.protobuf.Struct"),
        "environment_updated": (7, MSG, "vz.api.v1.EnvironmentUpdated"),
        "machine_state": (8, MSG, "vz.api.v1.MachineStateChanged"),
        "operation_started": (9, MSG, "vz.api.v1.OperationStarted"),
        "operation_finished": (10, MSG, "vz.api.v1.OperationFinished"),
    },
    "OperationFinished": {
        "method": (1, S, None),
        "call": (2, I64, None),
        "status": (3, S, None),
        "operation_id": (4, S, None),
        "error": (5, MSG, "vz.api.v1.ErrorInfo"),
        "seconds": (6, F.TYPE_DOUBLE, None),
        "started_revision": (7, I64, None),
    },
    "ErrorInfo": {
        "code": (1, S, None),
        "message": (2, S, None),
        "kind": (3, S, None),
        "exit_code": (4, I32, None),
        "details": (5, MSG, "devsy.runtime.v1.RuntimeError"),
    },
    "UpResponse": {"progress": (1, MSG, "vz.api.v1.Progress"), "result": (2, MSG, "vz.api.v1.UpResult")},
    "StopResponse": {"progress": (1, MSG, "vz.api.v1.Progress"), "result": (2, MSG, "vz.api.v1.StopResult")},
    "DeleteResponse": {"progress": (1, MSG, "vz.api.v1.Progress"), "result": (2, MSG, "vz.api.v1.DeleteResult")},
    "WatchRequest": {"from_revision": (1, I64, None), "environment": (2, S, None)},
    "WatchResponse": {"event": (1, MSG, "vz.api.v1.Event"), "result": (2, MSG, "vz.api.v1.EventsResult")},
    "EventsRequest": {"from_revision": (1, I64, None), "follow": (2, B, None)},
    "EventsResponse": {"event": (1, MSG, "vz.api.v1.Event"), "result": (2, MSG, "vz.api.v1.EventsResult")},
    "ExecClientMessage": {
        "start": (1, MSG, "vz.api.v1.ExecRequest"),
        "input": (2, MSG, "vz.api.v1.Chunk"),
        "stdin_close": (3, MSG, "vz.api.v1.Empty"),
        "resize": (4, MSG, "vz.api.v1.Resize"),
        "signal": (5, MSG, "vz.api.v1.Signal"),
        "cancel": (6, MSG, "vz.api.v1.Empty"),
    },
    "ExecServerMessage": {"output": (1, MSG, "vz.api.v1.Chunk"), "result": (2, MSG, "vz.api.v1.ExecResult")},
    "ExecResult": {"exit_code": (1, I32, None), "signal": (2, S, None)},
    "Chunk": {"stream": (1, I32, None), "data": (2, BYTES, None)},
    "LogsResponse": {"output": (1, MSG, "vz.api.v1.Chunk"), "result": (2, MSG, "vz.api.v1.Empty")},
    "DaemonStatus": {
        "pid": (1, I32, None),
        "version": (2, S, None),
        "fingerprint": (3, S, None),
        "started": (4, S, None),
        "uptime_seconds": (5, D, None),
        "busy": (6, B, None),
        "plugins": (7, MSG, "vz.api.v1.PluginStatus"),
        "operations": (8, MSG, "vz.api.v1.OperationInFlight"),
        "socket": (9, S, None),
        "home": (10, S, None),
        "connections": (11, I32, None),
        "idle_timeout": (12, D, None),
    },
    "ServiceStatus": {
        "name": (1, S, None),
        "state": (2, S, None),
        "health": (3, S, None),
        "pid": (4, I64, None),
        "restarts": (5, I64, None),
        "last_exit_code": (6, I64, None),
        "last_signal": (7, S, None),
        "last_error": (8, S, None),
        "started_at": (9, S, None),
    },
    "Driver": {
        "name": (1, S, None),
        "driver_name": (2, S, None),
        "version": (3, S, None),
        "api": (4, S, None),
        "runtime": (5, MSG, "vz.api.v1.RuntimeInfo"),
        "capabilities": (6, MSG, "vz.api.v1.DriverCapabilities"),
        "extensions": (7, MSG, "vz.api.v1.DriverExtensions"),
        "accelerator": (8, MSG, "vz.api.v1.Accelerator"),
        "matrix": (9, MSG, "vz.api.v1.MatrixRow"),
        "error": (10, S, None),
        "provenance": (11, MSG, "vz.api.v1.DriverProvenance"),
    },
    "PluginStatus": {
        "name": (1, S, None),
        "origin": (2, S, None),
        "options": (3, MSG, "google.protobuf.Value"),
        "pid": (4, I32, None),
        "state": (5, S, None),
        "in_flight": (6, I32, None),
        "last_use": (7, MSG, "google.protobuf.Value"),
        "launches": (8, I32, None),
        "launch_failures": (9, I32, None),
        "crashes": (10, I32, None),
        "last_crash": (11, MSG, "google.protobuf.Value"),
        "last_launch_ms": (12, MSG, "google.protobuf.Value"),
        "script": (13, S, None),
        "sha256": (14, S, None),
        "error": (15, S, None),
        "provenance": (16, MSG, "vz.api.v1.DriverProvenance"),
    },
    "DriverProvenance": {
        "origin": (1, S, None),
        "source": (2, S, None),
        "version": (3, S, None),
        "added_at": (4, S, None),
        "signed": (5, B, None),
        "key_id": (6, S, None),
        "key_name": (7, S, None),
        "endorsed_by": (8, S, None),
    },
}


def test_package_and_go_package() -> None:
    assert api_pb2.DESCRIPTOR.package == "vz.api.v1"
    assert api_pb2.DESCRIPTOR.GetOptions().go_package == "vz.dev/protocol/vz/api/v1;apiv1"


def test_services_rpcs_and_streaming_shapes_are_exactly_the_plan() -> None:
    found: dict[str, dict[str, tuple[str, str, str]]] = {}
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        rows = found.setdefault(service.name, {})
        for rpc in service.methods:
            shape = BIDI if rpc.client_streaming and rpc.server_streaming else SERVER if rpc.server_streaming else UNARY
            assert not (rpc.client_streaming and not rpc.server_streaming), rpc.full_name
            rows[rpc.name] = (shape, rpc.input_type.name, rpc.output_type.name)
    assert found == SERVICES


def test_method_table_names_every_rpc_by_its_local_wire_name() -> None:
    names = {f"{service}.{rpc}" for service, rpcs in SERVICES.items() for rpc in rpcs}
    assert set(pb.METHODS) == names
    up = pb.method("Environments.Up")
    assert up.path == "/vz.api.v1.Environments/Up" and up.server_streaming and not up.client_streaming
    assert up.request is api_pb2.UpRequest and up.response is api_pb2.UpResponse
    with pytest.raises(ValueError, match=re.escape("unknown vz.api.v1 method 'Environments.Nope'")):
        pb.method("Environments.Nope")


@pytest.mark.parametrize("message", sorted(FIELDS))
def test_field_numbers_and_types(message: str) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    found = {
        f.name: (f.number, f.type, f.message_type.full_name if f.message_type is not None else None)
        for f in descriptor.fields
    }
    assert found == FIELDS[message]


@pytest.mark.parametrize(
    "message",
    [
        "UpResponse",
        "StopResponse",
        "DeleteResponse",
        "ExecClientMessage",
        "ExecServerMessage",
        "LogsResponse",
        "EventsResponse",
        "WatchResponse",
    ],
)
def test_stream_messages_are_one_oneof(message: str) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert [o.name for o in descriptor.oneofs] == ["message"]
    assert {f.name for f in descriptor.oneofs[0].fields} == {f.name for f in descriptor.fields}


def test_machine_status_carries_its_services_as_field_17() -> None:
    field = api_pb2.DESCRIPTOR.message_types_by_name["MachineStatus"].fields_by_name["services"]
    assert field.message_type is not None
    assert (field.number, field.is_repeated, field.message_type.full_name) == (17, True, "vz.api.v1.ServiceStatus")


def test_wire_options() -> None:
    def opt(message: str, field: str, ext: object) -> bool:
        options: object = api_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].GetOptions()
        return bool(options.Extensions[ext])  # type: ignore[attr-defined]

    assert opt("Event", "environment_id", api_pb2.nullable) and opt("ExecResult", "signal", api_pb2.nullable)
    assert not opt("Progress", "seconds", api_pb2.nullable)  # absent until a step finished
    assert opt("Change", "keys", api_pb2.omit_empty) and not opt("UpResult", "plan_lines", api_pb2.omit_empty)


def test_every_message_field_and_rpc_is_documented() -> None:
    lines = PROTO.read_text().splitlines()
    undocumented = []
    field = r"(optional |repeated )?[\w.<>, ]+ \w+ = \d+( \[.*\])?;"
    declaration = re.compile(rf"^\s*(message \w+|service \w+|rpc \w+|{field}|oneof \w+|enum \w+)")
    for index, line in enumerate(lines):
        if declaration.match(line) and not line.strip().startswith("//"):
            previous = lines[index - 1].strip()
            inside_oneof = line.strip().startswith("oneof")
            if not previous.startswith("//") and not inside_oneof and not line.strip().endswith("{}"):
                undocumented.append(f"{index + 1}: {line.strip()}")
    # Request messages without fields ("message X {}") are documented by the line above too.
    assert not undocumented, "\n".join(undocumented)


def test_the_generator_refuses_a_proto_it_does_not_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_protos_under_test", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.protos() == gen.PROTOS_LISTED  # the real tree: every .proto is generated and checked
    fake_root = tmp_path / "protocol"
    for name in gen.PROTOS_LISTED:
        (fake_root / name).parent.mkdir(parents=True, exist_ok=True)
        (fake_root / name).write_text("")
    (fake_root / "vz" / "new" / "v1").mkdir(parents=True)
    (fake_root / "vz" / "new" / "v1" / "new.proto").write_text("")
    monkeypatch.setattr(gen, "PROTO_ROOT", fake_root)
    with pytest.raises(SystemExit, match=re.escape("not listed: vz/new/v1/new.proto")):
        gen.protos()


def test_the_method_table_is_the_descriptors_with_its_flags() -> None:
    """vz_core.wire.METHODS (generated) is every rpc with its shape and (vz.api.v1.method) options."""
    from vz_core.wire import METHODS

    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for rpc in service.methods:
            row = METHODS[f"{service.name}.{rpc.name}"]
            info: Any = rpc.GetOptions().Extensions[api_pb2.method]  # type: ignore[index]  # untyped in the stubs
            assert (row.client_streaming, row.server_streaming) == (rpc.client_streaming, rpc.server_streaming)
            assert (row.operation, row.passive) == (info.operation, info.passive)
            assert row.path == f"/{service.full_name}/{rpc.name}"
    operations = {name: row.operation for name, row in METHODS.items() if row.operation}
    assert operations == {
        "Environments.Up": "up",
        "Environments.Stop": "stop",
        "Environments.Delete": "delete",
        "Volumes.Remove": "volume",
    }
    assert {name for name, row in METHODS.items() if row.passive} == {
        "Environments.Watch",
        "Machines.Watch",
        "System.Events",
        "System.Status",
        "System.Capabilities",
        "System.Shutdown",
    }
