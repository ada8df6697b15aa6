"""What the vfkit driver adds to the shared record book (``vz_drivers._machine``).

Layout under the driver state root (``<state>``), besides the shared entries::

    <state>/trust.json                   vfkit's path and SHA-256, recorded on first use
    <state>/bin/<sha256>/vfkit           the private, verified copy of vfkit that is executed
    <state>/machines/<key>/disk.img      the raw root disk (virtio-blk): the image's root filesystem as ext4
    <state>/machines/<key>/cfg/          the virtio-fs share "vzcfg": config.sh (0600), hosts, resolv.conf
    <state>/machines/<key>/run/          vfkit's working directory: console.log (virtio-serial), vfkit.log (its
                                         stdout+stderr), vfkit.status (its exit status), and the sockets
                                         rest.sock, agent.sock, ready.sock when the path is short enough
    <state>/staging/                     root disks being built for a (re)creation

Unix socket paths are limited to 104 bytes on macOS: when ``run/`` is too deep, the sockets live in a private
0700 directory under the user's temporary directory instead (``vz-<uid>-vfkit/<key>``), checked before use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vz_drivers._machine import SOCKET_LIMIT, MachinePaths, MachineRecord, RecordBook, subpath
from vz_drivers._machine import socket_dir as shared_socket_dir

__all__ = ["SOCKET_LIMIT", "VfkitBook", "VfkitPaths", "VfkitRecord", "socket_dir"]


@dataclass(kw_only=True)
class VfkitRecord(MachineRecord):
    """A vfkit Machine: ``pid`` is the vfkit process; ``vfkit`` the executable it was started from."""

    disk_bytes: int
    vfkit: str = ""
    vfkit_sha256: str = ""
    socket_dir: str = ""


@dataclass(frozen=True)
class VfkitPaths(MachinePaths):
    disk = subpath("disk.img")
    cfg = subpath("cfg")
    console = subpath("run", "console.log")
    vfkit_log = subpath("run", "vfkit.log")
    vfkit_status = subpath("run", "vfkit.status")


class VfkitBook(RecordBook[VfkitRecord, VfkitPaths]):
    staging = subpath("staging")

    def __init__(self, root: Path) -> None:
        super().__init__(root, VfkitRecord, VfkitPaths)


def socket_dir(paths: VfkitPaths, key: str, *, create: bool = True) -> Path:
    """Where a vfkit Machine's sockets live (the shared short-path rule; its longest name is ``ready.sock``)."""
    return shared_socket_dir(paths, key, driver="vfkit", longest="ready.sock", create=create)
