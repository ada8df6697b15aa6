"""pty: terminal sessions (``Driver.terminal``, ``vz.machine.v1.MachineExtensions/ExecPty``), or UNSUPPORTED.

Gated by ``extensions.terminal``: a driver that does not declare it must refuse a session as UNSUPPORTED.
The commands are POSIX ``sh`` with ``stty``, ``cat``, ``head``, ``tr`` and ``sleep`` (busybox has them all).
A terminal turns ``\\n`` into ``\\r\\n`` on output and echoes input, so checks look for text, not exact bytes,
except where the output has no newline at all (the 1 MiB case, which must arrive byte for byte).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from collections.abc import AsyncIterator

from vz_conformance import _capabilities as cap
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._exec import close_iterator
from vz_conformance._expect import describe, ensure, expect_error, fail
from vz_conformance._outcome import Outcome, Passed
from vz_conformance._processes import Tree
from vz_core import (
    MAX_CHUNK,
    ExecExit,
    TerminalData,
    TerminalEof,
    TerminalEvent,
    TerminalInput,
    TerminalOutput,
    TerminalResize,
    TerminalSpec,
)

__all__ = [
    "CASES",
    "check_bulk_output",
    "check_cancel",
    "check_ctrl_c",
    "check_echo",
    "check_eof",
    "check_exit_code",
    "check_resize",
    "check_size",
]

RPC = "ExecPty"
BULK = 1024 * 1024
WITHIN = 15.0


class _Keys:
    """The session's input: ``send()`` items while reading; ``end()`` finishes the iterator."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[TerminalInput | None] = asyncio.Queue()

    def send(self, *items: TerminalInput | bytes) -> None:
        for item in items:
            self._queue.put_nowait(TerminalData(item) if isinstance(item, bytes) else item)

    def end(self) -> None:
        self._queue.put_nowait(None)

    async def stream(self) -> AsyncIterator[TerminalInput]:
        while (item := await self._queue.get()) is not None:
            yield item


class _Session:
    """One terminal session: what it displayed, its exit, and the frame rules checked as events arrive."""

    def __init__(self, ctx: CheckContext, spec: TerminalSpec) -> None:
        self.workspace_id = spec.workspace_id
        self.keys = _Keys()
        self.events: AsyncIterator[TerminalEvent] = ctx.driver.terminal(spec, self.keys.stream())
        self.output = b""
        self.exit: ExecExit | None = None
        self.argv = spec.argv

    def where(self) -> str:
        tail = self.output[-300:].decode(errors="replace")
        return f"argv={list(self.argv)!r}, output so far (last 300 bytes): {tail!r}"

    async def _next(self) -> bool:
        try:
            event = await self.events.__anext__()
        except StopAsyncIteration:
            return False
        except Exception as exc:
            fail(RPC, "a terminal session that runs", describe(exc), note=self.where())
        if self.exit is not None:
            fail(RPC, "nothing after the exit", repr(event), note=self.where())
        if isinstance(event, TerminalOutput):
            ensure(
                1 <= len(event.data) <= MAX_CHUNK,
                RPC,
                f"output frames of 1..{MAX_CHUNK} bytes",
                f"{len(event.data)} bytes",
            )
            self.output += event.data
        elif isinstance(event, ExecExit):
            self.exit = event
        else:
            fail(RPC, "TerminalOutput or ExecExit events", repr(event))
        return True

    async def until(self, pattern: bytes, what: str, within: float = WITHIN) -> re.Match[bytes]:
        async def read() -> re.Match[bytes]:
            while (found := re.search(pattern, self.output)) is None:
                if not await self._next() or self.exit is not None:
                    fail(RPC, what, f"the session ended first (exit {self.exit})", note=self.where())
            return found

        try:
            return await asyncio.wait_for(read(), within)
        except TimeoutError:
            fail(RPC, what, f"nothing matching after {within:g} s", note=self.where())

    async def finish(self, what: str, within: float = WITHIN) -> ExecExit:
        async def read() -> None:
            while await self._next():
                pass

        try:
            await asyncio.wait_for(read(), within)
        except TimeoutError:
            fail(RPC, what, f"no end after {within:g} s", note=self.where())
        finally:
            self.keys.end()
        if self.exit is None:
            fail(RPC, "exactly one exit at the end of the session", "the stream ended without one", note=self.where())
        return self.exit

    async def close(self) -> None:
        self.keys.end()
        await close_iterator(self.events)


