"""identity / reuse: who owns the workspace, and ReusePreflight's read-only identity check (API 1.2)."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import replace
from pathlib import Path

from vz_conformance import _capabilities as cap
from vz_conformance import _hostfs
from vz_conformance._case import Case
from vz_conformance._checks.mounts import refuse_mount
from vz_conformance._context import CheckContext
from vz_conformance._expect import category_of, describe, ensure, expect_error, expect_ok, fail
from vz_conformance._outcome import Outcome, Passed
from vz_core import Mount, MountType, RunImageRequest

__all__ = [
    "CASES",
    "check_reuse_cancelled",
    "check_reuse_changed",
    "check_reuse_missing",
    "check_reuse_same",
    "check_workspace_owner",
]


def _identities(ctx: CheckContext) -> list[tuple[str, dict[str, str], str]]:
    """(purpose, request fields, expected developer identity): remote_user wins over user, root by default."""
    user, remote_user = ctx.adapter.identity_users
    return [
        ("remote-user", {"user": user, "remote_user": remote_user}, remote_user),
        ("user", {"user": user}, user),
        ("root", {}, "root"),
    ]


async def check_workspace_owner(ctx: CheckContext) -> Outcome:
    """The workspace inside the Machine belongs to remote_user, else user, else root."""
    if MountType.BIND not in ctx.caps.mount_types:
        return await refuse_mount(ctx, MountType.BIND, cap.MOUNT_BIND)
    for purpose, fields, expected in _identities(ctx):
        source = ctx.adapter.mount_source(MountType.BIND, ctx.scratch, purpose)
        _hostfs.write(Path(source, "file.txt"), "workspace")
        mount = Mount(MountType.BIND, source, ctx.adapter.workspace_target)
        req = await ctx.create(request=replace(ctx.request(purpose, **fields), workspace_mount=mount))
        owner = (await ctx.run_ok(req.workspace_id, ctx.adapter.owner_of(ctx.adapter.workspace_target))).stdout.strip()
        ensure(
            owner == expected.encode(),
            "Exec",
            f"the workspace owned by {expected!r} ({fields or 'no user'})",
            owner,
            note=f"argv={list(ctx.adapter.owner_of(ctx.adapter.workspace_target))!r}",
        )
    return Passed()


async def _refusal(ctx: CheckContext) -> Outcome:
    req = await ctx.create("noreuse")

    async def verify() -> None:
        before = await ctx.find(req.workspace_id)
        await expect_error(
            "ReusePreflight",
            lambda: ctx.driver.reuse_preflight(req.workspace_id, "root"),
            "UNSUPPORTED",
            note="capabilities.reuse_preflight=false",
        )
        await ctx.require_unchanged(req.workspace_id, before, "no change from a refused ReusePreflight")

    return await ctx.not_applicable(cap.REUSE_PREFLIGHT, "ReusePreflight refused as UNSUPPORTED", verify)


async def _machines(ctx: CheckContext) -> list[tuple[RunImageRequest, str]]:
    out: list[tuple[RunImageRequest, str]] = []
    for purpose, fields, expected in _identities(ctx):
        out.append((await ctx.create(request=ctx.request(purpose, **fields)), expected))
    return out


async def check_reuse_same(ctx: CheckContext) -> Outcome:
    """ReusePreflight with the creation-time identity (remote_user, else user, else root) succeeds; Find is
    unchanged."""
    if not ctx.caps.reuse_preflight:
        return await _refusal(ctx)
    for req, identity in await _machines(ctx):
        before = await ctx.find(req.workspace_id)
        await expect_ok(
            "ReusePreflight",
            functools.partial(ctx.driver.reuse_preflight, req.workspace_id, identity),
            note=f"same identity {identity!r}",
        )
        await ctx.require_unchanged(req.workspace_id, before, "byte-identical details before and after ReusePreflight")
    return Passed()


async def check_reuse_changed(ctx: CheckContext) -> Outcome:
    """ReusePreflight with another identity → FAILED_PRECONDITION mentioning --recreate; Find unchanged."""
    if not ctx.caps.reuse_preflight:
        return await _refusal(ctx)
    machines = await _machines(ctx)
    identities = [identity for _, identity in machines]
    for index, (req, identity) in enumerate(machines):
        other = identities[(index + 1) % len(identities)]
        before = await ctx.find(req.workspace_id)
        exc = await expect_error(
            "ReusePreflight",
            functools.partial(ctx.driver.reuse_preflight, req.workspace_id, other),
            "FAILED_PRECONDITION",
            note=f"created for {identity!r}, asked for {other!r}",
        )
        ensure("--recreate" in str(exc), "ReusePreflight", "a message with '--recreate' guidance", str(exc))
        await ctx.require_unchanged(req.workspace_id, before, "byte-identical details before and after ReusePreflight")
    return Passed()


async def check_reuse_missing(ctx: CheckContext) -> Outcome:
    """ReusePreflight of a missing Machine → NOT_FOUND, and nothing gets created."""
    if not ctx.caps.reuse_preflight:
        return await _refusal(ctx)
    missing = ctx.new_id("missing")
    await expect_error("ReusePreflight", lambda: ctx.driver.reuse_preflight(missing, "root"), "NOT_FOUND")
    await ctx.require_absent(missing, after="ReusePreflight of a missing Machine")
    return Passed()


async def check_reuse_cancelled(ctx: CheckContext) -> Outcome:
    """A cancelled ReusePreflight reports CANCELLED to its caller and changes nothing."""
    if not ctx.caps.reuse_preflight:
        return await _refusal(ctx)
    identity = ctx.adapter.identity_users[1]
    req = await ctx.create(request=ctx.request("cancel", remote_user=identity))
    before = await ctx.find(req.workspace_id)
    for yields in (0, 1):
        task = asyncio.create_task(ctx.driver.reuse_preflight(req.workspace_id, identity))
        for _ in range(yields):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=10)
        if not done:
            fail("ReusePreflight", "the cancelled call to end within 10 s", "still running")
        if not task.cancelled():
            exc = task.exception()
            # Success is acceptable only because the call may have finished before the cancellation landed.
            if exc is not None and category_of(exc) != "CANCELLED":
                fail("ReusePreflight", "CANCELLED for a cancelled call (same identity)", describe(exc))
        await ctx.require_unchanged(req.workspace_id, before, "byte-identical details after a cancelled ReusePreflight")
    return Passed()


CASES = (
    Case(
        "identity.workspace_owner",
        "Workspace owned by remote_user, else user, else root",
        check_workspace_owner,
        gated_by=(cap.MOUNT_BIND,),
    ),
    Case(
        "identity.reuse_same",
        "ReusePreflight with the same identity succeeds without mutation",
        check_reuse_same,
        gated_by=(cap.REUSE_PREFLIGHT,),
    ),
    Case(
        "identity.reuse_changed",
        "ReusePreflight with a changed identity: FAILED_PRECONDITION with --recreate",
        check_reuse_changed,
        gated_by=(cap.REUSE_PREFLIGHT,),
    ),
    Case(
        "identity.reuse_missing",
        "ReusePreflight of a missing Machine: NOT_FOUND",
        check_reuse_missing,
        gated_by=(cap.REUSE_PREFLIGHT,),
    ),
    Case(
        "identity.reuse_cancelled",
        "A cancelled ReusePreflight: CANCELLED, no mutation",
        check_reuse_cancelled,
        gated_by=(cap.REUSE_PREFLIGHT,),
    ),
)
