"""lifecycle: Find, RunImage, Start, Stop, Delete and the request conventions around them."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import grpc

from vz_conformance import _frames
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._exec import chunks, collect
from vz_conformance._expect import ensure, expect_error, expect_ok, fail
from vz_conformance._outcome import Outcome, Passed
from vz_core import ExecSpec

__all__ = [
    "CASES",
    "check_already_exists",
    "check_delete_idempotent",
    "check_empty_arguments",
    "check_find_absent",
    "check_missing_not_found",
    "check_odd_ids",
    "check_run_find_running",
    "check_start_idempotent",
    "check_stop_idempotent",
    "check_stopped_exec_refused",
]


async def check_find_absent(ctx: CheckContext) -> Outcome:
    """Find of a Machine that never existed answers found=false, not an error."""
    workspace_id = ctx.new_id("absent")
    details = await ctx.find(workspace_id)
    ensure(details is None, "Find", "found=false for a Machine that never existed", details)
    return Passed()


def _rfc3339(value: str) -> bool:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return "T" in value.upper() and parsed.tzinfo is not None


async def check_run_find_running(ctx: CheckContext) -> Outcome:
    """After RunImage, Find reports the Machine: non-empty id, RFC 3339 created_at, status "running"."""
    req = await ctx.create("run")
    details = await ctx.require_status(req.workspace_id, "running", after="RunImage")
    ensure(bool(details.id.strip()), "Find", "a non-empty container id", details.id)
    ensure(_rfc3339(details.created_at), "Find", "created_at in RFC 3339 with a time zone", details.created_at)
    return Passed()


async def check_stop_idempotent(ctx: CheckContext) -> Outcome:
    """Stop twice: both succeed and Find says "stopped" after each."""
    req = await ctx.create("stop")
    for attempt in ("first", "second"):
        await expect_ok("Stop", lambda: ctx.driver.stop(req.workspace_id), note=f"{attempt} Stop")
        await ctx.require_status(req.workspace_id, "stopped", after=f"the {attempt} Stop")
    return Passed()


async def check_start_idempotent(ctx: CheckContext) -> Outcome:
    """Start on a running Machine succeeds; after Stop, Start twice: both succeed, Find says "running"."""
    req = await ctx.create("start")
    await expect_ok("Start", lambda: ctx.driver.start(req.workspace_id), note="Start on a running Machine")
    await ctx.require_status(req.workspace_id, "running", after="Start on a running Machine")
    await expect_ok("Stop", lambda: ctx.driver.stop(req.workspace_id))
    for attempt in ("first", "second"):
        await expect_ok("Start", lambda: ctx.driver.start(req.workspace_id), note=f"{attempt} Start after Stop")
        await ctx.require_status(req.workspace_id, "running", after=f"the {attempt} Start")
    return Passed()


async def check_delete_idempotent(ctx: CheckContext) -> Outcome:
    """Delete twice: both succeed and Find says found=false after each."""
    req = await ctx.create("delete")
    for attempt in ("first", "second"):
        await expect_ok("Delete", lambda: ctx.driver.delete(req.workspace_id), note=f"{attempt} Delete")
        await ctx.require_absent(req.workspace_id, after=f"the {attempt} Delete")
    return Passed()


async def check_missing_not_found(ctx: CheckContext) -> Outcome:
    """Start/Stop/Exec (and Logs, ReusePreflight when advertised) on a missing Machine → NOT_FOUND with a
    message; on the wire the status carries exactly one RuntimeError."""
    missing = ctx.new_id("missing")
    await expect_error("Start", lambda: ctx.driver.start(missing), "NOT_FOUND")
    await expect_error("Stop", lambda: ctx.driver.stop(missing), "NOT_FOUND")
    spec = ExecSpec(workspace_id=missing, argv=ctx.adapter.true())
    await expect_error("Exec", lambda: collect(ctx.driver, spec, chunks(b"")), "NOT_FOUND")
    if ctx.caps.logs:
        await expect_error("Logs", lambda: ctx.logs(missing), "NOT_FOUND")
    if ctx.caps.reuse_preflight:
        await expect_error("ReusePreflight", lambda: ctx.driver.reuse_preflight(missing, "root"), "NOT_FOUND")
    if ctx.mode == "external":
        async with ctx.wire() as channel:
            raw = await _frames.raw_start_missing(channel, missing)
        _frames.require_one_runtime_error("Start (wire)", raw, grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    await ctx.require_absent(missing, after="the refused calls")
    return Passed()


async def check_already_exists(ctx: CheckContext) -> Outcome:
    """RunImage on an existing Machine without allow_recreate → ALREADY_EXISTS, the Machine unchanged."""
    req = await ctx.create("exists")
    before = await ctx.find(req.workspace_id)
    await expect_error(
        "RunImage",
        lambda: ctx.driver.run_image(req),
        "ALREADY_EXISTS",
        note="second RunImage of the same workspace_id, allow_recreate=false",
    )
    await ctx.require_unchanged(req.workspace_id, before, "the Machine unchanged by the refused RunImage")
    return Passed()


async def check_empty_arguments(ctx: CheckContext) -> Outcome:
    """An empty workspace_id (every RPC) or image (RunImage) → INVALID_ARGUMENT, nothing created."""
    d = ctx.driver
    good = ctx.request("empty")
    await expect_error(
        "RunImage", lambda: d.run_image(replace(good, workspace_id="")), "INVALID_ARGUMENT", note="workspace_id=''"
    )
    await expect_error("RunImage", lambda: d.run_image(replace(good, image="")), "INVALID_ARGUMENT", note="image=''")
    await ctx.require_absent(good.workspace_id, after="RunImage with an empty image was refused")
    await expect_error("Find", lambda: d.find(""), "INVALID_ARGUMENT", note="workspace_id=''")
    await expect_error("Start", lambda: d.start(""), "INVALID_ARGUMENT", note="workspace_id=''")
    await expect_error("Stop", lambda: d.stop(""), "INVALID_ARGUMENT", note="workspace_id=''")
    await expect_error("Delete", lambda: d.delete(""), "INVALID_ARGUMENT", note="workspace_id=''")
    spec = ExecSpec(workspace_id="", argv=ctx.adapter.true())
    await expect_error("Exec", lambda: collect(d, spec, chunks(b"")), "INVALID_ARGUMENT", note="workspace_id=''")
    return Passed()


async def check_odd_ids(ctx: CheckContext) -> Outcome:
    """Workspace ids with "/", "..", spaces and unicode work end to end and stay distinct (never raw paths)."""
    base = ctx.new_id("odd")
    ids = [
        f"{base}/nested",
        f"{base}_nested",
        f"{base}/../{base}-dots",
        f"{base}-dots",
        f"{base} with spaces",
        f"{base}-ünï-日本",
        f"../../{base}-escape",
    ]
    for workspace_id in ids:
        ctx.track(workspace_id)
    for index, workspace_id in enumerate(ids):
        await ctx.create(request=ctx.adapter.unique_request(workspace_id, "odd-id"))
        await ctx.run_ok(workspace_id, ctx.adapter.write_local("identity", f"machine-{index}"))
    seen: dict[str, str] = {}
    for index, workspace_id in enumerate(ids):
        details = await ctx.require_status(workspace_id, "running", after="RunImage of every odd id")
        if details.id in seen:
            fail(
                "Find",
                "a distinct container id per workspace_id",
                f"{workspace_id!r} and {seen[details.id]!r} share id {details.id!r}",
            )
        seen[details.id] = workspace_id
        got = (await ctx.run_ok(workspace_id, ctx.adapter.read_local("identity"))).stdout
        ensure(
            got == f"machine-{index}".encode(),
            "Exec",
            f"Machine-local file of {workspace_id!r} to read 'machine-{index}' (each id is its own Machine)",
            got,
        )
    victim = ids[1]
    await expect_ok("Stop", lambda: ctx.driver.stop(victim), note=repr(victim))
    for workspace_id in ids:
        await ctx.require_status(
            workspace_id, "stopped" if workspace_id == victim else "running", after=f"Stop of {victim!r} only"
        )
    await expect_ok("Delete", lambda: ctx.driver.delete(victim), note=repr(victim))
    for workspace_id in ids:
        if workspace_id == victim:
            await ctx.require_absent(workspace_id, after=f"Delete of {victim!r}")
        else:
            await ctx.require_status(workspace_id, "running", after=f"Delete of {victim!r} only")
    return Passed()


async def check_stopped_exec_refused(ctx: CheckContext) -> Outcome:
    """Exec on a stopped Machine → FAILED_PRECONDITION; it stays stopped (Logs of a stopped Machine is
    ``logs.kept_after_stop``: it answers with the output kept from the last run)."""
    req = await ctx.create("stopped")
    await expect_ok("Stop", lambda: ctx.driver.stop(req.workspace_id))
    spec = ExecSpec(workspace_id=req.workspace_id, argv=ctx.adapter.true())
    await expect_error(
        "Exec", lambda: collect(ctx.driver, spec, chunks(b"")), "FAILED_PRECONDITION", note="Exec on a stopped Machine"
    )
    await ctx.require_status(req.workspace_id, "stopped", after="the refused Exec")
    return Passed()


CASES = (
    Case("lifecycle.find_absent", "Find of a missing Machine answers found=false", check_find_absent),
    Case(
        "lifecycle.run_find_running",
        "RunImage, then Find reports id, RFC 3339 created_at, status running",
        check_run_find_running,
    ),
    Case("lifecycle.stop_idempotent", "Stop twice: stopped after each", check_stop_idempotent),
    Case(
        "lifecycle.start_idempotent",
        "Start on running, then twice after Stop: running after each",
        check_start_idempotent,
    ),
    Case("lifecycle.delete_idempotent", "Delete twice: absent after each", check_delete_idempotent),
    Case(
        "lifecycle.missing_not_found",
        "Start/Stop/Exec/Logs on a missing Machine: NOT_FOUND, one RuntimeError",
        check_missing_not_found,
    ),
    Case(
        "lifecycle.already_exists",
        "RunImage on an existing Machine: ALREADY_EXISTS, Machine unchanged",
        check_already_exists,
    ),
    Case(
        "lifecycle.empty_arguments",
        "Empty workspace_id or image: INVALID_ARGUMENT before any mutation",
        check_empty_arguments,
    ),
    Case("lifecycle.odd_ids", "Ids with '/', '..', spaces and unicode work and stay distinct", check_odd_ids),
    Case(
        "lifecycle.stopped_exec_refused",
        "Exec on a stopped Machine: FAILED_PRECONDITION, it stays stopped",
        check_stopped_exec_refused,
    ),
)
