"""Advisory file locks that serialize mutations of one Environment (and Environment creation of one project).

``flock`` locks belong to an open file description: they are released when the holder exits however it exits
(SIGKILL included), they work between threads of one process, and a free lock next to a "running" operation
record proves its process died. The holder writes who it is into the file so a waiter can say what it waits
for. Exec never takes a lock.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from vz_core.platform.locks import lock_file

__all__ = ["FileLock", "env_lock_path", "project_lock_path"]


def _locks_dir() -> Path:
    from vz_core.paths import state_dir

    path = state_dir() / "locks"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def env_lock_path(env_id: str) -> Path:
    """The lock serializing mutations of one Environment."""
    return _locks_dir() / f"{env_id}.lock"


def project_lock_path(project_id: str) -> Path:
    """The lock serializing Environment selection/creation within one project (held briefly)."""
    digest = hashlib.sha256(project_id.encode()).hexdigest()[:20]
    return _locks_dir() / f"project-{digest}.lock"


class FileLock:
    """An exclusive ``flock`` on one file; not re-entrant."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _open(self) -> int:
        return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    def try_acquire(self, holder: str = "") -> bool:
        """Take the lock if it is free; never blocks."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this object")
        fd = self._open()
        try:
            if not lock_file(fd, blocking=False):
                os.close(fd)
                return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._describe(holder)
        return True

    async def acquire(self, holder: str = "", on_wait: Callable[[str], None] | None = None) -> None:
        """Take the lock, waiting as long as needed; ``on_wait(current_holder)`` is called once if busy.

        The blocking wait runs in a daemon thread so cancellation (Ctrl-C) is immediate; if the process exits
        while that thread waits, the kernel drops the pending request with the file descriptor.
        """
        if self.try_acquire(holder):
            return
        if on_wait is not None:
            on_wait(self.holder())
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        abandoned = threading.Event()
        fd = self._open()

        def wait() -> None:
            try:
                lock_file(fd)
            except OSError as exc:
                os.close(fd)
                if not abandoned.is_set():
                    loop.call_soon_threadsafe(_set_exception, done, exc)
                return
            if abandoned.is_set():
                os.close(fd)  # the waiter gave up: drop the lock we just got
                return
            loop.call_soon_threadsafe(_set_result, done, fd, abandoned)

        threading.Thread(target=wait, name=f"vz-lock-{self.path.name}", daemon=True).start()
        try:
            self._fd = await done
        except BaseException:
            abandoned.set()
            if done.done() and not done.cancelled() and done.exception() is None:
                os.close(done.result())
            raise
        self._describe(holder)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def holder(self) -> str:
        """What the current holder wrote about itself ("" if nothing)."""
        try:
            return self.path.read_text(errors="replace").strip()
        except OSError:
            return ""

    def is_free(self) -> bool:
        """True when nobody holds the lock right now (probe: take and drop it)."""
        if self._fd is not None:
            return False
        if self.try_acquire():
            self.release()
            return True
        return False

    def _describe(self, holder: str) -> None:
        assert self._fd is not None
        if holder:
            os.ftruncate(self._fd, 0)
            from vz_core.platform.files import write_at

            write_at(self._fd, holder.encode() + b"\n", 0)

    def __del__(self) -> None:
        self.release()


def _set_result(future: asyncio.Future[int], fd: int, abandoned: threading.Event) -> None:
    if future.done():
        abandoned.set()
        os.close(fd)
    else:
        future.set_result(fd)


def _set_exception(future: asyncio.Future[int], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
