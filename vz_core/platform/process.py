"""Waiting for a process to end and signalling it, by a handle that pins the process.

Linux: a pidfd (``pidfd_open``; readable once the process exits; ``pidfd_send_signal`` reaches exactly that
process). macOS: a kqueue with an ``EVFILT_PROC``/``NOTE_EXIT`` filter (readable once the exit event is queued).
Windows: a process handle (``OpenProcess`` with ``SYNCHRONIZE | PROCESS_TERMINATE``), waited on with
``WaitForSingleObject`` and ended with ``TerminateProcess``.
Each watch is an event, never a poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Any

__all__ = ["ExitWatch", "exit_event_matches"]


def exit_event_matches(events: list[Any], pid: int) -> bool:
    """Whether the kqueue ``events`` include the ``NOTE_EXIT`` of ``pid`` (an ``EVFILT_PROC`` event whose
    ``ident`` is the pid and whose ``fflags`` carry ``NOTE_EXIT``, or an ``EV_ERROR`` for it: the process was
    already gone). Pure logic, so that it is tested on every host."""
    import select

    proc_filter = getattr(select, "KQ_FILTER_PROC", -5)
    note_exit = getattr(select, "KQ_NOTE_EXIT", 0x80000000)
    ev_error = getattr(select, "KQ_EV_ERROR", 0x4000)
    for event in events:
        if int(event.ident) != pid or int(event.filter) != proc_filter:
            continue
        if int(event.fflags) & note_exit or int(event.flags) & ev_error:
            return True
    return False


if sys.platform == "win32":
    import _winapi

    _SYNCHRONIZE = 0x00100000
    _PROCESS_TERMINATE = 0x0001
    _PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
    _WAIT_OBJECT_0 = 0

    class ExitWatch:
        """A handle on process ``pid`` (Windows: a process handle). Raises ``ProcessLookupError`` when no such
        process exists."""

        def __init__(self, pid: int) -> None:
            self.pid = pid
            try:
                self._handle = _winapi.OpenProcess(
                    _SYNCHRONIZE | _PROCESS_TERMINATE | _PROCESS_QUERY_LIMITED_INFORMATION, False, pid
                )
            except OSError:
                raise ProcessLookupError(pid) from None

        def exited(self) -> bool:
            return bool(_winapi.WaitForSingleObject(self._handle, 0) == _WAIT_OBJECT_0)

        async def wait(self) -> None:
            """Return once the process has exited (a wait on its handle, in a thread: the handle is signalled
            at exit)."""
            while not await asyncio.to_thread(self._wait_for, 1000):
                pass

        def _wait_for(self, milliseconds: int) -> bool:
            return bool(_winapi.WaitForSingleObject(self._handle, milliseconds) == _WAIT_OBJECT_0)

        def kill(self) -> None:
            """End the process (``TerminateProcess``, exit code 1); nothing when it has already exited."""
            with contextlib.suppress(OSError):
                if not self.exited():
                    _winapi.TerminateProcess(self._handle, 1)

        def close(self) -> None:
            _winapi.CloseHandle(self._handle)

else:
    import select
    import signal

    class ExitWatch:
        """A handle on process ``pid`` that becomes readable (``fd``) when it exits: a pidfd on Linux, a kqueue
        on macOS. Raises ``ProcessLookupError`` when no such process exists."""

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

        def exited(self) -> bool:
            """Whether the process has exited (a zombie counts), without waiting."""
            if self._kqueue is None:
                readable, _, _ = select.select([self.fd], [], [], 0)
                return bool(readable)
            return exit_event_matches(self._kqueue.control(None, 4, 0), self.pid)

        async def wait(self) -> None:
            """Return once the process has exited (the descriptor became readable)."""
            loop = asyncio.get_running_loop()
            done: asyncio.Future[None] = loop.create_future()

            def _ready() -> None:
                if not done.done():
                    done.set_result(None)

            loop.add_reader(self.fd, _ready)
            try:
                await done
            finally:
                loop.remove_reader(self.fd)

        def kill(self) -> None:
            """SIGKILL the process (through the pidfd on Linux); nothing when it is gone."""
            with contextlib.suppress(ProcessLookupError):
                if sys.platform == "linux":
                    signal.pidfd_send_signal(self.fd, signal.SIGKILL)
                else:
                    os.kill(self.pid, signal.SIGKILL)

        def close(self) -> None:
            if self._kqueue is None:
                os.close(self.fd)
            else:
                self._kqueue.close()
