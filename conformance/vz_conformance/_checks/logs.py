"""logs: the main process's merged output as a finite stream of 1..32768-byte chunks, or UNSUPPORTED.

The output is kept when the Machine stops: Logs of a stopped Machine answers with what its last run wrote,
and never starts the Machine (Exec on a stopped Machine is refused: ``lifecycle.stopped_exec_refused``).
"""

from __future__ import annotations

import asyncio
import string
import time

from vz_conformance import _capabilities as cap
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._expect import ensure, expect_error, expect_ok
from vz_conformance._outcome import Outcome, Passed
from vz_core import MAX_CHUNK

__all__ = ["CASES", "check_chunk_sizes", "check_kept_after_stop", "check_merged_exact"]

# stdout uses letters only and stderr digits only, so the merged stream can be split back exactly whatever the
# interleaving; both are larger than one chunk.
OUT = (string.ascii_letters * 900)[:45_000]
ERR = (string.digits * 4000)[:38_000]


async def _logged_machine(ctx: CheckContext) -> tuple[str, list[bytes]]:
    """Create a Machine whose main process writes OUT and ERR; read Logs until both are there (≤ 15 s)."""
    entrypoint, args = ctx.adapter.logs_main(OUT, ERR)
    req = await ctx.create("logs", entrypoint=entrypoint, args=args)
    deadline = time.monotonic() + 15
    while True:
        chunks = await expect_ok("Logs", lambda: ctx.logs(req.workspace_id), note="a running Machine")
        if sum(len(c) for c in chunks) >= len(OUT) + len(ERR) or time.monotonic() > deadline:
            return req.workspace_id, chunks
        await asyncio.sleep(0.2)


async def _refusal(ctx: CheckContext) -> Outcome:
    req = await ctx.create("nologs")
    return await ctx.not_applicable(
        cap.LOGS,
        "Logs refused as UNSUPPORTED",
        lambda: expect_error("Logs", lambda: ctx.logs(req.workspace_id), "UNSUPPORTED", note="capabilities.logs=false"),
    )


async def check_merged_exact(ctx: CheckContext) -> Outcome:
    """Logs is finite and holds exactly the main process's stdout and stderr bytes, merged."""
    if not ctx.caps.logs:
        return await _refusal(ctx)
    _, chunks = await _logged_machine(ctx)
    data = b"".join(chunks)
    letters = bytes(b for b in data if chr(b) in string.ascii_letters)
    digits = bytes(b for b in data if chr(b) in string.digits)
    ensure(
        letters == OUT.encode(),
        "Logs",
        f"the main process's {len(OUT)} stdout bytes exactly once, in order",
        f"{len(letters)} stdout bytes",
    )
    ensure(
        digits == ERR.encode(),
        "Logs",
        f"the main process's {len(ERR)} stderr bytes exactly once, in order",
        f"{len(digits)} stderr bytes",
    )
    ensure(
        len(data) == len(OUT) + len(ERR),
        "Logs",
        f"{len(OUT) + len(ERR)} bytes in total (nothing else)",
        f"{len(data)} bytes",
    )
    return Passed()


async def check_chunk_sizes(ctx: CheckContext) -> Outcome:
    """Every Logs chunk carries 1..32768 bytes."""
    if not ctx.caps.logs:
        return await _refusal(ctx)
    _, chunks = await _logged_machine(ctx)
    bad = [(index, len(chunk)) for index, chunk in enumerate(chunks) if not 1 <= len(chunk) <= MAX_CHUNK]
    ensure(not bad, "Logs", f"every chunk 1..{MAX_CHUNK} bytes", f"(chunk index, size) {bad[:5]}")
    ensure(
        sum(len(c) for c in chunks) > MAX_CHUNK,
        "Logs",
        "the main process output (more than one chunk)",
        f"{sum(len(c) for c in chunks)} bytes",
    )
    return Passed()


async def check_kept_after_stop(ctx: CheckContext) -> Outcome:
    """After Stop, Logs answers with the same bytes as while the Machine ran, and the Machine stays stopped."""
    if not ctx.caps.logs:
        return await _refusal(ctx)
    workspace_id, chunks = await _logged_machine(ctx)
    running = b"".join(chunks)
    ensure(
        len(running) >= len(OUT) + len(ERR),
        "Logs",
        f"while the Machine runs, the {len(OUT) + len(ERR)} bytes its main process wrote",
        f"{len(running)} bytes after 15 s",
    )
    await expect_ok("Stop", lambda: ctx.driver.stop(workspace_id))
    await ctx.require_status(workspace_id, "stopped", after="Stop")
    stopped = b"".join(await expect_ok("Logs", lambda: ctx.logs(workspace_id), note="Logs on a stopped Machine"))
    ensure(
        stopped == running,
        "Logs",
        f"on the stopped Machine, the {len(running)} bytes its main process wrote while it ran",
        f"{len(stopped)} bytes" + (" that differ" if len(stopped) == len(running) else ""),
    )
    await ctx.require_status(workspace_id, "stopped", after="Logs on the stopped Machine (Logs must not start it)")
    return Passed()


CASES = (
    Case(
        "logs.merged_exact",
        "Logs: finite, merged stdout+stderr of the main process, exact bytes (or UNSUPPORTED)",
        check_merged_exact,
        gated_by=(cap.LOGS,),
    ),
    Case(
        "logs.chunk_sizes", "Logs chunks are 1..32768 bytes (or UNSUPPORTED)", check_chunk_sizes, gated_by=(cap.LOGS,)
    ),
    Case(
        "logs.kept_after_stop",
        "Logs of a stopped Machine: the output of its last run, exactly; it stays stopped (or UNSUPPORTED)",
        check_kept_after_stop,
        gated_by=(cap.LOGS,),
    ),
)
