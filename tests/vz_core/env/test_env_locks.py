"""Environment locks: exclusive, waited on with a message, cancellable, released when the holder dies."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from vz_core.env._locks import FileLock


def test_second_holder_is_refused_until_release(tmp_path: Path) -> None:
    first, second = FileLock(tmp_path / "l"), FileLock(tmp_path / "l")
    assert first.try_acquire("vz up (pid 1)")
    assert not second.try_acquire() and not second.is_free()
    assert second.holder() == "vz up (pid 1)"
    first.release()
    assert second.is_free() and second.try_acquire()
    second.release()


async def test_acquire_waits_and_reports_the_holder(tmp_path: Path) -> None:
    holder = FileLock(tmp_path / "l")
    assert holder.try_acquire("vz stop (pid 7)")
    waiter = FileLock(tmp_path / "l")
    seen: list[str] = []
    told = asyncio.Event()

    def on_wait(who: str) -> None:
        seen.append(who)
        told.set()

    task = asyncio.create_task(waiter.acquire("vz up", on_wait=on_wait))
    await told.wait()
    assert seen == ["vz stop (pid 7)"] and not task.done()
    holder.release()
    await asyncio.wait_for(task, 10)
    assert waiter.held and waiter.holder() == "vz up"
    waiter.release()


async def test_cancelled_wait_leaves_the_lock_usable(tmp_path: Path) -> None:
    holder = FileLock(tmp_path / "l")
    assert holder.try_acquire()
    waiter = FileLock(tmp_path / "l")
    told = asyncio.Event()
    task = asyncio.create_task(waiter.acquire(on_wait=lambda _: told.set()))
    await told.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not waiter.held
    holder.release()
    third = FileLock(tmp_path / "l")
    # The abandoned waiter thread may grab and drop the lock once; a blocking acquire still succeeds.
    await asyncio.wait_for(third.acquire(), 10)
    third.release()


def test_lock_of_a_killed_process_is_free(tmp_path: Path) -> None:
    path = tmp_path / "l"
    code = (
        "import sys; from pathlib import Path; from vz_core.env._locks import FileLock\n"
        f"lock = FileLock(Path({str(path)!r})); assert lock.try_acquire('child')\n"
        "print('held', flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        assert not FileLock(path).is_free()
        child.kill()
        child.wait(10)
        assert FileLock(path).is_free()
    finally:
        child.kill()
        child.wait()
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.stdout.close()
