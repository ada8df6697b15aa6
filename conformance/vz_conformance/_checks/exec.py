"""exec: bytes, arguments, streams, exits, frame rules, backpressure, user/workdir/environment."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator

from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._exec import ExecResult, chunks, close_iterator
from vz_conformance._expect import category_of, describe, ensure, expect_ok, fail
from vz_conformance._outcome import Outcome, Passed
from vz_core import MAX_CHUNK, ExecSpec
from vz_core.errors import DriverError

__all__ = [
    "CASES",
    "check_argv_verbatim",
    "check_binary_roundtrip",
    "check_duplex_backpressure",
    "check_early_exit",
    "check_empty_stdin",
    "check_environment",
    "check_nonzero_exit",
    "check_output_frames",
    "check_shell_command",
    "check_signal_exit",
    "check_stdin_to_stderr",
    "check_user",
    "check_workdir",
]

BIG = 12 * 1024 * 1024
BINARY = bytes(range(256)) + b"\x00\xff\x80\n\r\x01" * 200 + b"\r\n\x00"
ARGS = ["two words", 'it\'s "quoted"', "$HOME;$(echo unwanted)", "", "ünï 日本 ✓", "*", "a\\b", "tab\tand\nnewline"]


def _payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


async def check_binary_roundtrip(ctx: CheckContext) -> Outcome:
    """cat echoes bytes 0x00 0xFF 0x80 \\n \\r 0x01 (and all 256 values) exactly, stderr empty."""
    req = await ctx.create("binary")
    result = await ctx.run_ok(req.workspace_id, ctx.adapter.cat(), BINARY)
    ensure(
        result.stdout == BINARY,
        "Exec",
        f"stdout identical to the {len(BINARY)} stdin bytes",
        f"{len(result.stdout)} bytes, first difference at {_first_difference(result.stdout, BINARY)}",
    )
    ensure(result.stderr == b"", "Exec", "empty stderr", result.stderr[:200])
    return Passed()


def _first_difference(a: bytes, b: bytes) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


async def check_empty_stdin(ctx: CheckContext) -> Outcome:
    """cat with empty input (close_stdin, no data frame) prints nothing and exits 0."""
    req = await ctx.create("empty")
    result = await ctx.run_ok(req.workspace_id, ctx.adapter.cat(), b"")
    ensure(result.stdout == b"" and result.stderr == b"", "Exec", "no output for empty stdin", result.where())
    return Passed()


async def check_argv_verbatim(ctx: CheckContext) -> Outcome:
    """Arguments with spaces, quotes, $HOME;$(...), the empty string and unicode arrive verbatim."""
    req = await ctx.create("argv")
    result = await ctx.run_ok(req.workspace_id, ctx.adapter.print_args(ARGS))
    got = result.stdout.split(b"\x00")
    if got and got[-1] == b"":
        got = got[:-1]
    expected = [arg.encode() for arg in ARGS]
    for index, (want, have) in enumerate(zip(expected, got, strict=False)):
        ensure(
            want == have,
            "Exec",
            f"argument {index + 1} verbatim {want!r} (no shell re-parsing)",
            have,
            note=f"argv={list(ctx.adapter.print_args(ARGS))!r}",
        )
    ensure(len(got) == len(expected), "Exec", f"{len(expected)} arguments", f"{len(got)}: {got!r}")
    return Passed()


async def check_shell_command(ctx: CheckContext) -> Outcome:
    """An explicit shell (sh -c) runs its script: variables and arithmetic are the shell's, stdout exact."""
    req = await ctx.create("shell")
    argv, expected = ctx.adapter.shell_command()
    result = await ctx.run_ok(req.workspace_id, argv)
    ensure(result.stdout == expected, "Exec", f"stdout {expected!r}", result.stdout)
    return Passed()


async def check_stdin_to_stderr(ctx: CheckContext) -> Outcome:
    """A command copying stdin to stderr: stderr equals stdin, stdout stays empty (streams kept apart)."""
    req = await ctx.create("stderr")
    data = _payload(256 * 1024, 1)
    result = await ctx.run_ok(req.workspace_id, ctx.adapter.cat_to_stderr(), data)
    ensure(result.stdout == b"", "Exec", "empty stdout", f"{len(result.stdout)} bytes")
    ensure(
        result.stderr == data, "Exec", f"stderr identical to the {len(data)} stdin bytes", f"{len(result.stderr)} bytes"
    )
    return Passed()


