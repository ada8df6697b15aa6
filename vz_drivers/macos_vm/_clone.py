"""APFS copy-on-write clones (``clonefile(2)``): how a Machine's disk is made from an installed base.

A clone shares every block with its source until one side writes, so a new Machine costs seconds and only
the blocks it changes. ``clonefile`` exists on macOS only and only within one APFS volume; on any other host
(or across volumes, ``EXDEV``) it is refused with the reason: there is no silent full copy of a 64 GiB disk.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

from vz_core.errors import FailedPreconditionError, UnsupportedError

__all__ = ["CLONE_NOFOLLOW", "CloneFn", "clone_file", "libc_clonefile"]

_ON_MACOS = sys.platform == "darwin"  # a plain bool: type-checked on every host
CLONE_NOFOLLOW = 0x0001
"""<sys/clonefile.h>: do not follow a symlink at the source."""

CloneFn = Callable[[bytes, bytes, int], int]
"""``clonefile(src, dst, flags)``: 0 on success, -1 with ``errno`` set (ctypes' ``use_errno``)."""


def libc_clonefile() -> CloneFn:
    """``clonefile`` from the C library; ``UnsupportedError`` where it does not exist (not macOS)."""
    if not _ON_MACOS:
        raise UnsupportedError(
            f"APFS clones (clonefile) exist on macOS only; this host is {sys.platform}: macOS Machines are cloned "
            "from their base on the Mac that runs them"
        )
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libSystem.dylib", use_errno=True)
    fn = libc.clonefile
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32]
    fn.restype = ctypes.c_int
    return cast("CloneFn", fn)


def clone_file(source: Path, destination: Path, *, clonefile: CloneFn | None = None) -> None:
    """Make ``destination`` (which must not exist) a copy-on-write clone of the regular file ``source``."""
    fn = clonefile or libc_clonefile()
    if destination.exists() or destination.is_symlink():
        raise FileExistsError(errno.EEXIST, "clone destination exists", str(destination))
    ctypes.set_errno(0)
    if fn(os.fsencode(source), os.fsencode(destination), CLONE_NOFOLLOW) == 0:
        return
    err = ctypes.get_errno()
    if err == errno.EXDEV:
        raise FailedPreconditionError(
            f"{source} and {destination} are on different volumes: a clone needs both on one APFS volume; keep "
            "the driver's state_dir (bases and Machines) on one APFS volume"
        )
    if err in (errno.ENOTSUP, errno.EOPNOTSUPP):
        raise FailedPreconditionError(
            f"the volume holding {source} does not support clones (not APFS); move the driver's state_dir to APFS"
        )
    raise OSError(err, f"clonefile failed: {os.strerror(err)}", str(source))
