"""The backend process of a Machine (runc's init, QEMU, vfkit), known by pid plus start time.

A pid alone can be reused; pid plus its start time names one process for good (Linux: clock ticks from
``/proc/<pid>/stat``; elsewhere: microseconds of psutil's create time). Waiting for it to end is an event,
never a poll: a pidfd on Linux, a kqueue ``NOTE_EXIT`` on macOS.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import sys
from typing import Any

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


class _ExitWatch:
    """A readable descriptor that becomes readable when one process exits: a pidfd, or a kqueue elsewhere."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._kqueue: Any = None
        if sys.platform == "linux":
            self.fd = os.pidfd_open(pid)
        else:
            kq = select.kqueue()
            try:
                event = select.kevent(
                    pid, filter=select.KQ_FILTER_PROC, flags=select.KQ_EV_ADD, fflags=select.KQ_NOTE_EXIT
                )
                kq.control([event], 0, 0)
            except OSError:
                kq.close()
                raise ProcessLookupError(pid) from None
            self._kqueue = kq
            self.fd = kq.fileno()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self._kqueue is None:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        if self._kqueue is None:
            os.close(self.fd)
        else:
            self._kqueue.close()


def _pidfd(pid: int, start: int) -> _ExitWatch | None:
    """A pidfd of process ``pid`` if it still is the one started at ``start`` (it pins the process: a newcomer
    with the same pid can never be signalled through it); None when it is gone."""
    if not pid or proc_start_time(pid) != start:
        return None
    try:
        watch = _ExitWatch(pid)
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
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def _exited() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(watch.fd, _exited)
    try:
        try:
            await asyncio.wait_for(asyncio.shield(done), limit)
        except TimeoutError:
            watch.kill()
            await asyncio.wait_for(asyncio.shield(done), 10)
    finally:
        loop.remove_reader(watch.fd)
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
