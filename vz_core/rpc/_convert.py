"""The one place that translates between the plain contract values and protobuf messages.

Both directions are faithful: nothing is validated or repaired here (the host validates Info in
``vz_core.negotiate``; the conformance suite judges frames). Enum values the plain side does not know are
carried as plain ints so a peer's unknown value reaches whoever must refuse it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from vz_core._proto.devsy.runtime.v1 import runtime_pb2 as pb
from vz_core._proto.vz.machine.v1 import extensions_pb2 as ext_pb
from vz_core._types import (
    TERMINAL_COLS,
    TERMINAL_ROWS,
    TERMINAL_TERM,
    Capabilities,
    DriverInfo,
    EgressPolicy,
    ExecEvent,
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
    TerminalData,
    TerminalEof,
    TerminalEvent,
    TerminalInput,
    TerminalOutput,
    TerminalResize,
    TerminalSpec,
)

__all__ = [
    "capabilities_from_pb",
    "capabilities_to_pb",
    "details_from_pb",
    "details_to_pb",
    "exec_event_from_pb",
    "exec_event_to_pb",
    "exec_spec_from_pb",
    "exec_spec_to_pb",
    "extensions_from_pb",
    "extensions_to_pb",
    "info_from_pb",
    "info_to_pb",
    "mount_from_pb",
    "mount_to_pb",
    "run_image_from_pb",
    "run_image_to_pb",
    "terminal_event_from_pb",
    "terminal_event_to_pb",
    "terminal_input_from_pb",
    "terminal_input_to_pb",
    "terminal_spec_from_pb",
    "terminal_spec_to_pb",
]


class _Malformed:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MALFORMED"


MALFORMED: Any = _Malformed()
"""Stands for a message that did not decode (a server refuses it with INVALID_ARGUMENT)."""


def _wire_enum(value: int) -> Any:
    # Unknown values pass through as ints: a fault-injecting or newer peer must be seen as it is.
    return int(value)


E = TypeVar("E", MountType, RecreateMode, GpuRequirement, EgressPolicy)


def _enum(cls: type[E], value: int) -> E | int:
    try:
        return cls(value)
    except ValueError:
        return value


def capabilities_to_pb(caps: Capabilities) -> pb.Capabilities:
    return pb.Capabilities(
        mount_types=[_wire_enum(t) for t in caps.mount_types],
        requires_mount_streaming=caps.requires_mount_streaming,
        requires_workspace_chown=caps.requires_workspace_chown,
        recreate_mode=_wire_enum(caps.recreate_mode),
        provisioning_preflight=caps.provisioning_preflight,
        reprovision=caps.reprovision,
        logs=caps.logs,
        reuse_preflight=caps.reuse_preflight,
    )


def capabilities_from_pb(msg: pb.Capabilities) -> Capabilities:
    return Capabilities(
        mount_types=tuple(_enum(MountType, v) for v in msg.mount_types),  # type: ignore[misc]
        requires_mount_streaming=msg.requires_mount_streaming,
        requires_workspace_chown=msg.requires_workspace_chown,
        recreate_mode=_enum(RecreateMode, msg.recreate_mode),  # type: ignore[arg-type]
        provisioning_preflight=msg.provisioning_preflight,
        reprovision=msg.reprovision,
        logs=msg.logs,
        reuse_preflight=msg.reuse_preflight,
    )


def info_to_pb(info: DriverInfo) -> pb.InfoResponse:
    msg = pb.InfoResponse(
        api_major=info.api_major,
        api_minor=info.api_minor,
        driver_name=info.driver_name,
        driver_version=info.driver_version,
        runtime_name=info.runtime_name,
        runtime_version=info.runtime_version,
    )
    if info.capabilities is not None:
        msg.capabilities.CopyFrom(capabilities_to_pb(info.capabilities))
    return msg


def info_from_pb(msg: pb.InfoResponse) -> DriverInfo:
    return DriverInfo(
        api_major=msg.api_major,
        api_minor=msg.api_minor,
        driver_name=msg.driver_name,
        driver_version=msg.driver_version,
        runtime_name=msg.runtime_name,
        runtime_version=msg.runtime_version,
        capabilities=capabilities_from_pb(msg.capabilities) if msg.HasField("capabilities") else None,
    )


def mount_to_pb(mount: Mount) -> pb.Mount:
    return pb.Mount(
        type=_wire_enum(mount.type),
        source=mount.source,
        target=mount.target,
        read_only=mount.read_only,
        options=list(mount.options),
    )


def mount_from_pb(msg: pb.Mount) -> Mount:
    return Mount(
        type=_enum(MountType, msg.type),  # type: ignore[arg-type]
        source=msg.source,
        target=msg.target,
        read_only=msg.read_only,
        options=tuple(msg.options),
    )


def run_image_to_pb(req: RunImageRequest) -> pb.RunImageRequest:
    msg = pb.RunImageRequest(
        workspace_id=req.workspace_id,
        image=req.image,
        image_built_locally=req.image_built_locally,
        user=req.user,
        entrypoint=req.entrypoint,
        args=list(req.args),
        environment=dict(req.environment),
        labels=list(req.labels),
        cap_add=list(req.cap_add),
        security_opt=list(req.security_opt),
        mounts=[mount_to_pb(m) for m in req.mounts],
        userns=req.userns,
        uid_map=list(req.uid_map),
        gid_map=list(req.gid_map),
        platform=req.platform,
        remote_user=req.remote_user,
        dockerless=req.dockerless,
        allow_recreate=req.allow_recreate,
    )
    if req.privileged is not None:
        msg.privileged = req.privileged
    if req.init is not None:
        msg.init = req.init
    if req.workspace_mount is not None:
        msg.workspace_mount.CopyFrom(mount_to_pb(req.workspace_mount))
    if req.host_requirements is not None:
        hr = req.host_requirements
        msg.host_requirements.CopyFrom(
            pb.HostRequirements(
                cpus=hr.cpus,
                memory_bytes=hr.memory_bytes,
                storage_bytes=hr.storage_bytes,
                gpu=pb.GpuRequirement(value=_wire_enum(hr.gpu)),
            )
        )
    return msg


def run_image_from_pb(msg: pb.RunImageRequest) -> RunImageRequest:
    hr = None
    if msg.HasField("host_requirements"):
        h = msg.host_requirements
        hr = HostRequirements(
            cpus=h.cpus,
            memory_bytes=h.memory_bytes,
            storage_bytes=h.storage_bytes,
            gpu=_enum(GpuRequirement, h.gpu.value),  # type: ignore[arg-type]
        )
    return RunImageRequest(
        workspace_id=msg.workspace_id,
        image=msg.image,
        image_built_locally=msg.image_built_locally,
        user=msg.user,
        entrypoint=msg.entrypoint,
        args=tuple(msg.args),
        environment=dict(msg.environment),
        labels=tuple(msg.labels),
        cap_add=tuple(msg.cap_add),
        security_opt=tuple(msg.security_opt),
        privileged=msg.privileged if msg.HasField("privileged") else None,
        init=msg.init if msg.HasField("init") else None,
        workspace_mount=mount_from_pb(msg.workspace_mount) if msg.HasField("workspace_mount") else None,
        mounts=tuple(mount_from_pb(m) for m in msg.mounts),
        userns=msg.userns,
        uid_map=tuple(msg.uid_map),
        gid_map=tuple(msg.gid_map),
        platform=msg.platform,
        host_requirements=hr,
        remote_user=msg.remote_user,
        dockerless=msg.dockerless,
        allow_recreate=msg.allow_recreate,
    )


def details_to_pb(details: MachineDetails) -> pb.ContainerDetails:
    return pb.ContainerDetails(
        id=details.id,
        created_at=details.created_at,
        state=pb.ContainerState(
            status=details.state.status,
            started_at=details.state.started_at,
            exit_code=details.state.exit_code,
            error=details.state.error,
        ),
        config=pb.ContainerConfig(
            labels=dict(details.config.labels),
            working_dir=details.config.working_dir,
            user=details.config.user,
        ),
        mounts=[pb.ContainerMount(type=m.type, source=m.source, destination=m.destination) for m in details.mounts],
    )


def details_from_pb(msg: pb.ContainerDetails) -> MachineDetails:
    return MachineDetails(
        id=msg.id,
        created_at=msg.created_at,
        state=MachineState(
            status=msg.state.status,  # type: ignore[arg-type]
            started_at=msg.state.started_at,
            exit_code=msg.state.exit_code,
            error=msg.state.error,
        ),
        config=MachineConfig(
            labels=dict(msg.config.labels),
            working_dir=msg.config.working_dir,
            user=msg.config.user,
        ),
        mounts=tuple(MachineMount(type=m.type, source=m.source, destination=m.destination) for m in msg.mounts),
    )


def exec_spec_to_pb(spec: ExecSpec) -> pb.ExecStart:
    return pb.ExecStart(
        workspace_id=spec.workspace_id,
        argv=list(spec.argv),
        user=spec.user,
        workdir=spec.workdir,
        environment=dict(spec.environment),
        tty=spec.tty,
    )


def exec_spec_from_pb(msg: pb.ExecStart) -> ExecSpec:
    return ExecSpec(
        workspace_id=msg.workspace_id,
        argv=tuple(msg.argv),
        user=msg.user,
        workdir=msg.workdir,
        environment=dict(msg.environment),
        tty=msg.tty,
    )


def exec_event_to_pb(event: ExecEvent) -> pb.ExecServerMessage:
    if isinstance(event, ExecExit):
        return pb.ExecServerMessage(exit=pb.ExecExit(exit_code=event.exit_code, signal=event.signal))
    chunk = pb.OutputChunk(data=event.data)
    if event.stream == "stderr":
        return pb.ExecServerMessage(stderr=chunk)
    return pb.ExecServerMessage(stdout=chunk)


def exec_event_from_pb(msg: pb.ExecServerMessage) -> ExecEvent | None:
    """The event a frame carries; ``None`` for a frame with no payload set (a protocol violation)."""
    which = msg.WhichOneof("payload")
    if which == "stdout":
        return ExecOutput("stdout", msg.stdout.data)
    if which == "stderr":
        return ExecOutput("stderr", msg.stderr.data)
    if which == "exit":
        return ExecExit(msg.exit.exit_code, msg.exit.signal)
    return None


def extensions_to_pb(ext: Extensions) -> ext_pb.ExtensionsResponse:
    return ext_pb.ExtensionsResponse(
        extensions_version=ext.extensions_version,
        target_os=list(ext.target_os),
        profiles=list(ext.profiles),
        tty=ext.tty,
        accelerator=ext.accelerator,
        accelerator_reason=ext.accelerator_reason,
        snapshots=ext.snapshots,
        egress_policies=[_wire_enum(p) for p in ext.egress_policies],
        facts=dict(ext.facts),
        resource_limits=ext.resource_limits,
        storage_limits=ext.storage_limits,
        terminal=ext.terminal,
        pids_limits=ext.pids_limits,
        services=ext.services,
        save_state=ext.save_state,
        save_state_reason=ext.save_state_reason,
        volume_removal=ext.volume_removal,
    )


def extensions_from_pb(msg: ext_pb.ExtensionsResponse) -> Extensions:
    facts: Mapping[str, str] = dict(msg.facts)
    return Extensions(
        extensions_version=msg.extensions_version,
        target_os=tuple(msg.target_os),
        profiles=tuple(msg.profiles),
        tty=msg.tty,
        accelerator=msg.accelerator,
        accelerator_reason=msg.accelerator_reason,
        snapshots=msg.snapshots,
        egress_policies=tuple(_enum(EgressPolicy, p) for p in msg.egress_policies),  # type: ignore[misc]
        facts=facts,
        resource_limits=msg.resource_limits,
        storage_limits=msg.storage_limits,
        terminal=msg.terminal,
        pids_limits=msg.pids_limits,
        services=msg.services,
        save_state=msg.save_state,
        save_state_reason=msg.save_state_reason,
        volume_removal=msg.volume_removal,
    )


def terminal_spec_to_pb(spec: TerminalSpec) -> ext_pb.PtyStart:
    return ext_pb.PtyStart(
        workspace_id=spec.workspace_id,
        argv=list(spec.argv),
        user=spec.user,
        workdir=spec.workdir,
        environment=dict(spec.environment),
        rows=spec.rows,
        cols=spec.cols,
        term=spec.term,
    )


def terminal_spec_from_pb(msg: ext_pb.PtyStart) -> TerminalSpec:
    """The spec of a start frame; rows, cols or term left unset (0, "") take the documented defaults."""
    return TerminalSpec(
        workspace_id=msg.workspace_id,
        argv=tuple(msg.argv),
        user=msg.user,
        workdir=msg.workdir,
        environment=dict(msg.environment),
        rows=msg.rows or TERMINAL_ROWS,
        cols=msg.cols or TERMINAL_COLS,
        term=msg.term or TERMINAL_TERM,
    )


def terminal_input_to_pb(item: TerminalInput) -> ext_pb.PtyClientMessage:
    if isinstance(item, TerminalData):
        return ext_pb.PtyClientMessage(stdin=item.data)
    if isinstance(item, TerminalResize):
        return ext_pb.PtyClientMessage(resize=ext_pb.PtyResize(rows=item.rows, cols=item.cols))
    return ext_pb.PtyClientMessage(close_stdin=ext_pb.PtyCloseStdin())


def terminal_input_from_pb(msg: ext_pb.PtyClientMessage) -> TerminalInput | None:
    """The input a frame after the start carries; ``None`` for a start or an unset payload (not input)."""
    which = msg.WhichOneof("payload")
    if which == "stdin":
        return TerminalData(msg.stdin)
    if which == "resize":
        return TerminalResize(msg.resize.rows, msg.resize.cols)
    if which == "close_stdin":
        return TerminalEof()
    return None


def terminal_event_to_pb(event: TerminalEvent) -> ext_pb.PtyServerMessage:
    if isinstance(event, ExecExit):
        return ext_pb.PtyServerMessage(exit=ext_pb.PtyExit(exit_code=event.exit_code, signal=event.signal))
    return ext_pb.PtyServerMessage(output=event.data)


def terminal_event_from_pb(msg: ext_pb.PtyServerMessage) -> TerminalEvent | None:
    """The event a frame carries; ``None`` for a frame with no payload set (a protocol violation)."""
    which = msg.WhichOneof("payload")
    if which == "output":
        return TerminalOutput(msg.output)
    if which == "exit":
        return ExecExit(msg.exit.exit_code, msg.exit.signal)
    return None
