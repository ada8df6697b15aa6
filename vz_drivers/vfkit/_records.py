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

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import FailedPreconditionError
from vz_drivers._machine import MachinePaths, MachineRecord, RecordBook, subpath

__all__ = ["SOCKET_LIMIT", "VfkitBook", "VfkitPaths", "VfkitRecord", "socket_dir"]

SOCKET_LIMIT = 100
"""Longest socket path used (macOS ``sun_path`` holds 104 bytes with the terminating NUL)."""


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


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise FailedPreconditionError(
            f"{path} is not a private directory of this user (mode 0700, owned by uid {os.geteuid()}); remove it "
            "so that vz can create it",
            details={"path": str(path)},
        )
    return path


def socket_dir(paths: VfkitPaths, key: str, *, create: bool = True) -> Path:
    """Where a Machine's sockets live: ``run/`` when short enough, else a private directory in the temp dir
    (created and checked when ``create``)."""
    if len(os.fsencode(paths.run / "ready.sock")) <= SOCKET_LIMIT:
        return paths.run
    base = Path(tempfile.gettempdir()) / f"vz-{os.geteuid()}-vfkit"
    if not create:
        return base / key[:16]
    return _private_dir(_private_dir(base) / key[:16])
