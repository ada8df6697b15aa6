"""Advisory whole-file locks on an open descriptor.

POSIX: ``flock`` (shared or exclusive; released when every descriptor of the open file is closed, so a killed
process never leaves one behind). Windows: ``LockFileEx`` on the file's handle over the first byte (shared or
exclusive, released by the system when the handle closes); ``msvcrt.get_osfhandle`` turns the descriptor into
the handle.
"""

from __future__ import annotations

import sys

__all__ = ["lock_file", "unlock_file"]


if sys.platform == "win32":
    import ctypes
    import msvcrt
    from ctypes import wintypes

    _LOCKFILE_FAIL_IMMEDIATELY = 0x1
    _LOCKFILE_EXCLUSIVE_LOCK = 0x2
    _ERROR_LOCK_VIOLATION = 33
    _ERROR_IO_PENDING = 997

    class _Overlapped(ctypes.Structure):
        _fields_ = [
            ("Internal", ctypes.c_void_p),
            ("InternalHigh", ctypes.c_void_p),
            ("Offset", wintypes.DWORD),
            ("OffsetHigh", wintypes.DWORD),
            ("hEvent", wintypes.HANDLE),
        ]

    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    _LockFileEx = _kernel32.LockFileEx
    _LockFileEx.argtypes = [
        wintypes.HANDLE,
        wintypes.DWORD,
        wintypes.DWORD,
        wintypes.DWORD,
        wintypes.DWORD,
        ctypes.POINTER(_Overlapped),
    ]
    _LockFileEx.restype = wintypes.BOOL
    _UnlockFileEx = _kernel32.UnlockFileEx
    _UnlockFileEx.argtypes = [
        wintypes.HANDLE,
        wintypes.DWORD,
        wintypes.DWORD,
        wintypes.DWORD,
        ctypes.POINTER(_Overlapped),
    ]
    _UnlockFileEx.restype = wintypes.BOOL

    def lock_file(fd: int, *, exclusive: bool = True, blocking: bool = True) -> bool:
        """Lock the file open at ``fd``; False when ``blocking`` is off and another holder has it."""
        handle = msvcrt.get_osfhandle(fd)
        flags = (_LOCKFILE_EXCLUSIVE_LOCK if exclusive else 0) | (0 if blocking else _LOCKFILE_FAIL_IMMEDIATELY)
        overlapped = _Overlapped()
        if _LockFileEx(handle, flags, 0, 1, 0, ctypes.byref(overlapped)):
            return True
        err = ctypes.get_last_error()
        if not blocking and err in (_ERROR_LOCK_VIOLATION, _ERROR_IO_PENDING):
            return False
        raise ctypes.WinError(err)

    def unlock_file(fd: int) -> None:
        """Release the lock taken on ``fd`` (closing the descriptor releases it too)."""
        overlapped = _Overlapped()
        if not _UnlockFileEx(msvcrt.get_osfhandle(fd), 0, 1, 0, ctypes.byref(overlapped)):
            raise ctypes.WinError(ctypes.get_last_error())

else:
    import fcntl

    def lock_file(fd: int, *, exclusive: bool = True, blocking: bool = True) -> bool:
        """Lock the file open at ``fd``; False when ``blocking`` is off and another holder has it."""
        op = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, op)
        except BlockingIOError:
            return False
        return True

    def unlock_file(fd: int) -> None:
        """Release the lock taken on ``fd`` (closing the descriptor releases it too)."""
        fcntl.flock(fd, fcntl.LOCK_UN)
