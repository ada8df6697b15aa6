"""Copying between descriptors and a driver's exec stream, for drivers without a local exec path.

The descriptors may be shared with another process (a client's pipes and files, passed over a Unix socket), so
they are never switched to non-blocking mode (that flag belongs to the open file description, which the other
process uses too): each one is served by its own thread that waits with ``poll`` on it and on a wake-up pipe,
so stopping never leaves a thread blocked on a descriptor nobody reads any more.

Backpressure: the reader hands over at most ``DEPTH`` chunks ahead of the stream; each output chunk is written
completely before the next one is pulled from the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import threading
from typing import Any

from vz_core._types import MAX_CHUNK, ExecExit, ExecOutput, ExecSpec
from vz_core.errors import RuntimeFailureError

__all__ = ["FdReader", "FdWriter", "copy_exec"]

DEPTH = 4


class _Waker:
    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.stopped = threading.Event()

    def wait(self, fd: int, events: int) -> bool:
        """Wait until ``fd`` is ready for ``events``; False when stopped first."""
        poller = select.poll()
        poller.register(fd, events | select.POLLHUP | select.POLLERR)
        poller.register(self.read_end, select.POLLIN)
        while not self.stopped.is_set():
            ready = poller.poll()
            if any(found == self.read_end for found, _ in ready):
                return False
            if ready:
                return True
        return False

    def stop(self) -> None:
        if not self.stopped.is_set():
            self.stopped.set()
            with contextlib.suppress(OSError):
                os.write(self.write_end, b"x")

    def close(self) -> None:
        for fd in (self.read_end, self.write_end):
            with contextlib.suppress(OSError):
                os.close(fd)


class FdReader:
    """An async iterator over a descriptor's data (ends at end of file or when stopped)."""

    def __init__(self, fd: int, name: str = "vz-fd-reader") -> None:
        self._fd = fd
        self._waker = _Waker()
        self._queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=DEPTH)
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _hand_over(self, item: bytes | BaseException | None) -> bool:
        future = asyncio.run_coroutine_threadsafe(self._queue.put(item), self._loop)
        while True:
            try:
                future.result(timeout=0.2)
                return True
            except TimeoutError:
                if self._waker.stopped.is_set():
                    future.cancel()
                    return False
            except Exception:  # the loop is gone
                return False

    def _run(self) -> None:
        try:
            while self._waker.wait(self._fd, select.POLLIN):
                try:
                    chunk = os.read(self._fd, MAX_CHUNK)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    self._hand_over(exc if exc.errno not in (errno.EIO, errno.EBADF) else None)
                    return
                if not chunk:
                    self._hand_over(None)
                    return
                if not self._hand_over(chunk):
                    return
        finally:
            self._waker.stopped.set()

    def __aiter__(self) -> FdReader:
        return self

    async def __anext__(self) -> bytes:
        if self._waker.stopped.is_set() and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    async def stop(self) -> None:
        self._waker.stop()
        while not self._queue.empty():  # unblock a pending hand-over
            self._queue.get_nowait()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 2.0)
        if not self._thread.is_alive():
            self._waker.close()


class FdWriter:
    """Writes chunks to a descriptor from a thread; ``write`` returns once the chunk is written."""

    def __init__(self, fd: int, name: str = "vz-fd-writer") -> None:
        self.fd = fd
        self._fd = fd
        self._waker = _Waker()
        self._loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if not self._waker.wait(self._fd, select.POLLOUT):
                raise asyncio.CancelledError
            try:
                written = os.write(self._fd, view)
            except BlockingIOError:
                continue
            view = view[written:]

    async def write(self, data: bytes) -> None:
        if not data:
            return
        async with self._lock:
            future: asyncio.Future[None] = self._loop.create_future()

            def run() -> None:
                try:
                    self._write_all(data)
                except BaseException as exc:
                    self._loop.call_soon_threadsafe(_fail, future, exc)
                else:
                    self._loop.call_soon_threadsafe(_succeed, future)

            threading.Thread(target=run, name="vz-fd-writer", daemon=True).start()
            try:
                await future
            except asyncio.CancelledError:
                self._waker.stop()
                raise

    def stop(self) -> None:
        self._waker.stop()

    def close(self) -> None:
        self._waker.stop()
        self._waker.close()


def _succeed(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _fail(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
            exc = BrokenPipeError(errno.EPIPE, "the reader of the command's output is gone")
        future.set_exception(exc)


async def copy_exec(driver: Any, spec: ExecSpec, stdio: tuple[int, int, int]) -> ExecExit:
    """``Driver.exec`` with its stdin read from ``stdio[0]`` and its output written to ``stdio[1]``/``[2]``."""
    stdin = FdReader(stdio[0], "vz-exec-stdin")
    writers = {"stdout": FdWriter(stdio[1]), "stderr": FdWriter(stdio[2])}
    events = driver.exec(spec, stdin)
    try:
        async for event in events:
            if isinstance(event, ExecOutput):
                await writers[event.stream].write(event.data)
            else:
                assert isinstance(event, ExecExit)
                return event
        raise RuntimeFailureError("the exec stream ended without an exit status; the command's outcome is unknown")
    finally:
        with contextlib.suppress(Exception):
            await events.aclose()
        await stdin.stop()
        for writer in writers.values():
            writer.close()
