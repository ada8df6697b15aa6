"""Unix stream sockets and descriptor passing.

Sockets are close-on-exec by Python's default (PEP 446): no ``SOCK_CLOEXEC`` is needed. Descriptors received
with SCM_RIGHTS are close-on-exec from the start on Linux (``MSG_CMSG_CLOEXEC``); where that flag does not
exist (macOS) they are made non-inheritable right after ``recvmsg`` (vz starts its subprocesses with
``close_fds``, so none inherits one in between): see ``vz_core.platform.fdpass``. Windows has no Unix
sockets in Python 3.11: ``unix_socket`` does not exist there.
"""

from __future__ import annotations

import socket
import sys

__all__ = ["unix_socket"]

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
