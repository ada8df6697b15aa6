"""`vz exec` on the terminal: wire stdin/stdout/stderr and signals to the Environment layer's exec flow.

Selecting the Machine, obtaining its driver, running the command and classifying errors belong to
``vz_core.env`` (``prepare_exec``, ``execute``); this module only moves bytes and turns the outcome into an exit
status. This path is performance sensitive (B7): it imports neither pydantic nor rich.

Signals: SIGINT (Ctrl-C), SIGTERM and SIGHUP cancel the exec stream, the driver kills the command and its
descendants, and vz exits 128+N. The command's own death by signal N also exits 128+N.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from vz_core._types import MAX_CHUNK, ExecExit

if TYPE_CHECKING:
    from vz_core.env import Context, ExecTarget

__all__ = ["exit_code_of", "run_exec"]

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code_of(event: ExecExit) -> int:
    """The shell-style exit status of an exec: the code, or 128+N for a command killed by signal N."""
    if not event.signal:
        return event.exit_code & 0xFF if event.exit_code >= 0 else 1
    name = event.signal.strip().upper()
    number: int | None = None
    if name.isdigit():
        number = int(name)
    else:
        with contextlib.suppress(KeyError):
            number = signal.Signals[name if name.startswith("SIG") else "SIG" + name].value
    if number is not None and 0 < number < 128:
        return 128 + number
    return event.exit_code if 0 < event.exit_code < 256 else 1


def run_exec(
    ctx: Context,
    *,
    argv: list[str],
    environment: str | None,
    machine: str | None,
    workdir: str | None,
) -> int:
    """Run the command through the Environment layer, wired to this process's stdio; the exit status."""
    from vz_core.env import prepare_exec

    target = prepare_exec(ctx, environment=environment, machine=machine)
    return asyncio.run(_stream(ctx, target, argv, workdir))


async def _stream(ctx: Context, target: ExecTarget, argv: list[str], workdir: str | None) -> int:
    from vz_core.env import execute

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        task.cancel()

    def output(stream: str, data: bytes) -> None:
        _write_all(1 if stream == "stdout" else 2, data)

    for sig in _FORWARDED:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        event: ExecExit = await execute(ctx, target, argv, _stdin(loop), output, workdir=workdir)
        return exit_code_of(event)
    except asyncio.CancelledError:
        if received:
            return 128 + received[0]
        raise
    except BrokenPipeError:
        return 128 + signal.SIGPIPE
    finally:
        for sig in _FORWARDED:
            loop.remove_signal_handler(sig)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


async def _stdin(loop: asyncio.AbstractEventLoop) -> AsyncIterator[bytes]:
    """Our stdin as chunks, read by a daemon thread with bounded buffering (the command's pace)."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=4)

    def reader() -> None:
        while True:
            try:
                chunk = os.read(0, MAX_CHUNK)
            except OSError:
                chunk = b""
            try:
                asyncio.run_coroutine_threadsafe(queue.put(chunk or None), loop).result()
            except Exception:  # the loop is gone: the exec is over
                return
            if not chunk:
                return

    threading.Thread(target=reader, name="vz-exec-stdin", daemon=True).start()
    while True:
        chunk = await queue.get()
        if chunk is None:
            return
        yield chunk
