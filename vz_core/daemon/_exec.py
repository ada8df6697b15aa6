"""Machines.Exec's plumbing: a command's standard streams (descriptors passed by the client, or pipes of the
daemon bridged to the call's messages), its terminal sessions, and the client's messages during either (stdin
bytes and its end, resize, signal, cancel).

``exec_streams`` and ``terminal`` run one command to its end for the service (``_service.Service``: it selects
the Machine and prepares the context) and return its result ``{exit_code, signal}``; the call's end (a hangup,
``cancel``, a ``signal``) stops the command (its driver kills it). ``cancel_reason`` says why a call is being
cancelled; ``stop_task`` cancels a task and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as signals
import sys
from collections.abc import AsyncIterator
from typing import Any, Protocol

from vz_core.daemon._calls import MAX_WINDOW
from vz_core.wire import DaemonError

__all__ = ["STDIO_DRAIN_SECONDS", "ExecState", "cancel_reason", "exec_streams", "signal_name", "stop_task", "terminal"]

STDIO_DRAIN_SECONDS = 5.0
"""After an exec's exit, how long its output pipes may take to reach end of file (a background process of the
command may hold them open)."""


class ExecState(Protocol):
    """What the plumbing reads and sets of a call in progress (``_service._CallState``)."""

    call: Any
    signal: str | None
    cancel_reason: str | None


def cancel_reason(state: ExecState) -> str:
    """Why a call is being cancelled: what the service saw, what the front saw (``call.cancel_reason``: a
    ``cancel`` message), else a hangup."""
    front = getattr(state.call, "cancel_reason", None)
    return state.cancel_reason or (front if isinstance(front, str) else None) or "the client closed the connection"


async def exec_streams(
    state: ExecState,
    ctx: Any,
    target: Any,
    argv: list[str],
    workdir: str | None,
    variables: dict[str, str],
    stdio: tuple[bool, ...],
    passed: list[int],
    masked: bool = False,
) -> dict[str, Any]:
    """``masked``: the command's stderr passes through a pipe of ours and is masked with the call's secrets
    (to the caller's descriptor, or as frames) instead of reaching the caller's descriptor directly."""
    if sys.platform == "win32":
        # Our ends of the command's pipes are read and written non-blocking on the selector loop; on the
        # proactor loop of Windows that takes overlapped pipes, which execute_local does not make yet.
        raise DaemonError(
            "running a command with its output copied through the daemon is not available on Windows hosts "
            "yet (docs/daemon.md, Windows)",
            code="UNSUPPORTED",
            kind="user_error",
            exit_code=2,
        )
    from vz_core.env import execute_local

    call = state.call
    command: list[int] = [-1, -1, -1]
    ours: list[int] = []  # both ends of the pipes made here, for the streams that travel as messages
    stdin: int | None = None  # our (write) end of the command's stdin pipe
    outputs: list[tuple[int, int]] = []  # (stream, our read end)
    given = iter(passed)
    caller_stderr: int | None = None  # the caller's stderr descriptor, written by us (masked)
    try:
        for stream in (0, 1, 2):
            if stdio[stream] and not (stream == 2 and masked):
                command[stream] = next(given)
                continue
            if stdio[stream]:
                caller_stderr = next(given)
            read_end, write_end = os.pipe()
            ours += [read_end, write_end]
            if stream == 0:
                command[0], stdin = read_end, write_end
                os.set_blocking(write_end, False)
            else:
                command[stream] = write_end
                os.set_blocking(read_end, False)
                outputs.append((stream, read_end))

        async def deliver(stream: int, data: bytes) -> None:
            if not data:
                return
            if stream == 2 and caller_stderr is not None:
                await asyncio.to_thread(_write_all, caller_stderr, data)
            else:
                await call.write(stream, data)

        # Set when the command's main process has exited: its output streams then end with what they hold,
        # without waiting for a background process of the command that keeps them open (docker exec's end).
        exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def forward(stream: int, fd: int) -> None:
            cleaner = ctx.redactor.stream() if masked and stream == 2 else None
            async for chunk in _pipe_chunks(fd, exited):
                await deliver(stream, cleaner.feed(chunk) if cleaner is not None else chunk)
            if cleaner is not None:
                await deliver(stream, cleaner.flush())

        pumps = [asyncio.ensure_future(forward(stream, fd)) for stream, fd in outputs]
        running = asyncio.ensure_future(
            execute_local(
                ctx, target, argv, (command[0], command[1], command[2]), workdir=workdir, environment=variables
            )
        )
        inputs = asyncio.ensure_future(_exec_input(state, stdin, ours))
        gone = asyncio.ensure_future(call.cancelled.wait())
        try:
            await asyncio.wait({running, inputs, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not running.done():
                state.cancel_reason = cancel_reason(state)
                await stop_task(running)
                if state.signal is not None:
                    return _signalled(state.signal)
                raise asyncio.CancelledError
            try:
                event = running.result()
            except BrokenPipeError:
                return _signalled("SIGPIPE")
        finally:
            inputs.cancel()
            gone.cancel()
            await stop_task(running)  # this call was cancelled: so is the command (killed by its driver)
            # The command is over: what its output pipes hold is delivered, then they end (the driver wrote
            # all the main process's output before it reported the exit).
            if not exited.done():
                exited.set_result(None)
            for stream, _ in outputs:
                _close(command[stream])
                ours.remove(command[stream])
            if pumps:
                _, late = await asyncio.wait(pumps, timeout=STDIO_DRAIN_SECONDS)
                for pump in late:
                    await stop_task(pump)
            for pump in pumps:
                failure = None if pump.cancelled() else pump.exception()
                if failure is not None:
                    raise failure
        return {"exit_code": event.exit_code, "signal": event.signal or None}
    finally:
        for fd in ours:
            _close(fd)


async def _exec_input(state: ExecState, stdin: int | None, ours: list[int]) -> None:
    """The client's messages during an exec: stdin bytes and its end, cancel, signals, the end of the call."""
    while True:
        message = await state.call.receive()
        if message is None:
            state.cancel_reason = "the client closed the connection"
            return
        if isinstance(message, tuple):
            stream, data = message
            if stream != 0 or stdin is None:
                continue  # stdin is attached as a descriptor (or closed already): nothing reads these bytes
            try:
                await _pipe_write(stdin, data)
            except OSError:  # the command closed its stdin: the rest is dropped, as with a pipe
                stdin = None
            continue
        if "stdin_close" in message:
            if stdin is not None and stdin in ours:  # the command's stdin reaches end of file
                ours.remove(stdin)
                _close(stdin)
            stdin = None
        elif "cancel" in message:
            state.cancel_reason = "cancelled by the client"
            return
        elif "signal" in message:
            state.signal = signal_name(message.get("signal")) or "SIGTERM"
            state.cancel_reason = f"the client received {state.signal}"
            return


async def terminal(
    state: ExecState,
    ctx: Any,
    target: Any,
    argv: list[str],
    workdir: str | None,
    variables: dict[str, str],
    rows: int | None,
    cols: int | None,
    term: str | None,
    masked: bool = False,
) -> dict[str, Any]:
    from vz_core._types import (
        TERMINAL_COLS,
        TERMINAL_ROWS,
        TERMINAL_TERM,
        TerminalData,
        TerminalEof,
        TerminalResize,
    )
    from vz_core.env import execute_terminal

    call = state.call
    keys: asyncio.Queue[Any] = asyncio.Queue(maxsize=64)

    async def typed() -> AsyncIterator[Any]:
        while True:
            yield await keys.get()

    async def read_client() -> None:
        while True:
            message = await call.receive()
            if message is None:
                state.cancel_reason = "the client closed the connection"
                return
            if isinstance(message, tuple):
                stream, data = message
                if stream in (0, 3) and data:
                    await keys.put(TerminalData(data))
            elif "resize" in message:
                size = message.get("resize")
                if isinstance(size, dict):
                    r, c = size.get("rows"), size.get("cols")
                    if isinstance(r, int) and isinstance(c, int) and 0 < r <= MAX_WINDOW and 0 < c <= MAX_WINDOW:
                        await keys.put(TerminalResize(r, c))
            elif "stdin_close" in message:
                await keys.put(TerminalEof())
            elif "cancel" in message:
                state.cancel_reason = "cancelled by the client"
                return
            elif "signal" in message:
                state.signal = signal_name(message.get("signal")) or "SIGTERM"
                state.cancel_reason = f"the client received {state.signal}"
                return

    cleaner = ctx.redactor.stream() if masked else None  # see _exec: a command name holding a secret

    async def output(data: bytes) -> None:
        data = cleaner.feed(data) if cleaner is not None else data
        if data:
            await call.write(3, data)

    running = asyncio.ensure_future(
        execute_terminal(
            ctx,
            target,
            argv,
            typed(),
            output,
            rows=rows or TERMINAL_ROWS,
            cols=cols or TERMINAL_COLS,
            term=term or TERMINAL_TERM,
            workdir=workdir,
            environment=variables,
        )
    )
    inputs = asyncio.ensure_future(read_client())
    gone = asyncio.ensure_future(call.cancelled.wait())
    try:
        await asyncio.wait({running, inputs, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not running.done():
            state.cancel_reason = cancel_reason(state)
            running.cancel()
            with contextlib.suppress(BaseException):
                await running
            if state.signal is not None:
                return _signalled(state.signal)
            raise asyncio.CancelledError
        event = running.result()
    finally:
        inputs.cancel()
        gone.cancel()
        await stop_task(running)
    if cleaner is not None:
        rest = cleaner.flush()
        if rest:
            await call.write(3, rest)
    return {"exit_code": event.exit_code, "signal": event.signal or None}


def signal_name(data: object) -> str | None:
    name = data.get("name") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        return None
    name = name.strip().upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return signals.Signals[name].name
    except KeyError:
        return None


def _signalled(name: str) -> dict[str, Any]:
    """The result of an exec ended because its client got signal ``name``: 128+N, as the command did before."""
    return {"exit_code": 128 + signals.Signals[name].value, "signal": name}


async def _ready(fd: int, *, write: bool, until: asyncio.Future[None] | None = None) -> None:
    """Wait on the loop until our non-blocking pipe end ``fd`` can be read (or written), or ``until`` is done."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake(*_: object) -> None:
        if not ready.done():
            ready.set_result(None)

    if write:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    if until is not None:
        until.add_done_callback(wake)
    try:
        await ready
    finally:
        if until is not None:
            until.remove_done_callback(wake)
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


async def _pipe_chunks(fd: int, exited: asyncio.Future[None] | None = None) -> AsyncIterator[bytes]:
    """What arrives on our non-blocking read end ``fd``, until end of file, or once ``exited`` is done, until
    the pipe holds nothing more."""
    from vz_core._types import MAX_CHUNK

    while True:
        try:
            data = os.read(fd, MAX_CHUNK)
        except BlockingIOError:
            if exited is not None and exited.done():
                return
            await _ready(fd, write=False, until=exited)
            continue
        if not data:
            return
        yield data


async def _pipe_write(fd: int, data: bytes) -> None:
    """All of ``data`` to our non-blocking write end ``fd`` (waits while the pipe is full: backpressure)."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            await _ready(fd, write=True)
            continue
        view = view[written:]


async def stop_task(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it ended (whatever it ends with).

    The cancellation is repeated while the task runs on: code below may swallow one (``asyncio.wait_for`` in
    Python 3.11 does when its awaitable finishes at the moment it is cancelled), and a call must never outlive
    its client because of that.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    if not task.cancelled():
        task.exception()  # retrieved: an error of a cancelled operation is not "never retrieved"


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to the caller's (blocking) descriptor ``fd``; run in a thread."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