@contextlib.asynccontextmanager
async def _session(ctx: CheckContext, purpose: str, argv: tuple[str, ...], **kw: object) -> AsyncIterator[_Session]:
    req = await ctx.create(purpose)
    session = _Session(ctx, TerminalSpec(req.workspace_id, argv, **kw))  # type: ignore[arg-type]
    try:
        yield session
    finally:
        await session.close()


async def _refusal(ctx: CheckContext) -> Outcome:
    req = await ctx.create("nopty")

    async def refused() -> None:
        events = ctx.driver.terminal(TerminalSpec(req.workspace_id, ctx.adapter.true()), _Keys().stream())
        try:
            await expect_error(RPC, lambda: events.__anext__(), "UNSUPPORTED", note="extensions.terminal=false")
        finally:
            await close_iterator(events)

    return await ctx.not_applicable(cap.TERMINAL, "terminal sessions refused as UNSUPPORTED", refused)


async def check_size(ctx: CheckContext) -> Outcome:
    """The window size of the start is the terminal's size before the command runs; TERM is forwarded."""
    if not ctx.ext.terminal:
        return await _refusal(ctx)
    argv = ("sh", "-c", 'stty size; echo "term=$TERM"; [ -t 0 ] && echo "is-a-tty"')
    async with _session(ctx, "ptysize", argv, rows=33, cols=101, term="vt100") as s:
        s.keys.send(TerminalEof())
        exit_event = await s.finish("the command to print its size and exit")
        text = s.output.decode(errors="replace")
        ensure("33 101" in text, RPC, "'stty size' printing '33 101' (the start's rows and cols)", text[-200:])
        ensure("term=vt100" in text, RPC, "TERM=vt100 (the start's term)", text[-200:])
        ensure("is-a-tty" in text, RPC, "standard input to be a terminal", text[-200:])
        ensure(exit_event.success, RPC, "exit code 0", exit_event)
    return Passed()


async def check_resize(ctx: CheckContext) -> Outcome:
    """A resize sets the window size (``stty size``) and sends SIGWINCH to the foreground process group."""
    if not ctx.ext.terminal:
        return await _refusal(ctx)
    script = "n=0; trap 'n=$((n+1)); echo \"winch $n: $(stty size)\"; [ $n -ge 2 ] && exit 0' WINCH; echo ready; "
    argv = ("sh", "-c", script + "while :; do sleep 1; done")
    async with _session(ctx, "ptyresize", argv, rows=24, cols=80) as s:
        await s.until(rb"ready", "the command to print 'ready'")
        s.keys.send(TerminalResize(40, 120))
        await s.until(rb"winch 1: 40 120", "SIGWINCH and 'stty size' = '40 120' after a resize to 40x120")
        s.keys.send(TerminalResize(50, 132))
        await s.until(rb"winch 2: 50 132", "SIGWINCH and 'stty size' = '50 132' after a second resize")
        exit_event = await s.finish("the command to exit after its second SIGWINCH")
        ensure(exit_event.success, RPC, "exit code 0", exit_event)
    return Passed()


async def check_echo(ctx: CheckContext) -> Outcome:
    """Typed input is echoed by the terminal and read by the command as a line."""
    if not ctx.ext.terminal:
        return await _refusal(ctx)
    word = f"typed{secrets.token_hex(4)}"
    async with _session(ctx, "ptyecho", ("sh", "-c", 'echo ready; read line; echo "got:$line"')) as s:
        await s.until(rb"ready", "the command to print 'ready'")
        s.keys.send(word.encode() + b"\r")
        await s.until(f"got:{word}".encode(), f"the command to read the line and print 'got:{word}'")
        echoed = s.output.count(word.encode())
        ensure(echoed >= 2, RPC, f"{word!r} twice: the terminal's echo and the command's output", f"{echoed} time(s)")
        exit_event = await s.finish("the command to exit")
        ensure(exit_event.success, RPC, "exit code 0", exit_event)
    return Passed()


async def check_ctrl_c(ctx: CheckContext) -> Outcome:
    """Ctrl-C (byte 0x03) is a SIGINT to the foreground process group, not the end of the call."""
    if not ctx.ext.terminal:
        return await _refusal(ctx)
    argv = ("sh", "-c", 'trap "echo got-int; exit 5" INT; echo ready; while :; do sleep 1; done')
    async with _session(ctx, "ptyintr", argv) as s:
        await s.until(rb"ready", "the command to print 'ready'")
        s.keys.send(b"\x03")
        await s.until(rb"got-int", "SIGINT to the foreground process group after Ctrl-C (the trap prints 'got-int')")
        await s.finish("the command to exit after its trap")
    return Passed()


