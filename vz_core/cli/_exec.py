"""`vz exec`: stream a command's stdin/stdout/stderr through the Machine's driver and exit with its code.

This path is performance sensitive (B7): it imports neither pydantic nor rich, opens the state database once,
takes no lock and negotiates nothing. Signals: SIGINT (Ctrl-C), SIGTERM and SIGHUP cancel the exec stream, the
driver kills the command and its descendants, and vz exits 128+N. The command's own death by signal N also
exits 128+N.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from vz_core._driver import Driver
from vz_core._types import MAX_CHUNK, ExecExit, ExecOutput, ExecSpec

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
    *,
    cwd: Path,
    environ: Mapping[str, str],
    argv: list[str],
    environment: str | None,
    machine: str | None,
    workdir: str | None,
    definition_file: Path | None,
) -> int:
    """Select the Machine, obtain its driver, stream the command; the exit status to return."""
    from vz_core.env._drivers import acquire_driver
    from vz_core.env._engine import Context, describe_driver_error, prepare_exec
    from vz_core.errors import DriverError

    ctx = Context(cwd=cwd, environ=environ, definition_file=definition_file)
    target = prepare_exec(ctx, environment=environment, machine=machine)
    driver = acquire_driver(target.machine.driver, target.machine.driver_options)
    spec = ExecSpec(
        workspace_id=target.machine.workspace_id,
        argv=tuple(argv),
        workdir=target.workdir if workdir is None else workdir,
    )
    try:
        return asyncio.run(_stream(driver, spec))
    except DriverError as exc:
        if type(exc).__name__ in ("NotFoundError", "FailedPreconditionError"):
            raise type(exc)(describe_driver_error(exc, target), details=dict(exc.details)) from None
        raise


async def _stream(driver: Driver, spec: ExecSpec) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        task.cancel()

    for sig in _FORWARDED:
        loop.add_signal_handler(sig, on_signal, sig)
    events = driver.exec(spec, _stdin(loop))
    try:
        async for event in events:
            if isinstance(event, ExecOutput):
                _write_all(1 if event.stream == "stdout" else 2, event.data)
            else:
                return exit_code_of(event)
        raise _no_exit()
    except asyncio.CancelledError:
        if received:
            return 128 + received[0]
        raise
    except BrokenPipeError:
        return 128 + signal.SIGPIPE
    finally:
        for sig in _FORWARDED:
            loop.remove_signal_handler(sig)
        with contextlib.suppress(Exception):
            await events.aclose()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            await driver.close()


def _no_exit() -> Exception:
    from vz_core.errors import RuntimeFailureError

    return RuntimeFailureError("the exec stream ended without an exit status; the command's outcome is unknown")


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
