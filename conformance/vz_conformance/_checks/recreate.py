"""recreate: ON_RUN only for a host that opted in; invalid replacements leave the old Machine untouched; a
valid one changes identity, resets root data and keeps volumes and the workspace."""

from __future__ import annotations

import functools
from dataclasses import replace

from vz_conformance import _capabilities as cap
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._expect import ensure, expect_error, expect_ok
from vz_conformance._outcome import Outcome, Passed
from vz_core import Capabilities, Mount, MountType, RecreateMode, RunImageRequest

__all__ = [
    "CASES",
    "check_invalid_keeps_running",
    "check_invalid_keeps_stopped",
    "check_opt_in",
    "check_valid_replaces",
]


async def check_opt_in(ctx: CheckContext) -> Outcome:
    """Without the host's supports_recreate_on_run, Info never answers ON_RUN; with it, ON_RUN needs API 1.3."""
    plain = await expect_ok("Info", ctx.driver.info)
    mode = (plain.capabilities or Capabilities()).recreate_mode
    ensure(
        mode != RecreateMode.ON_RUN,
        "Info",
        "recreate_mode DELETE or STOP for a host that did not opt in",
        f"recreate_mode={int(mode)}",
    )
    opted = await expect_ok(
        "Info(supports_recreate_on_run=true)", lambda: ctx.driver.info(supports_recreate_on_run=True)
    )
    opted_mode = (opted.capabilities or Capabilities()).recreate_mode
    if opted_mode == RecreateMode.ON_RUN:
        ensure(
            opted.api_minor >= 3, "Info(supports_recreate_on_run=true)", "api_minor >= 3 with ON_RUN", opted.api_minor
        )
    return Passed()


async def _refusal(ctx: CheckContext) -> Outcome:
    req = await ctx.create("norecreate")

    async def verify() -> None:
        before = await ctx.find(req.workspace_id)
        await expect_error(
            "RunImage(allow_recreate=true)",
            lambda: ctx.driver.run_image(replace(req, allow_recreate=True)),
            {"ALREADY_EXISTS", "UNSUPPORTED"},
            note="recreate_mode is not ON_RUN",
        )
        await ctx.require_unchanged(req.workspace_id, before, "the Machine untouched by the refused RunImage")

    return await ctx.not_applicable(
        cap.RECREATE_ON_RUN,
        "RunImage(allow_recreate=true) refused (ALREADY_EXISTS/UNSUPPORTED), Machine untouched",
        verify,
    )


def _invalid_variants(ctx: CheckContext, req: RunImageRequest) -> list[tuple[str, RunImageRequest, set[str]]]:
    base = replace(req, allow_recreate=True)
    variants = [("an empty image", replace(base, image=""), {"INVALID_ARGUMENT"})]
    missing = [k for k in (MountType.BIND, MountType.VOLUME, MountType.TMPFS) if k not in ctx.caps.mount_types]
    if missing:
        kind = missing[0]
        source = ctx.adapter.mount_source(kind, ctx.scratch, "recreate-invalid")
        bad = ctx.adapter.with_mounts(base, Mount(kind, source, ctx.adapter.mount_target("invalid")))
        variants.append((f"an unsupported {kind.label} mount", bad, {"UNSUPPORTED"}))
    else:
        bad = ctx.adapter.with_mounts(base, Mount(MountType.UNSPECIFIED, "x", ctx.adapter.mount_target("invalid")))
        variants.append(("an UNSPECIFIED mount type", bad, {"UNSUPPORTED", "INVALID_ARGUMENT"}))
    return variants


async def _invalid_keeps(ctx: CheckContext, *, stopped: bool) -> Outcome:
    if await ctx.on_run_mode() != RecreateMode.ON_RUN:
        return await _refusal(ctx)
    req = await ctx.create("old")
    await ctx.run_ok(req.workspace_id, ctx.adapter.write_local("root-marker", "old root"))
    state = "running"
    if stopped:
        await expect_ok("Stop", lambda: ctx.driver.stop(req.workspace_id))
        state = "stopped"
    before = await ctx.require_status(req.workspace_id, state, after="setup")
    for what, bad, categories in _invalid_variants(ctx, req):
        await expect_error(
            "RunImage(allow_recreate=true)",
            functools.partial(ctx.driver.run_image, bad),
            categories,
            note=f"a replacement with {what}",
        )
        await ctx.require_unchanged(
            req.workspace_id,
            before,
            f"the old Machine exactly as it was ({state}, same id and created_at) after "
            f"a rejected replacement with {what}",
        )
    if stopped:
        await expect_ok("Start", lambda: ctx.driver.start(req.workspace_id))
    await ctx.require_stdout(
        req.workspace_id,
        ctx.adapter.read_local("root-marker"),
        b"old root",
        "the old root data intact after rejected replacements",
    )
    return Passed()


