"""`vz exec` on the terminal: wire stdin/stdout/stderr and signals to the Environment layer's exec flow.

Selecting the Machine, obtaining its driver, running the command and classifying errors belong to
``vz_core.env`` (``prepare_exec``, ``execute``); this module only moves bytes and turns the outcome into an exit
status. This path is performance sensitive (B7): it imports neither pydantic nor rich.

Signals: SIGINT (Ctrl-C), SIGTERM and SIGHUP cancel the exec stream, the driver kills the command and its
descendants, and vz exits 128+N. The command's own death by signal N also exits 128+N.

`vz exec -t` / `-it` (``run_terminal``) runs the command on a terminal inside the Machine through
``vz_core.env.execute_terminal``: our terminal goes raw (with -i) and only bytes cross; its descriptor never
leaves this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from vz_core._types import MAX_CHUNK, TERMINAL_COLS, TERMINAL_ROWS, ExecExit

if TYPE_CHECKING:
    from vz_core.env import Context, ExecTarget

__all__ = ["NOT_A_TTY", "exit_code_of", "run_exec", "run_terminal"]

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


# Terminal sessions (`vz exec -t`, `-it`) ----------------------------------------------------------------------

NOT_A_TTY = "the input device is not a TTY"
"""The error of `vz exec -it` when stdin is not a terminal (docker's words, so scripts written for it match)."""

_SESSION_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _window(fds: tuple[int, ...]) -> tuple[int, int] | None:
    """(rows, cols) of the first of ``fds`` that is a terminal with a size, or None."""
    for fd in fds:
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        if size.lines > 0 and size.columns > 0:
            return size.lines, size.columns
    return None


def run_terminal(
    ctx: Context,
    *,
    argv: list[str],
    environment: str | None,
    machine: str | None,
    workdir: str | None,
    interactive: bool,
) -> int:
    """`vz exec -t` (``interactive``: `-it`): the command on a new terminal in the Machine; the exit status.

    With ``interactive`` our stdin must be a terminal (else ``UserError(NOT_A_TTY)``, before anything is
    selected); it goes raw for the session, every byte typed is sent as it is (Ctrl-C, Ctrl-Z, Ctrl-\\ reach
    the Machine's terminal, they do not stop vz), and its settings are restored on every way out. Without it
    stdin is not read (the Machine's terminal sees no input) and Ctrl-C ends the session like a plain exec.
    The window size is sent at start and on every SIGWINCH; TERM is forwarded.
    """
    from vz_core.env import prepare_exec
    from vz_core.errors import UserError

    if interactive and not os.isatty(0):
        raise UserError(NOT_A_TTY)
    target = prepare_exec(ctx, environment=environment, machine=machine)
    return asyncio.run(_terminal(ctx, target, argv, workdir, interactive))


class _RawMode:
    """Our terminal (fd 0) in raw mode for the session; ``restore()`` (idempotent) puts every setting back."""

    def __init__(self, fd: int) -> None:
        import termios
        import tty

        self._fd = fd
        self._saved: list[Any] | None = termios.tcgetattr(fd)
        tty.setraw(fd, termios.TCSANOW)

    def restore(self) -> None:
        import termios

        saved, self._saved = self._saved, None
        if saved is not None:
            with contextlib.suppress(OSError, termios.error):  # a hung-up terminal has no settings left
                termios.tcsetattr(self._fd, termios.TCSADRAIN, saved)


async def _terminal(ctx: Context, target: ExecTarget, argv: list[str], workdir: str | None, interactive: bool) -> int:
    from vz_core._types import TerminalData, TerminalEof, TerminalInput, TerminalResize
    from vz_core.env import execute_terminal

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []
    queue: asyncio.Queue[TerminalInput] = asyncio.Queue()
    size = _window((0, 1, 2)) or (TERMINAL_ROWS, TERMINAL_COLS)
    interrupting = _SESSION_SIGNALS if interactive else _FORWARDED

    def on_signal(signum: int) -> None:
        received.append(signum)
        task.cancel()

    def on_winch() -> None:
        now = _window((0, 1, 2))
        if now is not None:
            queue.put_nowait(TerminalResize(*now))

    def on_keys() -> None:
        try:
            data = os.read(0, MAX_CHUNK)
        except OSError:
            data = b""
        if data:
            queue.put_nowait(TerminalData(data))
        else:  # our terminal is gone: no more input
            loop.remove_reader(0)
            queue.put_nowait(TerminalEof())

    async def keys() -> AsyncIterator[TerminalInput]:
        while True:
            yield await queue.get()

    raw: _RawMode | None = None
    for sig in interrupting:
        loop.add_signal_handler(sig, on_signal, sig)
    loop.add_signal_handler(signal.SIGWINCH, on_winch)
    try:
        if interactive:
            raw = _RawMode(0)
            loop.add_reader(0, on_keys)
        else:
            queue.put_nowait(TerminalEof())
        event = await execute_terminal(
            ctx,
            target,
            argv,
            keys(),
            lambda data: _write_all(1, data),
            rows=size[0],
            cols=size[1],
            term=os.environ.get("TERM", ""),
            workdir=workdir,
        )
        return exit_code_of(event)
    except asyncio.CancelledError:
        if received:
            return 128 + received[0]
        raise
    except BrokenPipeError:
        return 128 + signal.SIGPIPE
    finally:
        if interactive:
            loop.remove_reader(0)
        if raw is not None:
            raw.restore()
        loop.remove_signal_handler(signal.SIGWINCH)
        for sig in interrupting:
            loop.remove_signal_handler(sig)
