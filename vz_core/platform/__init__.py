"""The platform layer: every call that differs between Linux, macOS and Windows, behind functions named for
what vz needs, with one implementation per host (docs/architecture.md, "The platform layer").

Each module branches on ``sys.platform`` the way mypy understands (``if sys.platform == "win32":``), so each
host's branch is type-checked for that host (``mypy --platform darwin|win32`` in scripts/test.sh). Only this
package and the Linux-only packages (``vz_drivers.linux_native``, ``vz_core.network``) may import OS-specific
modules (``fcntl``, ``termios``, ``msvcrt``, ``_winapi``, ...) or use Linux-only ``os``/``socket`` attributes;
tests/test_platform_imports.py enforces it. Standard library only: the CLI imports it.

- peers of local connections: ``peer_credentials`` (Linux ``SO_PEERCRED``, macOS ``LOCAL_PEERCRED`` +
  ``LOCAL_PEERPID``), ``parse_xucred``; Windows named pipes: ``vz_core.platform.pipe_client`` (win32 only);
- sockets and descriptor passing: ``unix_socket``, ``FD_PASSING``, ``RECVMSG_FLAGS``, ``own_received``;
- file locks: ``lock_file``/``unlock_file``;
- processes: ``ExitWatch`` (pidfd, kqueue, process handle), ``exit_event_matches``; detaching the daemon:
  ``detach_flags``;
- terminals: ``RawTerminal``, ``set_window_size``, ``WINDOW_SIGNAL``;
- secrets at rest: ``Keyring``/``KEYRING`` (Linux kernel keyring; memory only elsewhere);
- files: pipe sizes, sealed memfds, xattrs, long socket paths (``PIPE_RESIZABLE``, ``SEALED_MEMFD``, ``XATTRS``).
"""

from __future__ import annotations

import sys

from vz_core.platform._detach import detach_options
from vz_core.platform._files import (
    PIPE_RESIZABLE,
    SEALED_MEMFD,
    XATTRS,
    get_pipe_size,
    long_socket_path,
    memfd_sealed_copy,
    seal_memfd,
    set_pipe_size,
    set_xattr,
)
from vz_core.platform._keyring import KEYRING, Keyring
from vz_core.platform._locks import lock_file, unlock_file
from vz_core.platform._peer import PeerCredentials, parse_ucred, parse_xucred
from vz_core.platform._process import ExitWatch, exit_event_matches
from vz_core.platform._sockets import FD_PASSING, RECVMSG_FLAGS, own_received
from vz_core.platform._terminal import WINDOW_SIGNAL, RawTerminal, set_window_size
from vz_core.platform._win32 import sid_to_string

if sys.platform == "win32":
    from vz_core.platform._win32 import pipe_client
else:
    from vz_core.platform._peer import peer_credentials
    from vz_core.platform._sockets import unix_socket

HOST = "win32" if sys.platform == "win32" else "darwin" if sys.platform == "darwin" else "linux"
"""This host's kind: ``linux``, ``darwin`` or ``win32``."""
LINUX = sys.platform == "linux"
"""Whether the Linux-only parts (linux_native, route domains, the kernel keyring) exist on this host."""

__all__ = [
    "FD_PASSING",
    "HOST",
    "KEYRING",
    "LINUX",
    "PIPE_RESIZABLE",
    "RECVMSG_FLAGS",
    "SEALED_MEMFD",
    "WINDOW_SIGNAL",
    "XATTRS",
    "ExitWatch",
    "Keyring",
    "PeerCredentials",
    "RawTerminal",
    "detach_options",
    "exit_event_matches",
    "get_pipe_size",
    "lock_file",
    "long_socket_path",
    "memfd_sealed_copy",
    "own_received",
    "parse_ucred",
    "parse_xucred",
    "peer_credentials",
    "pipe_client",
    "seal_memfd",
    "set_pipe_size",
    "set_window_size",
    "set_xattr",
    "sid_to_string",
    "unix_socket",
    "unlock_file",
]
