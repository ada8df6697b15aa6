"""Descriptor passing over a Unix socket (SCM_RIGHTS).

Descriptors received are close-on-exec from the start on Linux (``MSG_CMSG_CLOEXEC``); where that flag does
not exist (macOS) ``own_received`` makes them non-inheritable right after ``recvmsg`` (vz starts its
subprocesses with ``close_fds``, so none inherits one in between). Windows has no SCM_RIGHTS: ``FD_PASSING``
is False there, and the CLI and the daemon copy the streams as binary frames of the local wire instead (the
path a terminal's streams take on every host), chosen explicitly.
"""

from __future__ import annotations

import _socket  # not `socket`: the CLI's hot path has none of its enums
import os
import sys

__all__ = ["FD_PASSING", "RECVMSG_FLAGS", "own_received"]

FD_PASSING = sys.platform != "win32"
"""Whether descriptors can be handed to another process over a local socket (SCM_RIGHTS)."""

if sys.platform == "linux":
    RECVMSG_FLAGS = _socket.MSG_CMSG_CLOEXEC
else:
    RECVMSG_FLAGS = 0


def own_received(fds: list[int]) -> None:
    """Make descriptors just received with SCM_RIGHTS close-on-exec (already so on Linux: nothing to do)."""
    if sys.platform != "linux":
        for fd in fds:
            os.set_inheritable(fd, False)