async def check_duplex_backpressure(ctx: CheckContext) -> Outcome:
    """12 MiB in, 12 MiB out on stdout and on stderr in frames of 1..32768 bytes; while the consumer is paused,
    Info on the same driver connection answers (backpressure does not block other RPCs)."""
    req = await ctx.create("duplex")
    data = _payload(BIG, 2)
    spec = ExecSpec(workspace_id=req.workspace_id, argv=ctx.adapter.tee_both())
    result = ExecResult(argv=spec.argv)
    stream = ctx.driver.exec(spec, chunks(data))
    iterator = stream.__aiter__()
    try:
        async with asyncio.timeout(30):
            result.record(await iterator.__anext__())
        try:
            async with asyncio.timeout(10):
                await ctx.driver.info()
        except TimeoutError:
            fail(
                "Info",
                "an answer within 10 s while an Exec consumer is paused",
                "no answer",
                note="a paused Exec reader must throttle only its own stream",
            )
        async with asyncio.timeout(60):
            async for event in iterator:
                result.record(event)
    except TimeoutError:
        fail("Exec", "the 12 MiB duplex to finish within 60 s", "still streaming", note=result.where())
    except DriverError as exc:
        fail("Exec", "the 12 MiB duplex to complete", describe(exc), note=result.where())
    finally:
        await close_iterator(stream)
    result.require_success()
    problems = result.frame_problems(sizes_only=True)
    ensure(not problems, "Exec", "every output frame 1..32768 bytes", "; ".join(problems[:5]))
    digest = hashlib.sha256(data).hexdigest()
    for name, got in (("stdout", result.stdout), ("stderr", result.stderr)):
        ensure(
            hashlib.sha256(got).hexdigest() == digest,
            "Exec",
            f"{name} identical to the 12 MiB stdin",
            f"{len(got)} bytes, first difference at {_first_difference(got, data)}",
        )
    return Passed()


async def check_nonzero_exit(ctx: CheckContext) -> Outcome:
    """A failing command: exit frame with its code, empty signal, its stderr diagnostic, and no RPC error."""
    req = await ctx.create("nonzero")
    message = "vz-conformance diagnostic"
    result = await expect_ok(
        "Exec",
        lambda: ctx.run(req.workspace_id, ctx.adapter.fail_with(3, message)),
        note="a non-zero exit travels in the exit frame, the RPC status is OK",
    )
    exit_ = result.require_exit()
    ensure(exit_.exit_code == 3 and exit_.signal == "", "Exec", "exit frame exit_code=3, signal=''", exit_)
    ensure(message.encode() in result.stderr, "Exec", f"stderr containing {message!r}", result.stderr[:300])
    return Passed()


async def check_signal_exit(ctx: CheckContext) -> Outcome:
    """A command killed by a signal reports a non-empty signal in its exit frame (never success)."""
    req = await ctx.create("signal")
    result = await expect_ok("Exec", lambda: ctx.run(req.workspace_id, ctx.adapter.kill_self()))
    exit_ = result.require_exit()
    ensure(bool(exit_.signal), "Exec", "exit frame with a non-empty signal for a command killed by SIGKILL", exit_)
    return Passed()


async def check_early_exit(ctx: CheckContext) -> Outcome:
    """A command that exits without reading stdin while the client still streams 12 MiB: exit 0, no error."""
    req = await ctx.create("early")
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        block = _payload(MAX_CHUNK, 3)
        while sent < BIG:
            sent += len(block)
            yield block

    result = await expect_ok(
        "Exec",
        lambda: ctx.run(req.workspace_id, ctx.adapter.true(), endless(), within=60),
        note="the command exits before its stdin is closed",
    )
    result.require_success()
    return Passed()


