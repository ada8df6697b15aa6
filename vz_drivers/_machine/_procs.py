"""The backend process of a Machine (runc's init, QEMU), known by pid plus kernel start time.

A pid alone can be reused; pid plus the start time in ``/proc/<pid>/stat`` names one process for good. Waiting
for it to end uses a pidfd (a readable event), never a poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

__all__ = ["kill_process", "proc_start_time", "wait_gone"]


def proc_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie process; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


async def wait_gone(pid: int, start: int, *, limit: float | None = None) -> None:
    """Wait until process ``pid`` (started at ``start``) has exited; at ``limit`` seconds SIGKILL it first.

    A zombie (exited, not yet reaped by its parent) counts as gone.
    """
    if not pid or proc_start_time(pid) != start:
        return
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def _exited() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, _exited)
    try:
        if proc_start_time(pid) != start:
            return
        try:
            await asyncio.wait_for(asyncio.shield(done), limit)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            await asyncio.wait_for(asyncio.shield(done), 10)
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


async def kill_process(pid: int, start: int) -> None:
    """SIGKILL process ``pid`` if it still is the one started at ``start``, and wait until it is gone."""
    if not pid or proc_start_time(pid) != start:
        return
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        # The pidfd pins the process: checked once more, the signal cannot reach a newcomer with the same pid.
        if proc_start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)
    await wait_gone(pid, start, limit=10)
