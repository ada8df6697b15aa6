"""Unix stream sockets and descriptor passing.

Sockets are close-on-exec by Python's default (PEP 446): no ``SOCK_CLOEXEC`` is needed. Descriptors received
with SCM_RIGHTS are close-on-exec from the start on Linux (``MSG_CMSG_CLOEXEC``); where that flag does not
exist (macOS) they are made non-inheritable right after ``recvmsg`` (vz starts its subprocesses with
``close_fds``, so none inherits one in between). Windows has no SCM_RIGHTS: ``FD_PASSING`` is False there and
callers take the copying path (binary frames), chosen explicitly.
"""

from __future__ import annotations

import os
import socket
import sys

__all__ = ["FD_PASSING", "RECVMSG_FLAGS", "own_received", "unix_socket"]

FD_PASSING = sys.platform != "win32"
"""Whether descriptors can be handed to another process over a local socket (SCM_RIGHTS)."""

if sys.platform == "linux":
    RECVMSG_FLAGS = socket.MSG_CMSG_CLOEXEC
else:
    RECVMSG_FLAGS = 0


def own_received(fds: list[int]) -> None:
    """Make descriptors just received with SCM_RIGHTS close-on-exec (already so on Linux)."""
    if sys.platform != "linux":
        for fd in fds:
            os.set_inheritable(fd, False)


if sys.platform == "linux":

    def unix_socket(*, nonblocking: bool = False) -> socket.socket:
        """A new Unix stream socket (close-on-exec; non-blocking from its creation with ``nonblocking``)."""
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | (socket.SOCK_NONBLOCK if nonblocking else 0))

elif sys.platform != "win32":

    def unix_socket(*, nonblocking: bool = False) -> socket.socket:
        """A new Unix stream socket (close-on-exec)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if nonblocking:
            sock.setblocking(False)
        return sock
