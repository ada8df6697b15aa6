"""Helpers shared by the linux_native tests."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from vz_core import Driver, ExecExit, ExecOutput, ExecSpec, RunImageRequest


@dataclass(frozen=True)
class Result:
    stdout: bytes
    stderr: bytes
    exit: ExecExit


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 32768):
        yield data[i : i + 32768]


async def run(
    driver: Driver,
    workspace_id: str,
    *argv: str,
    stdin: bytes = b"",
    user: str = "",
    workdir: str = "",
    env: Mapping[str, str] | None = None,
) -> Result:
    """Run a command to completion and collect its output."""
    out, err = bytearray(), bytearray()
    exits: list[ExecExit] = []
    spec = ExecSpec(workspace_id, tuple(argv), user=user, workdir=workdir, environment=dict(env or {}))
    async for event in driver.exec(spec, _chunks(stdin)):
        assert not exits, "an event arrived after the exit"
        if isinstance(event, ExecOutput):
            assert 1 <= len(event.data) <= 32768
            (out if event.stream == "stdout" else err).extend(event.data)
        else:
            exits.append(event)
    assert len(exits) == 1, "exactly one exit expected"
    return Result(bytes(out), bytes(err), exits[0])


async def sh(driver: Driver, workspace_id: str, script: str, *args: str, **kw: object) -> Result:
    return await run(driver, workspace_id, "sh", "-c", script, "sh", *args, **kw)  # type: ignore[arg-type]


def request(workspace_id: str, **kw: object) -> RunImageRequest:
    """A Machine request on the embedded default image whose main process keeps running."""
    base: dict[str, object] = {"workspace_id": workspace_id, "image": "vz:default", "args": ("sleep", "1000000")}
    base.update(kw)
    return RunImageRequest(**base)  # type: ignore[arg-type]


async def wait_pid_exit(pid: int) -> None:
    """Wait (on a pidfd, no polling) until process ``pid`` has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    loop.add_reader(fd, exited.set)
    try:
        await asyncio.wait_for(exited.wait(), 10)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return True
    return data[data.rfind(b")") + 2 : data.rfind(b")") + 3] in (b"Z", b"X")
