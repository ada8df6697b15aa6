"""Run one command to completion: its exit code, wall time and peak RSS (``wait4``). Standard library only.

Imported by ``benchmarks._common`` (``run_timed``), and run as a script by ``benchmarks._spawner`` (a fresh
``python -I -S``): then it reads one JSON request per stdin line, runs each command on a thread of its own, and
writes one JSON reply per command on stdout. It ends when its stdin closes and every command has been reaped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False  # not `typing`: the spawner's own size is the floor of every peak it reports
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

__all__ = ["main", "wait_timed"]


def wait_timed(
    argv: Sequence[str], *, cwd: str, env: Mapping[str, str], log: str, timeout: float
) -> tuple[int, float, int]:
    """Start ``argv`` (stdout and stderr to ``log``, stdin /dev/null), kill it after ``timeout`` seconds, reap it:
    (exit code, seconds from start to reap, peak RSS in KiB)."""
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, seconds, usage.ru_maxrss


def main() -> None:
    lock = threading.Lock()

    def reply(doc: dict[str, Any]) -> None:
        with lock:
            sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()

    def job(req: dict[str, Any]) -> None:
        try:
            code, seconds, rss = wait_timed(
                req["argv"], cwd=req["cwd"], env=req["env"], log=req["log"], timeout=req["timeout"]
            )
            reply({"id": req["id"], "returncode": code, "seconds": seconds, "max_rss_kib": rss})
        except Exception as exc:
            reply({"id": req["id"], "error": f"{type(exc).__name__}: {exc}"})

    for line in sys.stdin:
        threading.Thread(target=job, args=(json.loads(line),)).start()  # not daemon: exit waits for the commands


if __name__ == "__main__":
    main()
