"""The generated descriptors match the Runtime Protocol v1 table (PROTOCOL.md §1) field by field."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from vz_core._proto.devsy.runtime.v1 import runtime_pb2 as pb
from vz_core._proto.vz.machine.v1 import extensions_pb2 as ext_pb

S, B, U32, I32, U64, BYTES = F.TYPE_STRING, F.TYPE_BOOL, F.TYPE_UINT32, F.TYPE_INT32, F.TYPE_UINT64, F.TYPE_BYTES
MSG, ENUM = F.TYPE_MESSAGE, F.TYPE_ENUM
REP = "repeated"
OPT = "optional"  # proto3 explicit presence
ONE = "oneof"
PKG = "devsy.runtime.v1."

# message -> {field: (number, type, type name or None, label)}
MESSAGES: dict[str, dict[str, tuple[int, int, str | None, str]]] = {
    "InfoRequest": {"supports_recreate_on_run": (1, B, None, "")},
    "InfoResponse": {
        "api_major": (1, U32, None, ""),
        "api_minor": (2, U32, None, ""),
        "driver_name": (3, S, None, ""),
        "driver_version": (4, S, None, ""),
        "runtime_name": (5, S, None, ""),
        "runtime_version": (6, S, None, ""),
        "capabilities": (7, MSG, "Capabilities", ""),
    },
    "Capabilities": {
        "mount_types": (1, ENUM, "MountType", REP),
        "requires_mount_streaming": (2, B, None, ""),
        "requires_workspace_chown": (3, B, None, ""),
        "recreate_mode": (4, ENUM, "RecreateMode", ""),
        "provisioning_preflight": (5, B, None, ""),
        "reprovision": (6, B, None, ""),
        "logs": (7, B, None, ""),
        "reuse_preflight": (8, B, None, ""),
    },
    "PreflightRequest": {"disable_auto_start": (1, B, None, "")},
    "PreflightResponse": {},
    "ProvisioningPreflightRequest": {},
    "ProvisioningPreflightResponse": {},
    "ReusePreflightRequest": {"workspace_id": (1, S, None, ""), "remote_user": (2, S, None, "")},
    "ReusePreflightResponse": {},
    "FindRequest": {"workspace_id": (1, S, None, "")},
    "FindResponse": {"found": (1, B, None, ""), "container": (2, MSG, "ContainerDetails", "")},
    "ContainerDetails": {
        "id": (1, S, None, ""),
        "created_at": (2, S, None, ""),
        "state": (3, MSG, "ContainerState", ""),
        "config": (4, MSG, "ContainerConfig", ""),
        "mounts": (5, MSG, "ContainerMount", REP),
    },
    "ContainerState": {
        "status": (1, S, None, ""),
        "started_at": (2, S, None, ""),
        "exit_code": (3, I32, None, ""),
        "error": (4, S, None, ""),
    },
    "ContainerConfig": {
        "labels": (1, MSG, "ContainerConfig.LabelsEntry", REP),
        "working_dir": (2, S, None, ""),
        "user": (3, S, None, ""),
    },
    "ContainerMount": {"type": (1, S, None, ""), "source": (2, S, None, ""), "destination": (3, S, None, "")},
    "TargetArchitectureRequest": {"workspace_id": (1, S, None, "")},
    "TargetArchitectureResponse": {"architecture": (1, S, None, "")},
    "RunImageRequest": {
        "workspace_id": (1, S, None, ""),
        "image": (2, S, None, ""),
        "image_built_locally": (3, B, None, ""),
        "user": (4, S, None, ""),
        "entrypoint": (5, S, None, ""),
        "args": (6, S, None, REP),
        "environment": (7, MSG, "RunImageRequest.EnvironmentEntry", REP),
        "labels": (8, S, None, REP),
        "cap_add": (9, S, None, REP),
        "security_opt": (10, S, None, REP),
        "privileged": (11, B, None, OPT),
        "init": (12, B, None, OPT),
        "workspace_mount": (13, MSG, "Mount", ""),
        "mounts": (14, MSG, "Mount", REP),
        "userns": (15, S, None, ""),
        "uid_map": (16, S, None, REP),
        "gid_map": (17, S, None, REP),
        "platform": (18, S, None, ""),
        "host_requirements": (19, MSG, "HostRequirements", ""),
        "remote_user": (20, S, None, ""),
        "dockerless": (21, B, None, ""),
        "allow_recreate": (22, B, None, ""),
    },
    "RunImageResponse": {},
    "Mount": {
        "type": (1, ENUM, "MountType", ""),
        "source": (2, S, None, ""),
        "target": (3, S, None, ""),
        "read_only": (4, B, None, ""),
        "options": (5, S, None, REP),
    },
    "HostRequirements": {
        "cpus": (1, I32, None, ""),
        "memory_bytes": (2, U64, None, ""),
        "storage_bytes": (3, U64, None, ""),
        "gpu": (4, MSG, "GpuRequirement", ""),
    },
    "GpuRequirement": {"value": (1, ENUM, "GpuRequirementValue", "")},
    "StartRequest": {"workspace_id": (1, S, None, "")},
    "StartResponse": {},
    "StopRequest": {"workspace_id": (1, S, None, "")},
    "StopResponse": {},
    "DeleteRequest": {"workspace_id": (1, S, None, "")},
    "DeleteResponse": {},
    "ExecClientMessage": {
        "start": (1, MSG, "ExecStart", ONE),
        "stdin": (2, BYTES, None, ONE),
        "close_stdin": (3, MSG, "CloseStdin", ONE),
    },
    "ExecStart": {
        "workspace_id": (1, S, None, ""),
        "argv": (2, S, None, REP),
        "user": (3, S, None, ""),
        "workdir": (4, S, None, ""),
        "environment": (5, MSG, "ExecStart.EnvironmentEntry", REP),
        "tty": (6, B, None, ""),
    },
    "CloseStdin": {},
    "ExecServerMessage": {
        "stdout": (1, MSG, "OutputChunk", ONE),
        "stderr": (2, MSG, "OutputChunk", ONE),
        "exit": (3, MSG, "ExecExit", ONE),
    },
    "OutputChunk": {"data": (1, BYTES, None, "")},
    "ExecExit": {"exit_code": (1, I32, None, ""), "signal": (2, S, None, "")},
    "LogsRequest": {"workspace_id": (1, S, None, "")},
    "RuntimeError": {
        "code": (1, ENUM, "RuntimeErrorCode", ""),
        "message": (2, S, None, ""),
        "runtime_message": (3, S, None, ""),
        "retryable": (4, B, None, ""),
        "details": (5, MSG, "RuntimeError.DetailsEntry", REP),
    },
}

ENUMS: dict[str, dict[str, int]] = {
    "MountType": {
        "MOUNT_TYPE_UNSPECIFIED": 0,
        "MOUNT_TYPE_BIND": 1,
        "MOUNT_TYPE_VOLUME": 2,
        "MOUNT_TYPE_TMPFS": 3,
    },
    "RecreateMode": {
        "RECREATE_MODE_UNSPECIFIED": 0,
        "RECREATE_MODE_DELETE": 1,
        "RECREATE_MODE_STOP": 2,
        "RECREATE_MODE_ON_RUN": 3,
    },
    "GpuRequirementValue": {"GPU_UNSPECIFIED": 0, "GPU_FALSE": 1, "GPU_OPTIONAL": 2, "GPU_REQUIRED": 3},
    "RuntimeErrorCode": {
        f"RUNTIME_ERROR_CODE_{name}": i
        for i, name in enumerate(
            [
                "UNKNOWN",
                "NOT_FOUND",
                "ALREADY_EXISTS",
                "INVALID_ARGUMENT",
                "UNSUPPORTED",
                "UNAVAILABLE",
                "FAILED_PRECONDITION",
                "PERMISSION_DENIED",
                "TIMEOUT",
                "CANCELLED",
                "RUNTIME_FAILURE",
                "INCOMPATIBLE_VERSION",
            ]
        )
    },
}

RPCS = [
    ("Info", "InfoRequest", "InfoResponse", False, False),
    ("Preflight", "PreflightRequest", "PreflightResponse", False, False),
    ("ProvisioningPreflight", "ProvisioningPreflightRequest", "ProvisioningPreflightResponse", False, False),
    ("ReusePreflight", "ReusePreflightRequest", "ReusePreflightResponse", False, False),
    ("Find", "FindRequest", "FindResponse", False, False),
    ("TargetArchitecture", "TargetArchitectureRequest", "TargetArchitectureResponse", False, False),
    ("RunImage", "RunImageRequest", "RunImageResponse", False, False),
    ("Start", "StartRequest", "StartResponse", False, False),
    ("Stop", "StopRequest", "StopResponse", False, False),
    ("Delete", "DeleteRequest", "DeleteResponse", False, False),
    ("Exec", "ExecClientMessage", "ExecServerMessage", True, True),
    ("Logs", "LogsRequest", "OutputChunk", False, True),
]


def _label(field: F) -> str:
    if field.is_repeated:
        return REP
    if field.containing_oneof is not None:
        return OPT if field.containing_oneof.name.startswith("_") else ONE
    return ""


def test_package_and_file() -> None:
    assert pb.DESCRIPTOR.package == "devsy.runtime.v1"
    assert pb.DESCRIPTOR.name == "devsy/runtime/v1/runtime.proto"


def test_every_message_of_the_table_exists_and_nothing_else() -> None:
    ours = set(pb.DESCRIPTOR.message_types_by_name)
    assert ours == set(MESSAGES)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_message_fields(name: str) -> None:
    desc = pb.DESCRIPTOR.message_types_by_name[name]
    assert desc.full_name == PKG + name
    actual = {}
    for field in desc.fields:
        type_name = None
        if field.message_type is not None:
            type_name = field.message_type.full_name.removeprefix(PKG)
        elif field.enum_type is not None:
            type_name = field.enum_type.full_name.removeprefix(PKG)
        actual[field.name] = (field.number, field.type, type_name, _label(field))
    assert actual == MESSAGES[name]


def test_map_fields_are_string_to_string() -> None:
    for owner, field in [
        ("ContainerConfig", "labels"),
        ("RunImageRequest", "environment"),
        ("ExecStart", "environment"),
        ("RuntimeError", "details"),
    ]:
        entry = pb.DESCRIPTOR.message_types_by_name[owner].fields_by_name[field].message_type
        assert entry.GetOptions().map_entry
        assert [(f.name, f.number, f.type) for f in entry.fields] == [("key", 1, S), ("value", 2, S)]


def test_explicit_presence_on_privileged_and_init() -> None:
    msg = pb.RunImageRequest()
    assert not msg.HasField("privileged") and not msg.HasField("init")
    msg.privileged = False
    assert msg.HasField("privileged")


@pytest.mark.parametrize("name", sorted(ENUMS))
def test_enum_values(name: str) -> None:
    desc = pb.DESCRIPTOR.enum_types_by_name[name]
    assert desc.full_name == PKG + name
    assert {v.name: v.number for v in desc.values} == ENUMS[name]


def test_no_other_enums() -> None:
    assert set(pb.DESCRIPTOR.enum_types_by_name) == set(ENUMS)


def test_service_methods_in_declaration_order() -> None:
    service = pb.DESCRIPTOR.services_by_name["RuntimeDriver"]
    assert service.full_name == "devsy.runtime.v1.RuntimeDriver"
    actual = [
        (m.name, m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming) for m in service.methods
    ]
    assert actual == RPCS


def test_extension_service_lives_in_its_own_package() -> None:
    assert ext_pb.DESCRIPTOR.package == "vz.machine.v1"
    service = ext_pb.DESCRIPTOR.services_by_name["MachineExtensions"]
    assert [m.name for m in service.methods] == [
        "Extensions",
        "ExecPty",
        "DeleteVolume",
        "SetServices",
        "ServiceStates",
        "ServiceLogs",
    ]
    assert not any(d.startswith("devsy") for d in ext_pb.DESCRIPTOR.dependencies)


def _fields(name: str) -> dict[str, tuple[int, int]]:
    return {f.name: (f.number, f.type) for f in ext_pb.DESCRIPTOR.message_types_by_name[name].fields}


def test_terminal_session_messages() -> None:
    """ExecPty's frames and the capability that says it is served (ExtensionsResponse.terminal = 12)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    service = ext_pb.DESCRIPTOR.services_by_name["MachineExtensions"]
    pty = service.methods_by_name["ExecPty"]
    assert (pty.input_type.name, pty.output_type.name, pty.client_streaming, pty.server_streaming) == (
        "PtyClientMessage",
        "PtyServerMessage",
        True,
        True,
    )
    assert _fields("ExtensionsResponse")["terminal"] == (12, F.TYPE_BOOL)
    assert _fields("ExtensionsResponse")["tty"] == (4, F.TYPE_BOOL)
    assert _fields("PtyStart") == {
        "workspace_id": (1, F.TYPE_STRING),
        "argv": (2, F.TYPE_STRING),
        "user": (3, F.TYPE_STRING),
        "workdir": (4, F.TYPE_STRING),
        "environment": (5, F.TYPE_MESSAGE),
        "rows": (6, F.TYPE_UINT32),
        "cols": (7, F.TYPE_UINT32),
        "term": (8, F.TYPE_STRING),
    }
    assert _fields("PtyResize") == {"rows": (1, F.TYPE_UINT32), "cols": (2, F.TYPE_UINT32)}
    assert _fields("PtyClientMessage") == {
        "start": (1, F.TYPE_MESSAGE),
        "stdin": (2, F.TYPE_BYTES),
        "resize": (3, F.TYPE_MESSAGE),
        "close_stdin": (4, F.TYPE_MESSAGE),
    }
    assert _fields("PtyServerMessage") == {"output": (1, F.TYPE_BYTES), "exit": (2, F.TYPE_MESSAGE)}
    assert _fields("PtyExit") == {"exit_code": (1, F.TYPE_INT32), "signal": (2, F.TYPE_STRING)}
    oneofs = {
        m: [o.name for o in ext_pb.DESCRIPTOR.message_types_by_name[m].oneofs]
        for m in ("PtyClientMessage", "PtyServerMessage")
    }
    assert oneofs == {"PtyClientMessage": ["payload"], "PtyServerMessage": ["payload"]}


def test_local_exec_socket_is_field_13_of_extensions_response() -> None:
    """The plugin's local exec socket (docs/protocol.md, "Local exec"): a string hosts that do not know it skip."""
    from google.protobuf.descriptor import FieldDescriptor as F

    assert _fields("ExtensionsResponse")["local_exec_socket"] == (13, F.TYPE_STRING)
    assert _fields("ExtensionsResponse")["volume_removal"] == (14, F.TYPE_BOOL)
    assert _fields("ExtensionsResponse")["pids_limits"] == (15, F.TYPE_BOOL)
    assert _fields("ExtensionsResponse")["services"] == (16, F.TYPE_BOOL)
    assert _fields("ServiceSpec")["restart"] == (6, F.TYPE_STRING)
    assert _fields("ServiceSpec")["health"] == (8, F.TYPE_MESSAGE)
    assert _fields("ServiceState")["last_exit_code"] == (7, F.TYPE_INT32)
    assert _fields("ServiceLogsResponse")["data"] == (1, F.TYPE_BYTES)
    assert max(number for number, _ in _fields("ExtensionsResponse").values()) == 16