async def check_output_frames(ctx: CheckContext) -> Outcome:
    """Every output frame carries 1..32768 bytes, exactly one exit frame ends the stream, nothing after it."""
    req = await ctx.create("frames")
    data = _payload(200 * 1024 + 17, 4)
    result = await expect_ok("Exec", lambda: ctx.run(req.workspace_id, ctx.adapter.tee_both(), data))
    problems = result.frame_problems()
    ensure(
        not problems,
        "Exec",
        "every output frame 1..32768 bytes, exactly one exit, nothing after it",
        "; ".join(problems[:5]),
        note=f"argv={list(result.argv)!r}",
    )
    result.require_success()
    ensure(
        result.stdout == data and result.stderr == data,
        "Exec",
        "stdout and stderr identical to stdin",
        f"{len(result.stdout)} and {len(result.stderr)} bytes of {len(data)}",
    )
    return Passed()


async def _honoured_or_unsupported(
    ctx: CheckContext, what: str, spec_kw: dict[str, object], argv: tuple[str, ...], expected: bytes
) -> Outcome:
    req = await ctx.create(what)
    try:
        result = await ctx.run(req.workspace_id, argv, **spec_kw)  # type: ignore[arg-type]
    except AssertionError:
        raise
    except Exception as exc:
        if category_of(exc) == "UNSUPPORTED":
            return Passed(note=f"ExecStart.{what} refused as UNSUPPORTED")
        fail("Exec", f"ExecStart.{what} honoured, or refused as UNSUPPORTED", describe(exc))
    result.require_success()
    ensure(
        result.stdout.rstrip(b"\n") == expected,
        "Exec",
        f"ExecStart.{what} honoured: stdout {expected!r}",
        result.stdout,
        note=f"argv={list(argv)!r}",
    )
    return Passed()


async def check_user(ctx: CheckContext) -> Outcome:
    """ExecStart.user is honoured (the command runs as that user) or refused as UNSUPPORTED."""
    user = ctx.adapter.exec_user
    return await _honoured_or_unsupported(ctx, "user", {"user": user}, ctx.adapter.print_user(), user.encode())


async def check_workdir(ctx: CheckContext) -> Outcome:
    """ExecStart.workdir is honoured (the command starts there) or refused as UNSUPPORTED."""
    workdir = ctx.adapter.exec_workdir
    return await _honoured_or_unsupported(
        ctx, "workdir", {"workdir": workdir}, ctx.adapter.print_workdir(), workdir.encode()
    )


async def check_environment(ctx: CheckContext) -> Outcome:
    """ExecStart.environment is honoured (exact values, no expansion) or refused as UNSUPPORTED."""
    value = "value with spaces $HOME ünï"
    return await _honoured_or_unsupported(
        ctx, "environment", {"env": {"VZC_PROBE": value}}, ctx.adapter.print_env("VZC_PROBE"), value.encode()
    )


CASES = (
    Case(
        "exec.binary_roundtrip",
        "Binary stdin (0x00 0xFF 0x80 \\n \\r 0x01 ...) round-trips exactly through cat",
        check_binary_roundtrip,
    ),
    Case("exec.empty_stdin", "Empty stdin (no data frames): no output, exit 0", check_empty_stdin),
    Case(
        "exec.argv_verbatim",
        "Spaces, quotes, $HOME;$(...), '' and unicode arguments arrive verbatim",
        check_argv_verbatim,
    ),
    Case("exec.shell_command", "An explicit sh -c script runs with shell semantics", check_shell_command),
    Case("exec.stdin_to_stderr", "stdin copied to stderr only: stdout empty", check_stdin_to_stderr),
    Case(
        "exec.duplex_backpressure",
        "12 MiB duplex on stdout+stderr in <=32 KiB frames; Info answers while paused",
        check_duplex_backpressure,
    ),
    Case(
        "exec.nonzero_exit",
        "Non-zero exit: code in the exit frame, empty signal, stderr diagnostic, status OK",
        check_nonzero_exit,
    ),
    Case("exec.signal_exit", "A signal-terminated command reports a non-empty signal", check_signal_exit),
    Case("exec.early_exit", "Early exit while the client streams 12 MiB: exit 0, no error", check_early_exit),
    Case("exec.output_frames", "Output frames 1..32768 bytes, exactly one exit, nothing after it", check_output_frames),
    Case("exec.user", "ExecStart.user honoured or UNSUPPORTED", check_user),
    Case("exec.workdir", "ExecStart.workdir honoured or UNSUPPORTED", check_workdir),
    Case("exec.environment", "ExecStart.environment honoured or UNSUPPORTED", check_environment),
)
