"""Secret storage at rest: the kernel keyring on Linux; memory only on macOS and Windows.

Linux: ``user`` keys in the calling user's keyring through the ``add_key``/``keyctl`` system calls (memory of
the kernel, permission of that user only, gone at reboot). macOS and Windows: ``Keyring().usable`` is False and
``vz_core.secrets`` keeps the values only in the driver process's memory (a Machine started by a later process
must be recreated to receive its values again); the OS credential stores are not used, so that no secret is
ever written to disk.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import sys

__all__ = ["KEYRING", "Keyring"]

KEYRING = sys.platform == "linux"
"""Whether secrets can outlive the process that holds them (the Linux kernel keyring)."""

_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219), "arm64": (217, 219)}
_USER_KEYRING = -4
_KEYCTL_SETPERM = 5
_KEYCTL_SEARCH = 10
_KEYCTL_READ = 11
_KEYCTL_INVALIDATE = 21
_KEYCTL_REVOKE = 3
_PERM = 0x3F3F0000  # possessor: all; the user: all; group, others: nothing
_CHUNK = 32000  # a "user" key holds at most 32767 bytes
if sys.platform == "linux":
    _GONE = (errno.ENOKEY, errno.EKEYREVOKED, errno.EKEYEXPIRED)
else:
    _GONE = ()


class Keyring:
    """The calling user's kernel keyring through the ``add_key``/``keyctl`` system calls (Linux only:
    ``usable`` is False elsewhere)."""

    def __init__(self) -> None:
        self._numbers = _SYSCALLS.get(platform.machine()) if KEYRING else None
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True) if self._numbers else None

    @property
    def usable(self) -> bool:
        return self._libc is not None

    def _call(self, *args: object) -> int:
        assert self._libc is not None
        result = int(self._libc.syscall(*args))
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return result

    def add(self, description: str, payload: bytes) -> None:
        assert self._numbers is not None
        serial = self._call(
            ctypes.c_long(self._numbers[0]),
            b"user",
            description.encode(),
            payload,
            ctypes.c_size_t(len(payload)),
            ctypes.c_int(_USER_KEYRING),
        )
        self._call(
            ctypes.c_long(self._numbers[1]), ctypes.c_int(_KEYCTL_SETPERM), ctypes.c_int(serial), ctypes.c_uint(_PERM)
        )

    def _search(self, description: str) -> int | None:
        assert self._numbers is not None
        try:
            return self._call(
                ctypes.c_long(self._numbers[1]),
                ctypes.c_int(_KEYCTL_SEARCH),
                ctypes.c_int(_USER_KEYRING),
                b"user",
                description.encode(),
                ctypes.c_int(0),
            )
        except OSError as exc:
            if exc.errno in _GONE:
                return None
            raise

    def read(self, description: str) -> bytes | None:
        assert self._numbers is not None
        serial = self._search(description)
        if serial is None:
            return None
        buf = ctypes.create_string_buffer(_CHUNK + 1024)
        size = self._call(
            ctypes.c_long(self._numbers[1]),
            ctypes.c_int(_KEYCTL_READ),
            ctypes.c_int(serial),
            buf,
            ctypes.c_size_t(len(buf)),
        )
        data = buf.raw[: min(size, len(buf))]
        ctypes.memset(buf, 0, len(buf))
        return data

    def remove(self, description: str) -> None:
        assert self._numbers is not None
        while (serial := self._search(description)) is not None:
            try:
                self._call(ctypes.c_long(self._numbers[1]), ctypes.c_int(_KEYCTL_INVALIDATE), ctypes.c_int(serial))
            except OSError:
                self._call(ctypes.c_long(self._numbers[1]), ctypes.c_int(_KEYCTL_REVOKE), ctypes.c_int(serial))
