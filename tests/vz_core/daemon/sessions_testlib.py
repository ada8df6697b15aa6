"""Helpers of the tests of the daemon's driver sessions: a command run to its end on a driver, a process's end,
waiting for a condition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import psutil

from vz_core import ExecExit, ExecOutput, ExecSpec


async def nothing() -> AsyncIterator[bytes]:
    """An empty stdin."""
    return
    yield b""


async def run(driver: Any, workspace_id: str, *argv: str) -> tuple[bytes, int]:
    """Run ``argv`` in the Machine ``workspace_id`` to its one exit; (its output, its exit code)."""
    out = bytearray()
    exits: list[ExecExit] = []
    async for event in driver.exec(ExecSpec(workspace_id, tuple(argv)), nothing()):
        if isinstance(event, ExecOutput):
            out += event.data
        else:
            exits.append(event)
    assert len(exits) == 1
    return bytes(out), exits[0].exit_code


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie counts)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


async def until(check: Any, seconds: float = 10.0) -> None:
    """Wait until ``check()`` is true; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)
