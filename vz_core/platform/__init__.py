"""The platform layer: every call that differs between Linux, macOS and Windows, behind functions named for
what vz needs, with one implementation per host (docs/architecture.md, "The platform layer").

Each module branches on ``sys.platform`` the way mypy understands (``if sys.platform == "win32":``), so each
host's branch is type-checked for that host (``mypy --platform darwin|win32`` in scripts/test.sh). Only this
package and the Linux-only packages (``vz_drivers.linux_native``, ``vz_core.network``) may import OS-specific
modules (``fcntl``, ``termios``, ``msvcrt``, ``_winapi``, ...) or use Linux-only ``os``/``socket`` attributes;
tests/test_platform_imports.py enforces it. Standard library only: the CLI imports it.

The layer is one module per concern, imported by what needs it (so the CLI pays only for what it uses):

- ``peer``: peers of local connections: ``peer_credentials`` (Linux ``SO_PEERCRED``, macOS ``LOCAL_PEERCRED`` +
  ``LOCAL_PEERPID``), ``parse_xucred``; Windows named pipes: ``win32.pipe_client``
  (win32 only), ``win32.sid_to_string``;
- ``sockets``: sockets and descriptor passing: ``unix_socket``, ``FD_PASSING``, ``RECVMSG_FLAGS``, ``own_received``;
- ``locks``: file locks: ``lock_file``/``unlock_file``;
- ``process``: ``ExitWatch`` (pidfd, kqueue, process handle), ``exit_event_matches``; ``detach``: detaching the daemon
  and its ready line (``detach_options``, ``ready_handoff``, ``read_line``);
- ``pipes``: the Windows daemon endpoint: ``pipe_name``, ``owner_only_sddl``, ``client_refusal``; on Windows
  ``create_pipe``, ``open_pipe``, ``PipeStream``, ``pipe_server_pid``, ``current_sid``;
- ``terminal``: terminals: ``RawTerminal``, ``set_window_size``, ``WINDOW_SIGNAL``;
- ``keyring``: secrets at rest: ``Keyring``/``KEYRING`` (Linux kernel keyring; memory only elsewhere);
- ``files``: pipe sizes, sealed memfds, xattrs, long socket paths (``PIPE_RESIZABLE``, ``SEALED_MEMFD``, ``XATTRS``).
"""

from __future__ import annotations

import sys

__all__ = ["HOST", "LINUX"]

HOST = "win32" if sys.platform == "win32" else "darwin" if sys.platform == "darwin" else "linux"
"""This host's kind: ``linux``, ``darwin`` or ``win32``."""
LINUX = sys.platform == "linux"
"""Whether the Linux-only parts (linux_native, route domains, the kernel keyring) exist on this host."""
