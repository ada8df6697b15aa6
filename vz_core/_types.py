"""Plain typed values of the Machine contract.

These mirror the Runtime Protocol v1 messages (PROTOCOL.md §1) without any protobuf types, so driver authors,
the CLI and the conformance suite never touch generated code. ``vz_core.rpc`` (its conversion module) is the
one place that translates between these and the wire messages.
"""

from __future__ import annotations

import enum
import signal as _signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

__all__ = [
    "API_MAJOR",
    "API_MINOR",
    "ARCHITECTURES",
    "MAX_CHUNK",
    "MAX_WINDOW",
    "TERMINAL_COLS",
    "TERMINAL_ROWS",
    "TERMINAL_TERM",
    "Capabilities",
    "DriverInfo",
    "EgressPolicy",
    "ExecEvent",
    "ExecExit",
    "ExecOutput",
    "ExecSpec",
    "Extensions",
    "GpuRequirement",
    "HostRequirements",
    "MachineConfig",
    "MachineDetails",
    "MachineMount",
    "MachineState",
    "Mount",
    "MountType",
    "RecreateMode",
    "RunImageRequest",
    "TerminalData",
    "TerminalEof",
    "TerminalEvent",
    "TerminalInput",
    "TerminalOutput",
    "TerminalResize",
    "TerminalSpec",
]

API_MAJOR = 1
"""The Runtime Protocol major version this code speaks."""
API_MINOR = 3
"""The newest minor version this code speaks (1.3 adds recreate-on-run)."""
MAX_CHUNK = 32768
"""Largest payload of one exec stdin/stdout/stderr frame or logs chunk, in bytes."""
ARCHITECTURES = ("amd64", "arm64")
"""The only values TargetArchitecture may answer."""
TERMINAL_ROWS = 24
"""Rows of a terminal session whose start gave none."""
TERMINAL_COLS = 80
"""Columns of a terminal session whose start gave none."""
TERMINAL_TERM = "xterm"
"""TERM of a terminal session whose start gave none."""
MAX_WINDOW = 65535
"""Largest number of rows or columns of a terminal window (the kernel keeps them in 16 bits)."""

_EMPTY: Mapping[str, str] = MappingProxyType({})


class MountType(enum.IntEnum):
    """Kind of a mount (wire enum ``MountType``)."""

    UNSPECIFIED = 0
    BIND = 1
    VOLUME = 2
    TMPFS = 3

    @property
    def label(self) -> str:
        """The lowercase name used in ContainerMount.type ("bind", "volume", "tmpfs")."""
        return self.name.lower()


class RecreateMode(enum.IntEnum):
    """How a driver replaces an existing Machine (wire enum ``RecreateMode``)."""

    UNSPECIFIED = 0
    DELETE = 1
    STOP = 2
    ON_RUN = 3


class GpuRequirement(enum.IntEnum):
    """Wire enum ``GpuRequirementValue``."""

    UNSPECIFIED = 0
    FALSE = 1
    OPTIONAL = 2
    REQUIRED = 3


class EgressPolicy(enum.IntEnum):
    """Outbound network policy of a Machine (``vz.machine.v1.EgressPolicy``)."""

    UNSPECIFIED = 0
    ALLOW = 1
    DENY = 2


@dataclass(frozen=True)
class Capabilities:
    """What a driver supports (wire message ``Capabilities``).

    Optional calls are gated on these flags: a host never calls ProvisioningPreflight, ReusePreflight or Logs
    on a driver that does not advertise them.
    """

    mount_types: tuple[MountType, ...] = ()
    requires_mount_streaming: bool = False
    requires_workspace_chown: bool = False
    recreate_mode: RecreateMode = RecreateMode.DELETE
    provisioning_preflight: bool = False
    reprovision: bool = False
    logs: bool = False
    reuse_preflight: bool = False


@dataclass(frozen=True)
class DriverInfo:
    """Answer to Info (wire message ``InfoResponse``)."""

    driver_name: str
    driver_version: str
    runtime_name: str
    runtime_version: str = ""
    capabilities: Capabilities | None = field(default_factory=Capabilities)
    api_major: int = API_MAJOR
    api_minor: int = API_MINOR


