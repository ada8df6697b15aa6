"""Starting the daemon detached from the command that starts it, and its ready signal.

POSIX: a new session (``start_new_session``: no controlling terminal, no signals of the caller's process
group); the launched process forks the daemon and exits at once (``LAUNCHER_EXITS``). Windows has no
``fork``/``setsid``: the launched process is the daemon itself, in a new process group and without a console
(``CREATE_NEW_PROCESS_GROUP | DETACHED_PROCESS``), so Ctrl-C in the caller's console never reaches it.

The ready signal is one line (``ready <pid>`` or ``error <message>``) on a pipe the client made
(``ready_handoff``): POSIX hands the write end over as a descriptor (``pass_fds``, ``--ready-fd N``); Windows
as an inheritable handle that is the only handle the child inherits besides its stdio
(``STARTUPINFO.lpAttributeList["handle_list"]``, ``--ready-handle H``), turned back into a descriptor in the
daemon (``ready_fd_from_handle``). ``read_line`` waits for the line with a deadline (``select`` on POSIX; a
reading thread on Windows, where ``select`` takes sockets only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

__all__ = ["LAUNCHER_EXITS", "detach_options", "read_line", "ready_handoff"]

LAUNCHER_EXITS = sys.platform != "win32"
"""Whether the process a client launches exits once the daemon is forked (POSIX), or is the daemon (Windows)."""


def detach_options() -> dict[str, Any]:
    """Keyword arguments for ``subprocess.Popen`` that start a process detached from ours."""
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP | subprocess.DETACHED_PROCESS}
    return {"start_new_session": True}


def ready_handoff(write_fd: int) -> tuple[list[str], dict[str, Any]]:
    """The daemon's arguments and ``Popen`` keyword arguments that give it ``write_fd`` (and nothing else)."""
    if sys.platform == "win32":
        import msvcrt

        handle = msvcrt.get_osfhandle(write_fd)
        os.set_handle_inheritable(handle, True)
        info = subprocess.STARTUPINFO(lpAttributeList={"handle_list": [handle]})
        return ["--ready-handle", str(handle)], {"startupinfo": info}
    return ["--ready-fd", str(write_fd)], {"pass_fds": (write_fd,)}


def read_line(read_fd: int, deadline: float) -> bytes:
    """Bytes from ``read_fd`` up to a newline or EOF; ``TimeoutError`` once ``time.monotonic()`` passes
    ``deadline`` first."""
    import time

    if sys.platform == "win32":
        import threading

        got: list[bytes] = []

        def pump() -> None:
            line = b""
            try:
                while b"\n" not in line:
                    chunk = os.read(read_fd, 4096)
                    if not chunk:
                        break
                    line += chunk
            except OSError:
                pass
            got.append(line)

        reader = threading.Thread(target=pump, name="vz-daemon-ready", daemon=True)
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()))
        if not got:
            raise TimeoutError("no ready line before the deadline")
        return got[0]
    import select

    line = b""
    while b"\n" not in line:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no ready line before the deadline")
        ready, _, _ = select.select([read_fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        line += chunk
    return line


if sys.platform == "win32":
    __all__ += ["ready_fd_from_handle"]

    def ready_fd_from_handle(handle: int) -> int:
        """The daemon's descriptor for the ready pipe's handle it inherited (``--ready-handle``)."""
        import msvcrt

        return msvcrt.open_osfhandle(handle, os.O_WRONLY)
