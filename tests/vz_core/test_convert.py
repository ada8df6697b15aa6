"""Plain values survive the trip through protobuf unchanged, including unknown enum values."""

from __future__ import annotations

from vz_core import (
    Capabilities,
    DriverInfo,
    EgressPolicy,
    ExecExit,
    ExecOutput,
    ExecSpec,
    Extensions,
    GpuRequirement,
    HostRequirements,
    MachineConfig,
    MachineDetails,
    MachineMount,
    MachineState,
    Mount,
    MountType,
    RecreateMode,
    RunImageRequest,
)
from vz_core.rpc import _convert as c
from vz_core.rpc.pb import runtime_pb2 as pb


def test_run_image_round_trip_keeps_every_field() -> None:
    req = RunImageRequest(
        workspace_id="a/../b c ü",
        image="vz:default",
        image_built_locally=True,
        user="dev",
        entrypoint="/bin/sh",
        args=("-c", "echo hi"),
        environment={"TOKEN": "s3cret"},
        labels=("a=b=c", "plain"),
        cap_add=("NET_ADMIN",),
        security_opt=("no-new-privileges",),
        privileged=False,
        init=True,
        workspace_mount=Mount(MountType.BIND, "/src", "/workspace", read_only=True, options=("z",)),
        mounts=(Mount(MountType.VOLUME, "cache", "/cache"), Mount(MountType.TMPFS, "", "/tmp")),
        userns="host",
        uid_map=("0:1000:1",),
        gid_map=("0:1000:1",),
        platform="linux/amd64",
        host_requirements=HostRequirements(2, 1 << 30, 4 << 30, GpuRequirement.OPTIONAL),
        remote_user="dev",
        dockerless=True,
        allow_recreate=True,
    )
    wire = c.run_image_to_pb(req)
    back = c.run_image_from_pb(pb.RunImageRequest.FromString(wire.SerializeToString()))
    assert back == req
    assert req.label_map() == {"a": "b=c", "plain": ""}
    assert "s3cret" not in repr(req)


def test_unset_optionals_stay_unset() -> None:
    wire = c.run_image_to_pb(RunImageRequest("w", "img"))
    assert not wire.HasField("privileged") and not wire.HasField("init")
    back = c.run_image_from_pb(wire)
    assert back.privileged is None and back.init is None and back.host_requirements is None


def test_info_round_trip_and_missing_capabilities() -> None:
    info = DriverInfo(
        "d",
        "1.0",
        "r",
        "",
        Capabilities((MountType.BIND, MountType.TMPFS), recreate_mode=RecreateMode.ON_RUN, logs=True),
        api_minor=3,
    )
    assert c.info_from_pb(c.info_to_pb(info)) == info
    bare = c.info_from_pb(pb.InfoResponse(api_major=1, driver_name="x"))
    assert bare.capabilities is None


def test_unknown_enum_values_pass_through() -> None:
    caps = c.capabilities_from_pb(pb.Capabilities(mount_types=[1, 99], recreate_mode=7))  # type: ignore[list-item, arg-type]
    assert caps.mount_types == (MountType.BIND, 99)
    assert caps.recreate_mode == 7 and not isinstance(caps.recreate_mode, RecreateMode)
    assert list(c.capabilities_to_pb(caps).mount_types) == [1, 99]


def test_details_exec_and_extensions_round_trip() -> None:
    details = MachineDetails(
        "id1",
        "2026-01-01T00:00:00Z",
        MachineState("running", "2026-01-01T00:00:01Z"),
        MachineConfig({"k": "v"}, "/w", "dev"),
        (MachineMount("bind", "/src", "/workspace"),),
    )
    assert c.details_from_pb(c.details_to_pb(details)) == details
    spec = ExecSpec("w", ("printf", "%s", ""), "dev", "/tmp", {"A": "1"}, False)
    assert c.exec_spec_from_pb(c.exec_spec_to_pb(spec)) == spec
    for event in (ExecOutput("stdout", b"\x00\xff"), ExecOutput("stderr", b"e"), ExecExit(3, "SIGKILL")):
        assert c.exec_event_from_pb(c.exec_event_to_pb(event)) == event
    assert c.exec_event_from_pb(pb.ExecServerMessage()) is None
    ext = Extensions(1, ("linux",), ("developer",), True, "tcg", "why", False, (EgressPolicy.DENY,), {"a": "b"})
    assert c.extensions_from_pb(c.extensions_to_pb(ext)) == ext
