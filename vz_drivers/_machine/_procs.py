"""The backend process of a Machine (runc's init, QEMU, vfkit), known by pid plus start time.

A pid alone can be reused; pid plus its start time names one process for good (Linux: clock ticks from
``/proc/<pid>/stat``; elsewhere: microseconds of psutil's create time). Waiting for it to end is an event,
never a poll: a pidfd on Linux, a kqueue ``NOTE_EXIT`` on macOS.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from vz_core.platform.process import ExitWatch

__all__ = ["kill_process", "proc_start_time", "wait_gone"]


def proc_start_time(pid: int) -> int | None:
    """Start time of a live, non-zombie process (an opaque integer, stable for the process); None when gone."""
    if not _PROC:
        return _psutil_start_time(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


_PROC = os.path.isdir("/proc/self")


def _psutil_start_time(pid: int) -> int | None:
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return int(proc.create_time() * 1_000_000)
    except psutil.Error:
        return None


def _pidfd(pid: int, start: int) -> ExitWatch | None:
    """A pidfd of process ``pid`` if it still is the one started at ``start`` (it pins the process: a newcomer
    with the same pid can never be signalled through it); None when it is gone."""
    if not pid or proc_start_time(pid) != start:
        return None
    try:
        watch = ExitWatch(pid)
    except ProcessLookupError:
        return None
    if proc_start_time(pid) != start:
        watch.close()
        return None
    return watch


async def wait_gone(pid: int, start: int, *, limit: float | None = None) -> None:
    """Wait until process ``pid`` (started at ``start``) has exited; at ``limit`` seconds SIGKILL it first.

    A zombie (exited, not yet reaped by its parent) counts as gone.
    """
    watch = _pidfd(pid, start)
    if watch is None:
        return
    done = asyncio.ensure_future(watch.wait())
    try:
        try:
            await asyncio.wait_for(asyncio.shield(done), limit)
        except TimeoutError:
            watch.kill()
            await asyncio.wait_for(asyncio.shield(done), 10)
    finally:
        done.cancel()
        with contextlib.suppress(BaseException):
            await done
        watch.close()


async def kill_process(pid: int, start: int) -> None:
    """SIGKILL process ``pid`` if it still is the one started at ``start``, and wait until it is gone."""
    watch = _pidfd(pid, start)
    if watch is None:
        return
    try:
        watch.kill()
    finally:
        watch.close()
    await wait_gone(pid, start, limit=10)