async def check_eof(ctx: CheckContext) -> Outcome:
    """Ctrl-D (byte 0x04) at the start of a line is end of file for a reading command (cat exits 0)."""
    if not ctx.ext.terminal:
        return await _refusal(ctx)
    async with _session(ctx, "ptyeof", ("sh", "-c", "echo ready; cat; echo cat-done")) as s:
        await s.until(rb"ready", "the command to print 'ready'")
        s.keys.send(b"line\r")
        await s.until(rb"line", "cat to copy the line")
        s.keys.send(b"\x04")
        await s.until(rb"cat-done", "cat to end at Ctrl-D")
        exit_event = await s.finish("the command to exit")
        ensure(exit_event.success, RPC, "exit code 0", exit_event)
    return Passed()


async def check_exit_code(ctx: CheckContext) -> Outcome:
    """The command's exit code is the session's exit; a death by signal is 128 + n with the signal's name."""
    if not ctx.ext.terminal:
        return await _refusal(ctx)
    async with _session(ctx, "ptyexit", ("sh", "-c", "exit 7")) as s:
        s.keys.send(TerminalEof())
        exit_event = await s.finish("the command to exit")
        ensure(exit_event == ExecExit(7), RPC, "ExecExit(exit_code=7)", exit_event)
    async with _session(ctx, "ptykill", ("sh", "-c", "kill -KILL $$")) as s:
        s.keys.send(TerminalEof())
        exit_event = await s.finish("the command to die")
        ensure(exit_event == ExecExit(137, "SIGKILL"), RPC, "ExecExit(137, 'SIGKILL')", exit_event)
    return Passed()


async def check_bulk_output(ctx: CheckContext) -> Outcome:
    """1 MiB of output (no newline, so the terminal changes nothing) arrives complete, in order."""
    if not ctx.ext.terminal:
        return await _refusal(ctx)
    argv = ("sh", "-c", f"head -c {BULK} /dev/zero | tr '\\000' 'v'")
    async with _session(ctx, "ptybulk", argv) as s:
        s.keys.send(TerminalEof())
        exit_event = await s.finish("1 MiB of output and the exit", within=120)
        ensure(exit_event.success, RPC, "exit code 0", exit_event)
        ensure(
            s.output == b"v" * BULK,
            RPC,
            f"exactly {BULK} bytes 'v'",
            f"{len(s.output)} bytes, {s.output.count(b'v')} of them 'v'",
        )
    return Passed()


async def check_cancel(ctx: CheckContext) -> Outcome:
    """Closing a session before its exit kills the command and every process of its session; the Machine runs."""
    if not ctx.ext.terminal:
        return await _refusal(ctx)
    marker = f"vzc-marker-{secrets.token_hex(8)}"
    argv, pid_lines = ctx.adapter.blocking_tree(marker)
    async with _session(ctx, "ptycancel", argv) as s:
        await s.until(rb"ready", "the blocking command to print 'ready'")
        await s.until(rb"(?:pid \d+(?s:.*?)){%d}" % pid_lines, f"the blocking command's {pid_lines} 'pid' lines")
        pids = [int(p) for p in re.findall(rb"pid (\d+)", s.output)]
        req_id = s.workspace_id
        tree = Tree(ctx, req_id, pids, marker)
        await tree.observe()
        await s.close()
        await tree.require_gone(10.0, after="closing the terminal session")
    await ctx.require_status(req_id, "running", after="a cancelled terminal session")
    return Passed()


_GATE = (cap.TERMINAL,)

CASES = (
    Case(
        "pty.size",
        "Terminal: the start's size is the size before the command runs; TERM forwarded",
        check_size,
        _GATE,
    ),
    Case("pty.resize", "Terminal: a resize changes 'stty size' and sends SIGWINCH", check_resize, _GATE),
    Case("pty.echo", "Terminal: typed input is echoed and read as a line", check_echo, _GATE),
    Case("pty.ctrl_c", "Terminal: Ctrl-C is SIGINT to the foreground group, the call goes on", check_ctrl_c, _GATE),
    Case("pty.eof", "Terminal: Ctrl-D ends a reading command's input", check_eof, _GATE),
    Case("pty.exit_code", "Terminal: exit code, and 128+n with the name for a signal death", check_exit_code, _GATE),
    Case("pty.bulk_output", "Terminal: 1 MiB of output without loss", check_bulk_output, _GATE),
    Case(
        "pty.cancel",
        "Terminal: closing the session kills its process tree; the Machine runs",
        check_cancel,
        _GATE,
    ),
)
