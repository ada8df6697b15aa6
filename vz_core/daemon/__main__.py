"""``python -m vz_core.daemon [--detach] [--ready-fd N]``: run the vz daemon of ``$VZ_HOME`` (the state home).

Clients start it this way on demand (``--detach``: the process forks once and the parent exits at once, so
the daemon is nobody's child; it already runs in a new session with its stdio on the log). ``--ready-fd``
names a pipe that gets ``ready <pid>`` or ``error <message>`` (Windows: ``--ready-handle H``, the
inherited handle of that pipe; there ``--detach`` does not fork: the client started this process
detached). ``vz daemon run`` is the same in the
foreground. The fork happens before anything heavy is imported.
"""

from __future__ import annotations

import os
import sys


def _parse(argv: list[str]) -> tuple[bool, int | None]:
    detach, ready_fd = False, None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--detach":
            detach = True
        elif arg == "--ready-fd" and args and args[0].isdigit():
            ready_fd = int(args.pop(0))
        elif arg == "--ready-handle" and args and args[0].isdigit() and sys.platform == "win32":
            from vz_core.platform.detach import ready_fd_from_handle

            ready_fd = ready_fd_from_handle(int(args.pop(0)))
        elif arg in ("-h", "--help"):
            sys.stdout.write((__doc__ or "").strip() + "\n")
            raise SystemExit(0)
        else:
            sys.stderr.write(f"python -m vz_core.daemon: error: unexpected argument {arg!r} (see --help)\n")
            raise SystemExit(2)
    return detach, ready_fd


def main(argv: list[str] | None = None) -> int:
    """Run the daemon; the exit status."""
    detach, ready_fd = _parse(sys.argv[1:] if argv is None else argv)
    if detach and sys.platform != "win32":  # Windows: the client started it detached already (no fork there)
        if os.fork() != 0:
            os._exit(0)
    from vz_core.daemon._server import run_daemon

    return run_daemon(ready_fd=ready_fd, stdio_to_log=detach)


if __name__ == "__main__":
    sys.exit(main())
