"""A small process that starts the benchmarks' commands, so that a command's peak RSS (``wait4``) is its own.

Linux reports a child's peak RSS as at least the resident size its parent had when it forked it: the forked
(or, with vfork, shared) address space's high-water mark is taken into the child's at ``exec``. A benchmark
process that has run other benchmarks holds over 100 MiB (B4 moves 256 MiB, gRPC and the peers are loaded), so
every `vz` it started directly reported over 100 MiB (33-38 MiB when B6 ran alone: still the benchmark
process's size), where a `vz` command's own peak is about 13 MiB. Resetting the parent's own mark
(``/proc/self/clear_refs``) only lowers it to the parent's current size. The spawner is a fresh interpreter
(``-I -S``, standard library only, about 11 MiB): the commands it starts inherit only its size, which is below
any `vz` command's (B6 reports it as the floor).

One spawner serves many commands at once (B6 starts 200 together): it runs ``benchmarks/_timed.py`` as a script,
which takes a JSON line per command on its stdin, starts and waits for each on a thread of its own, and answers
a JSON line per command on its stdout with the exit code, the wall time from start to reap, and the peak RSS in
KiB.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

__all__ = ["Spawner"]

_SCRIPT = Path(__file__).with_name("_timed.py")


class Spawner:
    """The spawner process and its pending commands; ``close()`` ends it (after its commands are reaped)."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._next = 0
        self._reader = threading.Thread(target=self._read, name="bench-spawner", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            doc = json.loads(line)
            with self._lock:
                future = self._pending.pop(int(doc["id"]))
            future.set_result(doc)
        with self._lock:  # the spawner ended: nothing more will be answered
            pending, self._pending = list(self._pending.values()), {}
        for future in pending:
            future.set_exception(RuntimeError("the benchmark spawner exited before answering"))

    def start(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: Path, timeout: float
    ) -> Future[dict[str, Any]]:
        """Start ``argv``; the future gives ``{"returncode", "seconds", "max_rss_kib"}`` once it was reaped."""
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            self._next += 1
            ident = self._next
            self._pending[ident] = future
        request = {"id": ident, "argv": list(argv), "cwd": str(cwd), "env": dict(env), "log": str(log)}
        request["timeout"] = timeout
        assert self._proc.stdin is not None
        with self._lock:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        return future

    async def run(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: Path, limit: float
    ) -> dict[str, Any]:
        """``start``, awaited; ``limit``: seconds before the spawner kills the command."""
        doc = await asyncio.wrap_future(self.start(argv, cwd=cwd, env=env, log=log, timeout=limit))
        if "error" in doc:
            raise RuntimeError(f"the benchmark spawner could not run {argv[0]}: {doc['error']}")
        return doc

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def __enter__(self) -> Spawner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
