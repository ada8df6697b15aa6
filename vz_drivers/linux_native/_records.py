"""What linux_native adds to the shared record book.

Layout under the driver state root (``<state>``), besides the shared entries (``vz_drivers._machine``)::

    <state>/trust.json                   trusted runc path and SHA-256 (trust on first use, or configured)
    <state>/runc/                        ``runc --root``: runc's own container state, never the system's
    <state>/machines/<key>/upper|work/   the Machine-local root layer (overlayfs upper and work dirs)
    <state>/machines/<key>/rootfs/       mount point of the merged root filesystem while the Machine runs
    <state>/machines/<key>/bundle/       generated OCI runtime spec (config.json)
    <state>/machines/<key>/run/          bind-mounted at /.vz/run inside: where the agent first binds its
                                         socket (the host moves it to chan/ before using it) and the main log
    <state>/machines/<key>/chan/         the agent's socket, out of the Machine's reach
    <state>/machines/<key>/etc/          generated files bind-mounted inside (meminfo, hosts, resolv.conf)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from vz_drivers._machine import MachinePaths, MachineRecord, RecordBook, subpath

__all__ = ["LinuxNativeBook", "LinuxNativePaths", "LinuxNativeRecord"]


@dataclass(kw_only=True)
class LinuxNativeRecord(MachineRecord):
    """A runc Machine: ``pid`` is its init (the guest agent, PID 1 inside)."""

    LEGACY_NAMES: ClassVar[dict[str, str]] = {"init_pid": "pid", "init_start_time": "pid_start"}

    container_id: str
    lower_dir: str
    uid: int
    gid: int
    additional_gids: list[int]
    cpuset: str
    profile: str
    cap_add: list[str]
    privileged: bool
    no_new_privileges: bool
    seccomp: bool = True
    """The seccomp filter applies (``security_opt: seccomp=unconfined`` turns it off in the developer profile)."""
    pids: int = 0
    """The pids limit asked for (label ``vz.pids``); 0 = the driver's default for the host (``limits``)."""


@dataclass(frozen=True)
class LinuxNativePaths(MachinePaths):
    upper = subpath("upper")
    work = subpath("work")
    rootfs = subpath("rootfs")
    bundle = subpath("bundle")
    etc = subpath("etc")
    inner_socket = subpath("run", "agent.sock")
    """Where the agent binds its socket (inside /.vz/run, which the Machine can write)."""
    socket = subpath("chan", "agent.sock")
    """The agent's socket once the host moved it out of the Machine's reach."""
    log = subpath("run", "main.log")
    agent_stderr = subpath("agent.stderr")
    runc_log = subpath("runc.log")


class LinuxNativeBook(RecordBook[LinuxNativeRecord, LinuxNativePaths]):
    """The record book plus runc's state directory and the runc trust file."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, LinuxNativeRecord, LinuxNativePaths)

    runc_root = subpath("runc")
    trust_file = subpath("trust.json")

    def ensure(self, *extra: Path) -> None:
        super().ensure(self.runc_root, *extra)
