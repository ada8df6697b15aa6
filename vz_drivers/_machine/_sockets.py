"""Short Unix socket paths for Machines whose directory is deep (macOS ``sun_path`` holds 104 bytes)."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from vz_core.errors import FailedPreconditionError
from vz_drivers._machine._book import MachinePaths

__all__ = ["SOCKET_LIMIT", "private_dir", "socket_dir"]

SOCKET_LIMIT = 100
"""Longest socket path used (macOS ``sun_path`` holds 104 bytes with the terminating NUL)."""


def private_dir(path: Path) -> Path:
    """``path`` created if missing and checked: a directory of this user, mode 0700 (``FailedPreconditionError``
    naming it otherwise)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    if sys.platform == "win32":  # ACLs, not modes: a real directory (no link, no junction) under the profile
        if not stat.S_ISDIR(st.st_mode) or st.st_file_attributes & stat.FILE_ATTRIBUTE_REPARSE_POINT:
            raise FailedPreconditionError(
                f"{path} is not a directory of its own (a link, a junction or a file); remove it so that vz can "
                "create it",
                details={"path": str(path)},
            )
        return path
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise FailedPreconditionError(
            f"{path} is not a private directory of this user (mode 0700, owned by uid {os.geteuid()}); remove it "
            "so that vz can create it",
            details={"path": str(path)},
        )
    return path


def socket_dir(paths: MachinePaths, key: str, *, driver: str, longest: str, create: bool = True) -> Path:
    """Where a Machine's sockets live: ``paths.run`` when ``run/<longest>`` fits ``SOCKET_LIMIT``, else a private
    directory ``<temp>/vz-<uid>-<driver>/<key[:16]>`` (created and checked when ``create``)."""
    if len(os.fsencode(paths.run / longest)) <= SOCKET_LIMIT:
        return paths.run
    if sys.platform == "win32":  # the temp directory is the user's own there (%TEMP% under the profile)
        base = Path(tempfile.gettempdir()) / f"vz-{driver}"
    else:
        base = Path(tempfile.gettempdir()) / f"vz-{os.geteuid()}-{driver}"
    if not create:
        return base / key[:16]
    return private_dir(private_dir(base) / key[:16])
