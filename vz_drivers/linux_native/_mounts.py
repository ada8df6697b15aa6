"""Host-side mounts of a Machine: its overlay root filesystem (mount(2) directly, no helper process)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

from vz_core.errors import RuntimeFailureError

__all__ = ["is_mounted", "mount_overlay", "mounts_under", "unmount"]

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
MNT_DETACH = 2
_UNESCAPE = {"\\040": " ", "\\011": "\t", "\\012": "\n", "\\134": "\\"}


def _unescape(field: str) -> str:
    for k, v in _UNESCAPE.items():
        field = field.replace(k, v)
    return field


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return [_unescape(line.split()[4]) for line in fh]


def is_mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point (per this process's mount namespace)."""
    return str(path) in _mount_points()


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first."""
    prefix = str(path).rstrip("/") + "/"
    found = [m for m in _mount_points() if m == str(path) or m.startswith(prefix)]
    return sorted(set(found), key=len, reverse=True)


def mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    """Mount ``lower`` (read-only image rootfs) + ``upper`` (Machine-local writes) at ``target``."""
    for ch in (",", ":"):
        if any(ch in str(p) for p in (lower, upper, work)):
            raise RuntimeFailureError(f"overlay directories must not contain {ch!r}: {lower}, {upper}, {work}")
    options = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    if _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, options) != 0:
        err = ctypes.get_errno()
        raise RuntimeFailureError(
            f"mounting the Machine's root filesystem (overlayfs) at {target} failed: {os.strerror(err)}",
            runtime_message=options.decode(),
        )


def unmount(target: Path) -> None:
    """Unmount ``target`` and anything below it (idempotent); lazily when busy."""
    for mount_point in mounts_under(target):
        if _libc.umount2(mount_point.encode(), 0) != 0:
            err = ctypes.get_errno()
            if err in (errno.EINVAL, errno.ENOENT):
                continue
            if err == errno.EBUSY and _libc.umount2(mount_point.encode(), MNT_DETACH) == 0:
                continue
            raise RuntimeFailureError(f"unmounting {mount_point} failed: {os.strerror(err)}")
