"""What the qemu driver adds to the shared record book.

Layout under the driver state root (``<state>``), besides the shared entries (``vz_drivers._machine``)::

    <state>/machines/<key>/disk.img      the root disk: the image's root filesystem as ext4 (Machine-local data)
    <state>/machines/<key>/cfg/          the read-only 9p share "vzcfg": config.sh (0600), hosts, resolv.conf
    <state>/machines/<key>/run/          QEMU's working directory: qmp.sock, agent-<n>.sock, qemu.pid,
                                         console.log, port-<n>.lock (which host process holds which port)
    <state>/machines/<key>/main.log      the main process's log, copied through the agent at a graceful Stop
    <state>/staging/                     root disks being built for a (re)creation

QEMU runs detached in its own session: the record (pid plus kernel start time) is how any later driver process
finds it again. The guest sees none of these directories but ``cfg/`` (read-only), so the host side of every
agent channel (``run/agent-<n>.sock``, created by QEMU) is out of the Machine's reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from vz_drivers._machine import MachinePaths, MachineRecord, RecordBook, subpath

__all__ = ["QemuBook", "QemuPaths", "QemuRecord"]


@dataclass(kw_only=True)
class QemuRecord(MachineRecord):
    """A QEMU Machine: ``pid`` is the QEMU process."""

    LEGACY_NAMES: ClassVar[dict[str, str]] = {"qemu_pid": "pid", "qemu_start_time": "pid_start"}

    disk_bytes: int
    accelerator: str = ""


@dataclass(frozen=True)
class QemuPaths(MachinePaths):
    disk = subpath("disk.img")
    cfg = subpath("cfg")
    qmp = subpath("run", "qmp.sock")
    pidfile = subpath("run", "qemu.pid")
    console = subpath("run", "console.log")
    qemu_log = subpath("run", "qemu.log")

    def agent_socket(self, port: int) -> Path:
        return self.run / f"agent-{port}.sock"

    def port_lock(self, port: int) -> Path:
        return self.run / f"port-{port}.lock"


class QemuBook(RecordBook[QemuRecord, QemuPaths]):
    def __init__(self, root: Path) -> None:
        super().__init__(root, QemuRecord, QemuPaths)

    staging = subpath("staging")
    """Root disks being built for a (re)creation."""
