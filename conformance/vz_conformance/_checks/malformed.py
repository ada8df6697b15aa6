"""malformed: Exec streams that break the framing rules are refused as INVALID_ARGUMENT; tty needs the extension.

These frames cannot be expressed through a ``Driver`` object, so the cases speak raw ``ExecClientMessage``s:
externally to the launched plugin, in-process to the driver served by the Runtime Protocol server every Python
driver is served with (``vz_core.rpc.serve_in_process``, on a private socket).
Each refusal must be a status carrying exactly one RuntimeError, and the Machine keeps running.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

import grpc

from vz_conformance import _frames as f
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._exec import chunks, collect
from vz_conformance._expect import expect_error, expect_ok
from vz_conformance._outcome import Outcome, Passed
from vz_conformance._processes import kill_host_marked
from vz_core import ExecSpec
from vz_core.rpc.pb import runtime_pb2 as pb

__all__ = [
    "CASES",
    "check_data_after_close",
    "check_empty_argv",
    "check_empty_data_frame",
    "check_eof_before_close",
    "check_missing_start",
    "check_second_start",
    "check_tty",
    "check_unset_payload",
]

Frames = Callable[[str, tuple[str, ...]], Sequence[pb.ExecClientMessage]]


async def _refused(ctx: CheckContext, what: str, frames: Frames, *, half_close: bool = False) -> Outcome:
    """The server must refuse the last frame of ``frames`` (or the half-close after them); nothing follows it."""
    req = await ctx.create("malformed")
    marker = f"vzc-marker-{secrets.token_hex(8)}"
    messages = frames(req.workspace_id, ctx.adapter.idle(30, marker))
    try:
        async with ctx.wire() as channel:
            outcome = await f.raw_exec(channel, messages, half_close=half_close)
    finally:
        if ctx.adapter.processes_visible_on_host:
            kill_host_marked(marker)  # a driver that did not stop the refused command must not leak it
    f.require_one_runtime_error(f"Exec ({what})", outcome, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    await ctx.require_status(req.workspace_id, "running", after=f"a refused Exec ({what})")
    return Passed()


async def check_missing_start(ctx: CheckContext) -> Outcome:
    """A stream whose first frame is stdin, not start → INVALID_ARGUMENT."""
    return await _refused(ctx, "first frame is stdin", lambda ws, argv: [f.stdin(b"data")])


async def check_second_start(ctx: CheckContext) -> Outcome:
    """A second start frame → INVALID_ARGUMENT."""
    return await _refused(ctx, "second start", lambda ws, argv: [f.start(ws, argv), f.start(ws, argv)])


async def check_empty_data_frame(ctx: CheckContext) -> Outcome:
    """A stdin frame with zero bytes → INVALID_ARGUMENT (empty input is close_stdin without data)."""
    return await _refused(ctx, "empty stdin frame", lambda ws, argv: [f.start(ws, argv), f.stdin(b"")])


async def check_unset_payload(ctx: CheckContext) -> Outcome:
    """A frame with no payload set → INVALID_ARGUMENT."""
    return await _refused(ctx, "unset payload", lambda ws, argv: [f.start(ws, argv), f.unset()])


async def check_eof_before_close(ctx: CheckContext) -> Outcome:
    """The client half-closes without sending close_stdin → INVALID_ARGUMENT."""
    return await _refused(
        ctx, "EOF before close_stdin", lambda ws, argv: [f.start(ws, argv), f.stdin(b"data")], half_close=True
    )


async def check_data_after_close(ctx: CheckContext) -> Outcome:
    """Data after close_stdin → INVALID_ARGUMENT."""
    return await _refused(
        ctx, "stdin after close_stdin", lambda ws, argv: [f.start(ws, argv), f.close_stdin(), f.stdin(b"late")]
    )


async def check_empty_argv(ctx: CheckContext) -> Outcome:
    """A start with an empty argv → INVALID_ARGUMENT, as a Driver call and as a frame."""
    req = await ctx.create("argv")
    spec = ExecSpec(workspace_id=req.workspace_id, argv=())
    await expect_error("Exec", lambda: collect(ctx.driver, spec, chunks(b"")), "INVALID_ARGUMENT", note="argv=[]")
    async with ctx.wire() as channel:
        outcome = await f.raw_exec(channel, [f.start(req.workspace_id, ())])
    f.require_one_runtime_error("Exec (empty argv)", outcome, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    return Passed()


async def check_tty(ctx: CheckContext) -> Outcome:
    """ExecStart.tty=true → UNSUPPORTED unless the extension service advertises tty (then it must work)."""
    req = await ctx.create("tty")
    spec = ExecSpec(workspace_id=req.workspace_id, argv=ctx.adapter.true(), tty=True)
    if ctx.ext.tty:
        result = await expect_ok("Exec", lambda: collect(ctx.driver, spec, chunks(b"")), note="tty=true advertised")
        result.require_success()
        return Passed(note="tty advertised and honoured")
    await expect_error(
        "Exec", lambda: collect(ctx.driver, spec, chunks(b"")), "UNSUPPORTED", note="tty=true without extensions.tty"
    )
    return Passed(note="tty refused as UNSUPPORTED")


CASES = (
    Case("malformed.missing_start", "First frame not a start: INVALID_ARGUMENT", check_missing_start),
    Case("malformed.second_start", "A second start frame: INVALID_ARGUMENT", check_second_start),
    Case("malformed.empty_data_frame", "An empty stdin frame: INVALID_ARGUMENT", check_empty_data_frame),
    Case("malformed.unset_payload", "A frame with no payload: INVALID_ARGUMENT", check_unset_payload),
    Case("malformed.eof_before_close", "Half-close before close_stdin: INVALID_ARGUMENT", check_eof_before_close),
    Case("malformed.data_after_close", "stdin after close_stdin: INVALID_ARGUMENT", check_data_after_close),
    Case("malformed.empty_argv", "A start with an empty argv: INVALID_ARGUMENT", check_empty_argv),
    Case("malformed.tty", "tty=true: UNSUPPORTED unless advertised through the extension service", check_tty),
)
