"""The host end of a Machine's agent channel: opened without following links, its peer checked first.

A Machine must never be able to point the host at another Machine's agent. So the host side of every channel
lives in a directory of the Machine's record that no Machine can see (``MachinePaths.chan`` or the backend's
run directory); the socket is opened with ``O_PATH | O_NOFOLLOW`` (a symlink is refused, it is never followed)
and must be a socket; and before a single byte is sent, the kernel's credentials of the listening peer
(``SO_PEERCRED``) must name the process the record says serves this Machine (its agent, or the VM process
that owns the channel). Anything else is ``UnavailableError`` saying what was found.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import sys
from pathlib import Path

# Unix sockets only (vfkit's and qemu's agent channels): hyperv reaches its agent over AF_HYPERV instead, and
# vz_drivers._machine imports this module only where Unix sockets exist. mypy skips the rest for win32.
assert sys.platform != "win32", "the Unix-socket agent channel does not exist on Windows"

from vz_core.errors import UnavailableError  # noqa: E402 (after the host assertion)
from vz_core.platform.files import open_path_nofollow  # noqa: E402 (after the host assertion)
from vz_core.platform.peer import peer_credentials  # noqa: E402 (after the host assertion)

__all__ = ["open_agent_socket", "peer_pid"]


def peer_pid(sock: socket.socket) -> int:
    """The pid (in our pid namespace) of the process that listened on the other end of ``sock``."""
    return peer_credentials(sock)[0]


def _connect_nofollow(path: Path) -> socket.socket:
    try:
        fd = open_path_nofollow(path)
    except OSError as exc:
        raise UnavailableError(f"the agent channel {path} cannot be opened: {exc.strerror or exc}") from None
    if fd is None:
        return _connect_checked(path)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISSOCK(mode):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a socket"
            raise UnavailableError(f"the agent channel {path} is {kind}; refusing to use it")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Connecting through the O_PATH descriptor reaches exactly the inode checked above.
            sock.connect(f"/proc/self/fd/{fd}")
        except OSError as exc:
            sock.close()
            raise UnavailableError(f"cannot connect to the agent channel {path}: {exc.strerror or exc}") from None
        return sock
    finally:
        os.close(fd)


def _connect_checked(path: Path) -> socket.socket:
    """Where there is no ``O_PATH`` (macOS): lstat, then connect by path. The directory is private to the host,
    and the peer check that follows catches a swap between the two."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise UnavailableError(f"the agent channel {path} cannot be opened: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(mode):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a socket"
        raise UnavailableError(f"the agent channel {path} is {kind}; refusing to use it")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError as exc:
        sock.close()
        raise UnavailableError(f"cannot connect to the agent channel {path}: {exc.strerror or exc}") from None
    return sock


async def open_agent_socket(
    path: Path, expected_pid: int, *, what: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the Unix socket ``path`` if ``expected_pid`` listens on it; streams for ``AgentClient``.

    ``what`` names the Machine in errors. Raises ``UnavailableError`` when the path is missing, a link or not
    a socket, when nothing listens, and when another process than ``expected_pid`` does.
    """
    sock = await asyncio.to_thread(_connect_nofollow, path)
    try:
        found = peer_pid(sock)
        if found != expected_pid:
            raise UnavailableError(
                f"the agent channel of {what} is served by process {found}, not by the Machine's process "
                f"{expected_pid}; refusing to send it anything (recreate the Machine if this persists)",
                details={"path": str(path), "expected_pid": str(expected_pid), "peer_pid": str(found)},
            )
        sock.setblocking(False)
        return await asyncio.open_unix_connection(sock=sock)
    except BaseException:
        sock.close()
        raise
