"""Windows: who is the client of a named pipe (its process id and that process's user SID).

``pipe_client(handle)`` asks ``GetNamedPipeClientProcessId`` for the client's pid, opens the process
(``PROCESS_QUERY_LIMITED_INFORMATION``), reads its token's ``TokenUser`` and renders the SID as a string
(``S-1-5-21-...``). ``sid_to_string`` is the rendering from the SID's bytes (pure logic, tested on every host
with the bytes Windows hands back); on other hosts ``pipe_client`` does not exist.
"""

from __future__ import annotations

import struct
import sys

__all__ = ["pipe_client", "sid_to_string"]


def sid_to_string(raw: bytes) -> str:
    """The string form of a binary SID (revision, sub-authority count, 48-bit big-endian authority, then
    little-endian 32-bit sub-authorities), as ``ConvertSidToStringSidW`` renders it. ``ValueError`` when the
    bytes are not a SID."""
    if len(raw) < 8:
        raise ValueError(f"a SID has at least 8 bytes, not {len(raw)}")
    revision, count = raw[0], raw[1]
    if revision != 1 or len(raw) < 8 + 4 * count:
        raise ValueError(f"not a SID (revision {revision}, {count} sub-authorities in {len(raw)} bytes)")
    authority = int.from_bytes(raw[2:8], "big")
    subs = struct.unpack_from(f"<{count}I", raw, 8)
    shown = str(authority) if authority < 2**32 else f"0x{authority:012X}"
    return "-".join(["S", str(revision), shown, *(str(s) for s in subs)])


if sys.platform == "win32":
    import ctypes
    from ctypes import wintypes

    _PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
    _TOKEN_QUERY = 0x0008
    _TOKEN_USER_CLASS = 1
    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    _advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)
    _GetNamedPipeClientProcessId = _kernel32.GetNamedPipeClientProcessId
    _GetNamedPipeClientProcessId.argtypes = [wintypes.HANDLE, ctypes.POINTER(wintypes.ULONG)]
    _GetNamedPipeClientProcessId.restype = wintypes.BOOL
    _OpenProcess = _kernel32.OpenProcess
    _OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
    _OpenProcess.restype = wintypes.HANDLE
    _CloseHandle = _kernel32.CloseHandle
    _CloseHandle.argtypes = [wintypes.HANDLE]
    _OpenProcessToken = _advapi32.OpenProcessToken
    _OpenProcessToken.argtypes = [wintypes.HANDLE, wintypes.DWORD, ctypes.POINTER(wintypes.HANDLE)]
    _OpenProcessToken.restype = wintypes.BOOL
    _GetTokenInformation = _advapi32.GetTokenInformation
    _GetTokenInformation.argtypes = [
        wintypes.HANDLE,
        ctypes.c_int,
        ctypes.c_void_p,
        wintypes.DWORD,
        ctypes.POINTER(wintypes.DWORD),
    ]
    _GetTokenInformation.restype = wintypes.BOOL
    _GetLengthSid = _advapi32.GetLengthSid
    _GetLengthSid.argtypes = [ctypes.c_void_p]
    _GetLengthSid.restype = wintypes.DWORD

    def _check(ok: object) -> None:
        if not ok:
            raise ctypes.WinError(ctypes.get_last_error())

    def process_sid(pid: int) -> str:
        """The user SID of process ``pid``'s token."""
        process = _OpenProcess(_PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
        _check(process)
        try:
            token = wintypes.HANDLE()
            _check(_OpenProcessToken(process, _TOKEN_QUERY, ctypes.byref(token)))
            try:
                size = wintypes.DWORD()
                _GetTokenInformation(token, _TOKEN_USER_CLASS, None, 0, ctypes.byref(size))
                buf = ctypes.create_string_buffer(size.value)
                _check(_GetTokenInformation(token, _TOKEN_USER_CLASS, buf, size, ctypes.byref(size)))
                sid_pointer = ctypes.c_void_p.from_buffer(buf).value  # TOKEN_USER.User.Sid
                if not sid_pointer:
                    raise OSError(f"process {pid}'s token names no user")
                length = _GetLengthSid(sid_pointer)
                return sid_to_string(ctypes.string_at(sid_pointer, length))
            finally:
                _CloseHandle(token)
        finally:
            _CloseHandle(process)

    def pipe_client(handle: int) -> tuple[int, str]:
        """(pid, user SID) of the client of the connected named pipe ``handle``."""
        pid = wintypes.ULONG()
        _check(_GetNamedPipeClientProcessId(handle, ctypes.byref(pid)))
        return int(pid.value), process_sid(int(pid.value))
