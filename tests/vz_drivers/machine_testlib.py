"""Helpers shared by the tests of agent-Machine drivers (linux_native, qemu) and the security tests using them."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field

from vz_core import Driver, ExecExit, ExecOutput, ExecSpec, RunImageRequest


@dataclass
class Result:
    stdout: bytes
    stderr: bytes
    exit: ExecExit
    frames: list[int] = field(default_factory=list)
    """Sizes of the output frames, in order."""


async def chunks(data: bytes | Iterable[bytes] = b"") -> AsyncIterator[bytes]:
    """``data`` as an exec's stdin: 32 KiB pieces of one bytes object, or the given pieces."""
    parts = [data[i : i + 32768] for i in range(0, len(data), 32768)] if isinstance(data, bytes) else list(data)
    for part in parts:
        if part:
            yield part


async def run(
    driver: Driver,
    workspace_id: str,
    *argv: str,
    stdin: bytes = b"",
    env: Mapping[str, str] | None = None,
    **spec: object,
) -> Result:
    """Run a command to completion and collect its output; exactly one exit, nothing after it.

    ``spec`` holds further ``ExecSpec`` fields (``user``, ``workdir``, ``tty``; ``environment`` like ``env``).
    """
    out, err = bytearray(), bytearray()
    frames: list[int] = []
    exits: list[ExecExit] = []
    environment = dict(env or spec.pop("environment", None) or {})  # type: ignore[call-overload]
    request = ExecSpec(workspace_id=workspace_id, argv=tuple(argv), environment=environment, **spec)  # type: ignore[arg-type]
    async for event in driver.exec(request, chunks(stdin)):
        assert not exits, "an event arrived after the exit"
        if isinstance(event, ExecOutput):
            assert 1 <= len(event.data) <= 32768
            frames.append(len(event.data))
            (out if event.stream == "stdout" else err).extend(event.data)
        else:
            exits.append(event)
    assert len(exits) == 1, "exactly one exit expected"
    return Result(bytes(out), bytes(err), exits[0], frames)


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
