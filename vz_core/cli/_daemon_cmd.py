"""`vz daemon start | stop | status | logs | run`: the per-user vz daemon of this state home (docs/daemon.md).

The work is done by ``vz_core.daemon`` (connect with on-demand start, stop, the pid file, the log).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from vz_core.wire import NOT_FOUND

__all__ = ["daemon_parser", "run_daemon_command"]

NOT_RUNNING = NOT_FOUND


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise _Usage(f"{message} (see `{self.prog} --help`)")


class _Usage(Exception):
    pass


def daemon_parser() -> argparse.ArgumentParser:
    """The parser of `vz daemon` (its sub-commands and flags; shell completion reads them)."""
    return _parser()


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vz daemon",
        description="The vz daemon: one per user and state directory ($VZ_HOME), started on demand by any vz "
        "command, exiting after $VZ_DAEMON_IDLE_TIMEOUT seconds (default 900) with no operation in flight.",
    )
    sub = parser.add_subparsers(dest="action", metavar="{start,stop,status,logs,run}")
    sub.required = True
    start = sub.add_parser("start", help="start the daemon in the background (no-op when it runs)")
    start.add_argument("--json", action="store_true")
    stop = sub.add_parser("stop", help="stop it (operations in flight get a grace period, then are cancelled)")
    stop.add_argument("--json", action="store_true")
    status = sub.add_parser("status", help="pid, version, socket, uptime, plugins and operations in flight")
    status.add_argument("--json", action="store_true")
    logs = sub.add_parser("logs", help="print the end of the daemon's log")
    logs.add_argument("-n", "--lines", type=int, default=50, metavar="N", help="lines from the end (default 50)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing what is appended (Ctrl-C ends)")
    sub.add_parser("run", help="run the daemon in the foreground (its log also goes to stderr)")
    return parser


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    return f"{s // 3600}h {(s % 3600) // 60}m"


def _fail(exc: Any, json_mode: bool, action: str) -> int:
    if json_mode:
        sys.stdout.write(json.dumps({"event": "error", "command": f"daemon {action}", "error": exc.to_wire()}) + "\n")
    sys.stderr.write(f"vz daemon {action}: error: {exc}\n")
    code: int = exc.exit_code
    return code


def _start(json_mode: bool) -> int:
    from vz_core.daemon import connect

    before = _running_pid()
    with connect(autostart=True) as conn:
        hello = conn.hello
        paths = conn.paths
    started = before != hello.get("pid")
    if json_mode:
        doc = {"pid": hello.get("pid"), "version": hello.get("version"), "socket": paths.socket, "started": started}
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        verb = "started" if started else "already running:"
        sys.stdout.write(f"vz daemon {verb} pid {hello.get('pid')} (vz {hello.get('version')}) on {paths.socket}\n")
    return 0


def _running_pid() -> int | None:
    from vz_core.daemon import daemon_paths, live_daemon

    record = live_daemon(daemon_paths())
    return record["pid"] if record else None


def _stop(json_mode: bool) -> int:
    from vz_core.daemon import daemon_paths, stop_daemon

    pid = stop_daemon()
    if json_mode:
        sys.stdout.write(json.dumps({"stopped": pid}) + "\n")
    elif pid is None:
        sys.stdout.write(f"no vz daemon runs for {daemon_paths().home}\n")
    else:
        sys.stdout.write(f"stopped the vz daemon (pid {pid})\n")
    return 0


def _status(json_mode: bool) -> int:
    from vz_core.daemon import DaemonError, connect, daemon_paths, read_pid_file

    paths = daemon_paths()
    try:
        conn = connect(autostart=False)
    except DaemonError as exc:
        if exc.code != "UNAVAILABLE":
            raise
        record = read_pid_file(paths)
        stale = f" (stale pid file: pid {record['pid']} is not a running vz daemon)" if record else ""
        if json_mode:
            sys.stdout.write(json.dumps({"running": False, "home": paths.home, "stale_pid_file": bool(record)}) + "\n")
        else:
            sys.stdout.write(f"no vz daemon runs for {paths.home}{stale}\n")
        return NOT_RUNNING
    with conn:
        hello = conn.hello
        try:
            status = conn.request("System.Status")
        except DaemonError as exc:  # a daemon without the status method: what the hello and pid file say
            status = {**(read_pid_file(paths) or {}), **hello, "status_error": exc.message}
    status = {"running": True, "socket": paths.socket, "home": paths.home, **status}
    if json_mode:
        sys.stdout.write(json.dumps(status, sort_keys=True) + "\n")
        return 0
    out = [
        f"vz daemon pid {status.get('pid')}  vz {status.get('version')}  "
        + (f"up {_duration(status['uptime_seconds'])}" if "uptime_seconds" in status else "")
    ]
    out.append(f"  socket      {status.get('socket')}")
    out.append(f"  home        {paths.home}")
    out.append(f"  log         {paths.log_file}")
    if "busy" in status:
        out.append(f"  busy        {'yes' if status['busy'] else 'no'}")
    plugins = status.get("plugins")
    if isinstance(plugins, list):
        out.append(f"  plugins     {len(plugins)}")
        for p in plugins:
            pid = p.get("pid") or "-"
            out.append(
                f"    {p.get('name', '?'):<14} {p.get('state', '?'):<8} pid {pid}  in flight {p.get('in_flight', 0)}"
            )
    operations = status.get("operations")
    if isinstance(operations, list):
        out.append(f"  operations  {len(operations)}")
        for op in operations:
            where = op.get("environment") or op.get("environment_id") or ""
            out.append(f"    {op.get('method', '?'):<22} since {op.get('started', '?')}  {where}".rstrip())
    if "status_error" in status:
        out.append(f"  (System.Status: {status['status_error']})")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _logs(lines: int, follow: bool) -> int:
    from vz_core.daemon import daemon_paths

    paths = daemon_paths()
    chunks: list[bytes] = []
    for name in (paths.log_file + ".1", paths.log_file):
        try:
            with open(name, "rb") as f:
                chunks.append(f.read())
        except FileNotFoundError:
            continue
    if not chunks:
        sys.stderr.write(f"vz daemon logs: no log yet at {paths.log_file} (no daemon has run for {paths.home})\n")
        return NOT_RUNNING
    text = b"".join(chunks).decode("utf-8", "replace").splitlines()
    sys.stdout.write("".join(line + "\n" for line in text[-lines:] if lines > 0))
    sys.stdout.flush()
    if not follow:
        return 0
    f = open(paths.log_file, "rb")  # noqa: SIM115 - reopened after a rotation
    try:
        f.seek(0, os.SEEK_END)
        while True:
            data = f.read()
            if data:
                sys.stdout.write(data.decode("utf-8", "replace"))
                sys.stdout.flush()
                continue
            time.sleep(0.2)
            try:
                rotated = os.stat(paths.log_file).st_ino != os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                continue
            if rotated:
                f.close()
                f = open(paths.log_file, "rb")  # noqa: SIM115
    except KeyboardInterrupt:
        return 0
    finally:
        f.close()


def _run() -> int:
    from vz_core.daemon import run_daemon

    return run_daemon(echo=True)


def run_daemon_command(argv: list[str]) -> int:
    """`vz daemon ARGS`: the exit code (0; 2 bad usage; 3 not running; 69 unavailable; others per error)."""
    from vz_core.daemon import DaemonError

    try:
        args = _parser().parse_args(argv)
    except _Usage as exc:
        sys.stderr.write(f"vz daemon: error: {exc}\n")
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    json_mode = bool(getattr(args, "json", False))
    try:
        if args.action == "start":
            return _start(json_mode)
        if args.action == "stop":
            return _stop(json_mode)
        if args.action == "status":
            return _status(json_mode)
        if args.action == "logs":
            return _logs(args.lines, args.follow)
        return _run()
    except DaemonError as exc:
        return _fail(exc, json_mode, args.action)