@dataclass(frozen=True)
class Mount:
    """A mount requested for a Machine (wire message ``Mount``).

    For BIND, ``source`` is a host path; for VOLUME, a volume name; for TMPFS it is ignored.
    """

    type: MountType
    source: str
    target: str
    read_only: bool = False
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostRequirements:
    """Resources requested for a Machine; zero means "driver default"."""

    cpus: int = 0
    memory_bytes: int = 0
    storage_bytes: int = 0
    gpu: GpuRequirement = GpuRequirement.UNSPECIFIED


def _redacted_env(env: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k!r}: '***'" for k in env) + "}"


@dataclass(frozen=True)
class RunImageRequest:
    """Create and start a Machine (wire message ``RunImageRequest``).

    ``environment`` values are secrets: they never appear in ``repr``, logs or errors.
    ``privileged`` and ``init`` keep explicit presence (``None`` = unset, which differs from ``False``).
    """

    workspace_id: str
    image: str
    image_built_locally: bool = False
    user: str = ""
    entrypoint: str = ""
    args: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    labels: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ()
    privileged: bool | None = None
    init: bool | None = None
    workspace_mount: Mount | None = None
    mounts: tuple[Mount, ...] = ()
    userns: str = ""
    uid_map: tuple[str, ...] = ()
    gid_map: tuple[str, ...] = ()
    platform: str = ""
    host_requirements: HostRequirements | None = None
    remote_user: str = ""
    dockerless: bool = False
    allow_recreate: bool = False

    def label_map(self) -> dict[str, str]:
        """Labels as a dict, each "k=v" split at the first "=" (a label without "=" maps to "")."""
        out: dict[str, str] = {}
        for item in self.labels:
            key, _, value = item.partition("=")
            out[key] = value
        return out

    def developer_identity(self) -> str:
        """The resolved developer identity: remote_user, else user, else "root"."""
        return self.remote_user or self.user or "root"

    def all_mounts(self) -> tuple[Mount, ...]:
        """The workspace mount (if any) followed by the other mounts."""
        return ((self.workspace_mount,) if self.workspace_mount else ()) + self.mounts

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}={_redacted_env(value) if name == 'environment' else repr(value)}"
            for name, value in self.__dict__.items()
        )
        return f"RunImageRequest({fields})"


@dataclass(frozen=True)
class MachineState:
    """Wire message ``ContainerState``; ``status`` is "running" or "stopped"."""

    status: Literal["running", "stopped"]
    started_at: str = ""
    exit_code: int = 0
    error: str = ""


@dataclass(frozen=True)
class MachineConfig:
    """Wire message ``ContainerConfig``."""

    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    working_dir: str = ""
    user: str = ""


@dataclass(frozen=True)
class MachineMount:
    """Wire message ``ContainerMount``; ``type`` is "bind", "volume" or "tmpfs"."""

    type: str
    source: str
    destination: str


@dataclass(frozen=True)
class MachineDetails:
    """What Find reports about an existing Machine (wire message ``ContainerDetails``)."""

    id: str
    created_at: str
    state: MachineState
    config: MachineConfig = field(default_factory=MachineConfig)
    mounts: tuple[MachineMount, ...] = ()


@dataclass(frozen=True)
class ExecSpec:
    """The start of an exec (wire message ``ExecStart``). ``environment`` values are secrets."""

    workspace_id: str
    argv: tuple[str, ...]
    user: str = ""
    workdir: str = ""
    environment: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    tty: bool = False

    def __repr__(self) -> str:
        return (
            f"ExecSpec(workspace_id={self.workspace_id!r}, argv={self.argv!r}, user={self.user!r}, "
            f"workdir={self.workdir!r}, environment={_redacted_env(self.environment)}, tty={self.tty!r})"
        )


@dataclass(frozen=True)
class ExecOutput:
    """A chunk of command output; ``data`` must be 1..MAX_CHUNK bytes."""

    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class ExecExit:
    """The final event of an exec. Success is ``exit_code == 0`` and an empty ``signal``."""

    exit_code: int
    signal: str = ""

    @property
    def success(self) -> bool:
        return self.exit_code == 0 and not self.signal

    @classmethod
    def from_returncode(cls, returncode: int) -> ExecExit:
        """The exit of a host process from its ``subprocess`` return code: a death by signal N (a negative
        return code) is ``exit_code = 128 + N`` with the signal's name (``SIG<N>`` when it has none)."""
        if returncode >= 0:
            return cls(returncode)
        number = -returncode
        try:
            name = _signal.Signals(number).name
        except ValueError:
            name = f"SIG{number}"
        return cls(128 + number, name)


