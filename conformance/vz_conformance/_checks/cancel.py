"""cancel: a cancelled or expired Exec kills the whole command tree; the Machine keeps running.

How an abandoned call looks to a caller is the same in both modes: the suite cancels the task consuming the
Exec (→ CANCELLED) or consumes it under ``asyncio.timeout(2)`` (→ TIMEOUT, DEADLINE_EXCEEDED on the wire).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._exec import ExecResult, chunks, close_iterator
from vz_conformance._expect import category_of, describe, ensure, fail
from vz_conformance._outcome import Outcome, Passed
from vz_conformance._processes import Tree
from vz_core import ExecSpec

__all__ = ["CASES", "check_blocked_stdin", "check_cancelled", "check_deadline"]

GONE_WITHIN = 10.0


class _Blocking:
    """Consumes an Exec in a task and signals once the command printed ``ready`` and all its ``pid`` lines."""

    def __init__(
        self,
        ctx: CheckContext,
        workspace_id: str,
        argv: tuple[str, ...],
        pid_lines: int,
        stdin: AsyncIterator[bytes],
        deadline: float | None = None,
    ) -> None:
        self.ctx = ctx
        self.spec = ExecSpec(workspace_id=workspace_id, argv=argv)
        self.pid_lines = pid_lines
        self.stdin = stdin
        self.deadline = deadline
        self.result = ExecResult(argv=argv)
        self.ready = asyncio.Event()
        self.pids: list[int] = []
        self.task: asyncio.Task[ExecResult] = asyncio.create_task(self._consume())

    def _scan(self) -> None:
        lines = self.result.stdout.decode(errors="replace").splitlines()
        self.pids = [int(line.split()[1]) for line in lines if line.startswith("pid ") and line.split()[1].isdigit()]
        if "ready" in lines and len(self.pids) >= self.pid_lines:
            self.ready.set()

    async def _consume(self) -> ExecResult:
        stream = self.ctx.driver.exec(self.spec, self.stdin)
        try:
            if self.deadline is None:
                async for event in stream:
                    self.result.record(event)
                    self._scan()
            else:
                async with asyncio.timeout(self.deadline):
                    async for event in stream:
                        self.result.record(event)
                        self._scan()
        finally:
            await close_iterator(stream)
        return self.result

    async def wait_ready(self, within: float = 10.0) -> None:
        waiter = asyncio.create_task(self.ready.wait())
        done, _ = await asyncio.wait({waiter, self.task}, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self.ready.is_set():
            return
        if self.task in done:
            exc = self.task.exception()
            got = describe(exc) if exc else f"the stream ended ({self.result.where()})"
        else:
            got = f"nothing after {within:g} s ({self.result.where()})"
        fail("Exec", f"the blocking command to print 'ready' and {self.pid_lines} 'pid' lines", got)

    async def outcome(self, within: float) -> str:
        """The category the consuming task ended with ("CANCELLED", "TIMEOUT", ...), or a failure text."""
        done, _ = await asyncio.wait({self.task}, timeout=within)
        if not done:
            return f"STILL_RUNNING (no end {within:g} s after the call was abandoned)"
        if self.task.cancelled():
            return "CANCELLED"
        exc = self.task.exception()
        if exc is None:
            return f"NORMAL_END ({self.result.where()})"
        return category_of(exc) if category_of(exc) != "NOT_A_DRIVER_ERROR" else describe(exc)

    async def abandon(self) -> None:
        """Make sure the consuming task is finished (cleanup after a failure)."""
        if not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self.task), 5)


async def _never_ending() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()
    yield b""  # pragma: no cover - never reached


async def _machine_still_running(ctx: CheckContext, workspace_id: str, after: str) -> None:
    await ctx.require_status(workspace_id, "running", after=after)
    result = await ctx.run_ok(workspace_id, ctx.adapter.true())
    ensure(result.exit is not None, "Exec", f"a follow-up command to run after {after}", result.where())


async def _run_case(ctx: CheckContext, *, deadline: float | None, blocked_stdin: bool) -> Outcome:
    req = await ctx.create("cancel")
    marker = f"vzc-marker-{secrets.token_hex(8)}"
    if blocked_stdin:
        argv, pid_lines = ctx.adapter.blocking_on_stdin(marker), 1
        stdin: AsyncIterator[bytes] = _never_ending()
    else:
        argv, pid_lines = ctx.adapter.blocking_tree(marker)
        stdin = chunks(b"")
    blocking = _Blocking(ctx, req.workspace_id, argv, pid_lines, stdin, deadline)
    try:
        await blocking.wait_ready()
        tree = Tree(ctx, req.workspace_id, blocking.pids, marker)
        await tree.observe()
        if deadline is None:
            blocking.task.cancel()
            expected, what = "CANCELLED", "cancelling the Exec"
        else:
            expected, what = "TIMEOUT", f"its {deadline:g} s deadline"
        got = await blocking.outcome(within=(deadline or 0) + 10)
        if got != expected:
            await tree.kill_leftovers(tree.identities)
            fail("Exec", f"the call to end as {expected} after {what}", got)
        await tree.require_gone(GONE_WITHIN, after=what)
    finally:
        await blocking.abandon()
    await _machine_still_running(ctx, req.workspace_id, after=what)
    return Passed()


async def check_cancelled(ctx: CheckContext) -> Outcome:
    """A blocking command (child + grandchild) cancelled after 'ready' → CANCELLED; the tree is gone within 10 s
    (pid + start time + marker); the Machine still runs commands."""
    return await _run_case(ctx, deadline=None, blocked_stdin=False)


async def check_deadline(ctx: CheckContext) -> Outcome:
    """The same command under a 2 s deadline → TIMEOUT (DEADLINE_EXCEEDED); the tree is gone; the Machine runs."""
    return await _run_case(ctx, deadline=2.0, blocked_stdin=False)


async def check_blocked_stdin(ctx: CheckContext) -> Outcome:
    """A command blocked reading a stdin the client never closes is still cancelled → CANCELLED, gone."""
    return await _run_case(ctx, deadline=None, blocked_stdin=True)


CASES = (
    Case(
        "cancel.cancelled",
        "Cancel after 'ready': CANCELLED, command tree gone within 10 s, Machine running",
        check_cancelled,
    ),
    Case(
        "cancel.deadline",
        "2 s deadline: DEADLINE_EXCEEDED, command tree gone within 10 s, Machine running",
        check_deadline,
    ),
    Case("cancel.blocked_stdin", "Cancellation works while the command blocks on stdin", check_blocked_stdin),
)