async def check_invalid_keeps_running(ctx: CheckContext) -> Outcome:
    """An invalid allow_recreate request is rejected before a running Machine is touched."""
    return await _invalid_keeps(ctx, stopped=False)


async def check_invalid_keeps_stopped(ctx: CheckContext) -> Outcome:
    """An invalid allow_recreate request is rejected before a stopped Machine is touched."""
    return await _invalid_keeps(ctx, stopped=True)


async def check_valid_replaces(ctx: CheckContext) -> Outcome:
    """A valid allow_recreate request replaces the Machine: new identity, root data reset, volumes and the
    workspace kept."""
    if await ctx.on_run_mode() != RecreateMode.ON_RUN:
        return await _refusal(ctx)
    req = ctx.request("replace")
    kept: list[tuple[str, str]] = []
    if MountType.VOLUME in ctx.caps.mount_types:
        name = ctx.adapter.mount_source(MountType.VOLUME, ctx.scratch, f"{ctx.token}-recreate")
        target = ctx.adapter.mount_target("volume")
        req = ctx.adapter.with_mounts(req, Mount(MountType.VOLUME, name, target))
        kept.append(("volume", f"{target}/kept.txt"))
    if MountType.BIND in ctx.caps.mount_types:
        source = ctx.adapter.mount_source(MountType.BIND, ctx.scratch, "recreate-ws")
        req = replace(req, workspace_mount=Mount(MountType.BIND, source, ctx.adapter.workspace_target))
        kept.append(("workspace", f"{ctx.adapter.workspace_target}/kept.txt"))
    await ctx.create(request=req)
    await ctx.run_ok(req.workspace_id, ctx.adapter.write_local("root-marker", "old root"))
    for _, path in kept:
        await ctx.run_ok(req.workspace_id, ctx.adapter.write_file(path, "kept"))
    before = await ctx.require_status(req.workspace_id, "running", after="RunImage")
    await expect_ok("RunImage(allow_recreate=true)", lambda: ctx.driver.run_image(replace(req, allow_recreate=True)))
    after = await ctx.require_status(req.workspace_id, "running", after="a valid replacement")
    ensure(
        (after.id, after.created_at) != (before.id, before.created_at),
        "Find",
        "a new identity (id or created_at) after recreation",
        f"id={after.id!r}, created_at={after.created_at!r}",
    )
    marker = await expect_ok("Exec", lambda: ctx.run(req.workspace_id, ctx.adapter.read_local("root-marker")))
    ensure(
        marker.require_exit().exit_code == 3, "Exec", "root data reset by recreation (marker absent)", marker.where()
    )
    for what, path in kept:
        await ctx.require_stdout(
            req.workspace_id, ctx.adapter.read_file(path), b"kept", f"the {what} content kept across recreation"
        )
    return Passed()


CASES = (
    Case("recreate.opt_in", "ON_RUN answered only to a host that opted in, and only with API minor >= 3", check_opt_in),
    Case(
        "recreate.invalid_keeps_running",
        "Invalid replacement rejected before a running Machine is touched",
        check_invalid_keeps_running,
        gated_by=(cap.RECREATE_ON_RUN,),
    ),
    Case(
        "recreate.invalid_keeps_stopped",
        "Invalid replacement rejected before a stopped Machine is touched",
        check_invalid_keeps_stopped,
        gated_by=(cap.RECREATE_ON_RUN,),
    ),
    Case(
        "recreate.valid_replaces",
        "Valid allow_recreate: new identity, root reset, volumes and workspace kept",
        check_valid_replaces,
        gated_by=(cap.RECREATE_ON_RUN,),
    ),
)
