"""Cross-process file locks (``flock``) awaited without blocking the event loop.

``flock`` locks belong to an open file description, so two opens of the same lock file conflict even inside one
process; that makes these locks correct between store instances and between processes alike. Waiting polls
with a short, growing backoff instead of parking a worker thread (parked threads could starve the executor
that downloads and unpacking run on).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from vz_core.platform.locks import lock_file

__all__ = ["file_lock"]

_MAX_BACKOFF = 0.1


@asynccontextmanager
async def file_lock(path: Path, *, shared: bool = False) -> AsyncIterator[None]:
    """Hold an exclusive (or shared) ``flock`` on ``path`` (created if missing) for the ``async with`` body."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        delay = 0.001
        while not lock_file(fd, exclusive=not shared, blocking=False):
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock
