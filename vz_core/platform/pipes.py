"""Windows: the daemon's local endpoint, a named pipe that admits only the user who runs the daemon.

The name is ``\\\\.\\pipe\\vz-<user>-<digest>`` (``pipe_name``): the user's name keeps two users' pipes apart
and the digest of the state home (``VZ_HOME``) two homes of one user. The name is not what keeps others out:
``\\Device\\NamedPipe`` is one namespace for the whole machine, and a pipe made with a null security
descriptor lets Everyone read it. What does:

- the pipe's security descriptor, ``D:P(A;;GA;;;<user SID>)(A;;GA;;;SY)`` (``owner_only_sddl``): a protected
  DACL granting the user and SYSTEM only (no inherited entries; Administrators, other users and anonymous
  callers get nothing);
- ``FILE_FLAG_FIRST_PIPE_INSTANCE`` on the daemon's first instance: if anyone already made a pipe of that name
  (a squatter waiting for our clients), creating ours fails instead of joining theirs;
- ``PIPE_REJECT_REMOTE_CLIENTS``: the pipe is never reachable over SMB from another machine;
- the daemon asks who connected (``GetNamedPipeClientProcessId``, then that process's token user SID:
  ``vz_core.platform.win32.pipe_client``) before it reads a byte, and closes any client whose SID is not its
  own (``client_refusal``); the CLI checks the server the same way (``GetNamedPipeServerProcessId``) before it
  sends a byte, and opens the pipe with ``SECURITY_SQOS_PRESENT | SECURITY_IDENTIFICATION`` so that a server
  can identify it but never act as it.

Followed: containers/podman ``pkg/machine/vmconfigs/machine_windows.go`` (a machine's endpoint is
``\\\\.\\pipe\\`` + a prefixed name) and the library podman listens with, microsoft/go-winio ``pipe.go``
(``ListenPipe``: SDDL to a security descriptor, the first instance created exclusively, remote clients
rejected, a new instance made for each accepted client); Microsoft's documentation of ``CreateNamedPipeW``,
"Named Pipe Security and Access Rights", ``ConvertStringSecurityDescriptorToSecurityDescriptorW``,
``GetNamedPipeClientProcessId``/``GetNamedPipeServerProcessId`` and ``CreateFileW``'s SQOS flags.

The pure parts (``pipe_name``, ``owner_only_sddl``, ``client_refusal``) are tested on every host; the rest
exists on Windows only and is proven by the Windows CI lane (tests/vz_core/platform/test_pipes.py).
"""

from __future__ import annotations

import os
import sys

__all__ = ["PIPE_PREFIX", "client_refusal", "is_sid", "owner_only_sddl", "pipe_name"]

PIPE_PREFIX = "\\\\.\\pipe\\"
"""Where every local named pipe lives (``\\\\.\\pipe\\``)."""
DIGEST_CHARS = 16
"""Hex characters of the state home's SHA-256 in a pipe's name (64 bits: two homes never share a pipe)."""
_USER_CHARS = 32


def _safe_user(user: str) -> str:
    kept = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in user)
    return kept[:_USER_CHARS] or "user"


def pipe_name(user: str, home: str) -> str:
    """The daemon pipe of ``user``'s state home ``home``: ``\\\\.\\pipe\\vz-<user>-<16 hex of sha256(home)>``.

    ``home`` is made absolute and case-folded the way Windows compares paths (``C:\\Users\\A`` and
    ``c:\\users\\a\\`` are one home); characters of ``user`` that a pipe name should not carry become ``_``.
    """
    import hashlib

    folded = os.path.normcase(os.path.abspath(home)).rstrip("\\/")
    if sys.platform != "win32":  # ntpath's rule where os.path is posixpath (the name is tested on every host)
        folded = folded.lower()
    digest = hashlib.sha256(folded.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_CHARS]
    return f"{PIPE_PREFIX}vz-{_safe_user(user)}-{digest}"


def is_sid(text: str) -> bool:
    """Whether ``text`` is the string form of a SID (``S-1-<authority>-<sub>...``, numbers only)."""
    parts = text.split("-")
    if len(parts) < 3 or parts[0] != "S" or parts[1] != "1":
        return False
    authority = parts[2]
    if authority.startswith("0x"):
        authority = authority[2:]
        ok = bool(authority) and all(c in "0123456789abcdefABCDEF" for c in authority)
    else:
        ok = authority.isdigit()
    return ok and len(parts) <= 3 + 15 and all(p.isdigit() and int(p) < 2**32 for p in parts[3:])


