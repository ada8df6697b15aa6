"""A deterministic writer of "newc" cpio archives (the format the Linux kernel unpacks as an initramfs).

Entries are written exactly as given (no timestamps, owners or inode numbers taken from the host), so the same
inputs always produce the same bytes, which is what makes the initramfs cache content-addressed.
"""

from __future__ import annotations

import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["CpioEntry", "write_cpio"]

_MAGIC = b"070701"
_TRAILER = "TRAILER!!!"


@dataclass(frozen=True)
class CpioEntry:
    """One archive member. ``path`` is relative ("bin/busybox"); ``mode`` includes the file type bits."""

    path: str
    mode: int
    data: bytes = b""
    rdev_major: int = 0
    rdev_minor: int = 0

    @classmethod
    def directory(cls, path: str, perm: int = 0o755) -> CpioEntry:
        return cls(path, stat.S_IFDIR | perm)

    @classmethod
    def file(cls, path: str, data: bytes, perm: int = 0o644) -> CpioEntry:
        return cls(path, stat.S_IFREG | perm, data)

    @classmethod
    def symlink(cls, path: str, target: str) -> CpioEntry:
        return cls(path, stat.S_IFLNK | 0o777, target.encode())

    @classmethod
    def char_device(cls, path: str, major: int, minor: int, perm: int = 0o600) -> CpioEntry:
        return cls(path, stat.S_IFCHR | perm, b"", major, minor)


def _pad(n: int) -> bytes:
    return b"\0" * ((4 - n % 4) % 4)


def _header(ino: int, entry: CpioEntry, name: bytes, size: int) -> bytes:
    nlink = 2 if stat.S_ISDIR(entry.mode) else 1
    fields = (
        ino,
        entry.mode,
        0,  # uid
        0,  # gid
        nlink,
        0,  # mtime: fixed for reproducibility
        size,
        0,  # dev major
        0,  # dev minor
        entry.rdev_major,
        entry.rdev_minor,
        len(name) + 1,
        0,  # check
    )
    return _MAGIC + b"".join(b"%08X" % value for value in fields)


def write_cpio(out: BinaryIO, entries: Iterable[CpioEntry]) -> None:
    """Write ``entries`` (in the given order; parents before children) followed by the trailer."""
    ino = 1
    for entry in [*entries, CpioEntry(_TRAILER, 0)]:
        name = entry.path.encode()
        if not name or name.startswith(b"/"):
            raise ValueError(f"cpio member path must be relative and non-empty, got {entry.path!r}")
        data = entry.data
        header = _header(0 if entry.path == _TRAILER else ino, entry, name, len(data))
        out.write(header + name + b"\0")
        out.write(_pad(len(header) + len(name) + 1))
        out.write(data)
        out.write(_pad(len(data)))
        ino += 1