ExecEvent = ExecOutput | ExecExit


@dataclass(frozen=True)
class Extensions:
    """What a driver supports beyond the Runtime Protocol (``vz.machine.v1.ExtensionsResponse``)."""

    extensions_version: int = 1
    target_os: tuple[str, ...] = ("linux",)
    profiles: tuple[str, ...] = ()
    tty: bool = False
    accelerator: str = ""
    accelerator_reason: str = ""
    snapshots: bool = False
    egress_policies: tuple[EgressPolicy, ...] = ()
    facts: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    resource_limits: bool = False
    storage_limits: bool = False
    terminal: bool = False
    """``Driver.terminal`` (the ``ExecPty`` terminal session) is served. ``tty`` is different: it says that
    the Runtime Protocol's own Exec accepts ``tty=True``, which vz drivers never do."""
    pids_limits: bool = False
    """The ``vz.pids`` label (the most tasks the Machine may have at once) is enforced by the host's kernel."""
    services: bool = False
    """``Driver.set_services``, ``service_states`` and ``service_logs`` are served: the driver supervises
    services in its Machines (``vz_core.services``)."""
    volume_removal: bool = False
    """``Driver.delete_volume`` is served: the driver removes a named volume's data (``vz volume rm``)."""
    save_state: bool = False
    """The driver saves a running Machine's state on stop and resumes it (``save_state``, ``restore_state``;
    ``vz_core.savestate``). The plugin server answers false when the driver lacks those methods."""
    save_state_reason: str = ""
    """When ``save_state`` is false: why this driver cannot save a Machine's state; "" otherwise."""


@dataclass(frozen=True)
class TerminalSpec:
    """The start of a terminal session (wire message ``vz.machine.v1.PtyStart``).

    ``rows``/``cols`` (1..MAX_WINDOW) are the window size at start and ``term`` the ``TERM`` the command sees;
    a start that gave none gets ``TERMINAL_ROWS``/``TERMINAL_COLS``/``TERMINAL_TERM``. ``environment`` values
    are secrets.
    """

    workspace_id: str
    argv: tuple[str, ...]
    user: str = ""
    workdir: str = ""
    environment: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    rows: int = TERMINAL_ROWS
    cols: int = TERMINAL_COLS
    term: str = TERMINAL_TERM

    def __repr__(self) -> str:
        return (
            f"TerminalSpec(workspace_id={self.workspace_id!r}, argv={self.argv!r}, user={self.user!r}, "
            f"workdir={self.workdir!r}, environment={_redacted_env(self.environment)}, rows={self.rows!r}, "
            f"cols={self.cols!r}, term={self.term!r})"
        )


@dataclass(frozen=True)
class TerminalData:
    """Keystrokes (or pasted bytes) for the terminal, written to its input as they are: 1..MAX_CHUNK bytes.

    Control characters are data too: ``b"\\x03"`` (Ctrl-C) makes the terminal's line discipline signal the
    foreground process group, ``b"\\x04"`` (Ctrl-D) is end of file for a reading command.
    """

    data: bytes


@dataclass(frozen=True)
class TerminalResize:
    """The window changed size: 1..MAX_WINDOW rows and columns. The command gets SIGWINCH."""

    rows: int
    cols: int


@dataclass(frozen=True)
class TerminalEof:
    """No more keystrokes will come (resizes still may). The session goes on until the command exits."""


TerminalInput = TerminalData | TerminalResize | TerminalEof
"""What a client sends during a terminal session."""


@dataclass(frozen=True)
class TerminalOutput:
    """What the terminal displayed: 1..MAX_CHUNK bytes of its one output stream, undecoded."""

    data: bytes


TerminalEvent = TerminalOutput | ExecExit
"""What a terminal session produces: output, then exactly one ``ExecExit``."""