def owner_only_sddl(sid: str) -> str:
    """The security descriptor (SDDL) of the daemon's pipe: generic all to ``sid`` and to SYSTEM, nobody else.

    ``P`` protects the DACL from inherited entries. ``ValueError`` when ``sid`` is not a SID string (an
    SDDL built from anything else could grant what it should not).
    """
    if not is_sid(sid):
        raise ValueError(f"{sid!r} is not a SID (S-1-...)")
    return f"D:P(A;;GA;;;{sid})(A;;GA;;;SY)"


def client_refusal(client_pid: int, client_sid: str | None, own_sid: str) -> str | None:
    """Why the daemon refuses the client of its pipe (None: admitted).

    ``client_sid`` is the user SID of the client process's token, None when it could not be read (the
    process exited, or its token is not ours to query): unknown is refused, never taken as a match. Only
    our own SID is admitted; SYSTEM may open the pipe (its DACL cannot refuse the kernel's account) but is
    not a vz client.
    """
    if client_sid is None:
        return f"the client (pid {client_pid}) could not be identified"
    if client_sid != own_sid:
        return f"the client (pid {client_pid}) runs as {client_sid}, not as {own_sid}"
    return None


if sys.platform == "win32":
    import _winapi
    import ctypes
    from ctypes import wintypes

    from vz_core.platform.win32 import process_sid

    __all__ += ["PipeStream", "create_pipe", "current_sid", "open_pipe", "pipe_server_pid"]

    _PIPE_ACCESS_DUPLEX = 0x00000003
    _FILE_FLAG_FIRST_PIPE_INSTANCE = 0x00080000
    _FILE_FLAG_OVERLAPPED = 0x40000000
    _PIPE_TYPE_BYTE = 0x0
    _PIPE_READMODE_BYTE = 0x0
    _PIPE_WAIT = 0x0
    _PIPE_REJECT_REMOTE_CLIENTS = 0x8
    _PIPE_UNLIMITED_INSTANCES = 255
    _GENERIC_READ = 0x80000000
    _GENERIC_WRITE = 0x40000000
    _OPEN_EXISTING = 3
    _SECURITY_SQOS_PRESENT = 0x00100000
    _SECURITY_IDENTIFICATION = 0x00010000
    _SDDL_REVISION_1 = 1
    _INVALID_HANDLE_VALUE = wintypes.HANDLE(-1).value
    _ERROR_PIPE_BUSY = 231
    _BUFFER = 256 * 1024
    _BUSY_WAIT_MS = 2000

    class _SecurityAttributes(ctypes.Structure):
        _fields_ = [
            ("nLength", wintypes.DWORD),
            ("lpSecurityDescriptor", ctypes.c_void_p),
            ("bInheritHandle", wintypes.BOOL),
        ]

    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    _advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)
    _CreateNamedPipeW = _kernel32.CreateNamedPipeW
    _CreateNamedPipeW.argtypes = [
        wintypes.LPCWSTR,
        wintypes.DWORD,
        wintypes.DWORD,
        wintypes.DWORD,
        wintypes.DWORD,
        wintypes.DWORD,
        wintypes.DWORD,
        ctypes.POINTER(_SecurityAttributes),
    ]
    _CreateNamedPipeW.restype = wintypes.HANDLE
    _ConvertSddl = _advapi32.ConvertStringSecurityDescriptorToSecurityDescriptorW
    _ConvertSddl.argtypes = [
        wintypes.LPCWSTR,
        wintypes.DWORD,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(wintypes.ULONG),
    ]
    _ConvertSddl.restype = wintypes.BOOL
    _LocalFree = _kernel32.LocalFree
    _LocalFree.argtypes = [ctypes.c_void_p]
    _LocalFree.restype = ctypes.c_void_p
    _GetNamedPipeServerProcessId = _kernel32.GetNamedPipeServerProcessId
    _GetNamedPipeServerProcessId.argtypes = [wintypes.HANDLE, ctypes.POINTER(wintypes.ULONG)]
    _GetNamedPipeServerProcessId.restype = wintypes.BOOL

    def current_sid() -> str:
        """The user SID of this process's token."""
        return process_sid(os.getpid())

    def create_pipe(name: str, sddl: str, *, first: bool) -> int:
        """A new overlapped, byte-mode instance of pipe ``name`` with security descriptor ``sddl``.

        ``first``: the instance that creates the name (``FILE_FLAG_FIRST_PIPE_INSTANCE``): ``PermissionError``
        when a pipe of that name exists already (another daemon, or someone squatting on the name).
        """
        descriptor = ctypes.c_void_p()
        if not _ConvertSddl(sddl, _SDDL_REVISION_1, ctypes.byref(descriptor), None):
            raise ctypes.WinError(ctypes.get_last_error())
        try:
            attributes = _SecurityAttributes(ctypes.sizeof(_SecurityAttributes), descriptor, False)
            mode = _PIPE_ACCESS_DUPLEX | _FILE_FLAG_OVERLAPPED | (_FILE_FLAG_FIRST_PIPE_INSTANCE if first else 0)
            handle = _CreateNamedPipeW(
                name,
                mode,
                _PIPE_TYPE_BYTE | _PIPE_READMODE_BYTE | _PIPE_WAIT | _PIPE_REJECT_REMOTE_CLIENTS,
                _PIPE_UNLIMITED_INSTANCES,
                _BUFFER,
                _BUFFER,
                0,
                ctypes.byref(attributes),
            )
            if handle is None or handle == _INVALID_HANDLE_VALUE:
                raise ctypes.WinError(ctypes.get_last_error())
            return int(handle)
        finally:
            _LocalFree(descriptor)

    def pipe_server_pid(handle: int) -> int:
        """The process id of the server end of the connected pipe ``handle``."""
        pid = wintypes.ULONG()
        if not _GetNamedPipeServerProcessId(handle, ctypes.byref(pid)):
            raise ctypes.WinError(ctypes.get_last_error())
        return int(pid.value)

    class PipeStream:
        """The client end of a connected pipe, blocking, with the calls the local wire's ``Channel`` makes
        (``recv``, ``recv_into``, ``sendall``, ``fileno``, ``close``). A closed server end reads as EOF."""

        def __init__(self, handle: int) -> None:
            self.handle = handle

        def fileno(self) -> int:
            """The pipe's handle."""
            return self.handle

        def recv(self, n: int) -> bytes:
            """Up to ``n`` bytes; ``b""`` once the server closed its end."""
            try:
                data, _ = _winapi.ReadFile(self.handle, n, False)
            except BrokenPipeError:
                return b""
            return data

        def recv_into(self, buffer: memoryview) -> int:
            """Read into ``buffer``; the byte count (0 at EOF)."""
            data = self.recv(len(buffer))
            buffer[: len(data)] = data
            return len(data)

        def sendall(self, data: bytes | memoryview) -> None:
            """Write all of ``data``."""
            view = memoryview(data)
            while view:
                written, _ = _winapi.WriteFile(self.handle, view, False)
                view = view[written:]

        def close(self) -> None:
            """Close the handle (idempotent)."""
            if self.handle:
                handle, self.handle = self.handle, 0
                _winapi.CloseHandle(handle)

    def open_pipe(name: str) -> PipeStream | None:
        """A connected client end of pipe ``name``, or None when no such pipe exists (no daemon listens).

        Waits (bounded) while every instance is busy. The caller checks who serves it (``pipe_server_pid``).
        """
        for _ in range(10):
            try:
                handle = _winapi.CreateFile(
                    name,
                    _GENERIC_READ | _GENERIC_WRITE,
                    0,
                    0,
                    _OPEN_EXISTING,
                    _SECURITY_SQOS_PRESENT | _SECURITY_IDENTIFICATION,
                    0,
                )
            except FileNotFoundError:
                return None
            except OSError as exc:
                if getattr(exc, "winerror", None) != _ERROR_PIPE_BUSY:
                    raise
                try:
                    _winapi.WaitNamedPipe(name, _BUSY_WAIT_MS)
                except OSError:
                    pass
                continue
            return PipeStream(handle)
        raise TimeoutError(f"every instance of {name} stayed busy")
