"""Host files of a driver: atomic writes that fail with a clear error, reads that never follow links, and
``subpath`` (a path below an object's root, declared on its class). Below both the shared Machine layer
(``vz_drivers._machine``) and the image store (``vz_drivers._images``), which both write host files with it.

A full disk, a read-only filesystem or a permission problem while writing a record, a spec or an image index is
a condition of the host, not a bug: it ends in ``UnavailableError`` naming the path and what to do, never in a
traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from vz_core.errors import UnavailableError

__all__ = ["STORAGE_ERRNOS", "atomic_write", "host_write_error", "read_chunks_nofollow", "subpath"]

_CHUNK = 32768
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})
"""errno values that mean "the host's storage cannot take this write" wherever they come from."""


def host_write_error(path: Path | str, exc: OSError) -> UnavailableError:
    """The error for an ``OSError`` while writing ``path`` on the host: which file, why, what to do."""
    code = exc.errno or 0
    reason = exc.strerror or str(exc)
    if code in (errno.ENOSPC, errno.EDQUOT):
        advice = "free space (or quota) on that filesystem and retry"
    elif code == errno.EROFS:
        advice = "that filesystem is read-only; remount it read-write or choose another state directory"
    elif code in (errno.EACCES, errno.EPERM):
        advice = "fix the permissions of that directory (vz writes it as the user running the driver)"
    else:
        advice = "check that filesystem and retry"
    return UnavailableError(
        f"cannot write {path}: {reason} [{errno.errorcode.get(code, code)}]; {advice}",
        details={"path": str(path), "errno": errno.errorcode.get(code, str(code))},
    )


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, rename).

    Readers see the old content or the new one, never a mix. Raises ``UnavailableError`` (naming ``path``)
    when the host cannot write it; the temporary file never stays behind.
    """
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise host_write_error(path, exc) from None
    try:
        if sys.platform == "win32":  # modes are ACLs there: chmod keeps only its read-only bit
            os.chmod(tmp, mode)
        else:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise host_write_error(path, exc) from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_chunks_nofollow(path: Path, chunk: int = _CHUNK) -> Iterator[bytes]:
    """The chunks of the regular file ``path``; nothing when it is missing, a link, a FIFO or anything else.

    For files in directories a Machine can write (its main log): a link planted there never makes the host
    read one of its own files, and a FIFO never blocks the host.
    """
    try:
        if sys.platform == "win32":  # no O_NOFOLLOW: a link (a reparse point) is refused before the open
            if os.lstat(path).st_file_attributes & stat.FILE_ATTRIBUTE_REPARSE_POINT:
                return
            fd = os.open(path, os.O_RDONLY | os.O_BINARY)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        while data := os.read(fd, chunk):
            yield data
    finally:
        os.close(fd)


class _Rooted(Protocol):
    @property
    def root(self) -> Path: ...


class subpath:
    """A path below an object's ``root``, declared on its class like a property: ``disk = subpath("disk.img")``."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, obj: _Rooted | None, owner: type | None = None) -> Path:
        if obj is None:
            raise AttributeError("subpath is read on an instance")
        return obj.root.joinpath(*self.parts)
