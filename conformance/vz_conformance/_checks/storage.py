"""storage: Machine-local files, the host workspace, and the requested storage size."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vz_conformance import _capabilities as cap
from vz_conformance import _hostfs
from vz_conformance._case import Case
from vz_conformance._checks.mounts import refuse_mount
from vz_conformance._context import CheckContext
from vz_conformance._expect import category_of, describe, ensure, expect_ok, fail
from vz_conformance._outcome import Outcome, Passed
from vz_core import Mount, MountType

__all__ = [
    "CASES",
    "check_local_gone_after_recreate",
    "check_local_survives_restart",
    "check_size",
    "check_workspace_survives",
]


async def check_local_survives_restart(ctx: CheckContext) -> Outcome:
    """A file on the Machine's own storage survives Stop/Start."""
    req = await ctx.create("local")
    await ctx.run_ok(req.workspace_id, ctx.adapter.write_local("kept", "machine-local data"))
    await expect_ok("Stop", lambda: ctx.driver.stop(req.workspace_id))
    await expect_ok("Start", lambda: ctx.driver.start(req.workspace_id))
    result = await expect_ok("Exec", lambda: ctx.run(req.workspace_id, ctx.adapter.read_local("kept")))
    exit_ = result.require_exit()
    ensure(
        exit_.success and result.stdout == b"machine-local data",
        "Exec",
        "the Machine-local file with its content after Stop/Start",
        result.where(),
    )
    return Passed()


async def check_local_gone_after_recreate(ctx: CheckContext) -> Outcome:
    """A file on the Machine's own storage is gone once the Machine is recreated."""
    req = await ctx.create("local")
    await ctx.run_ok(req.workspace_id, ctx.adapter.write_local("dropped", "old root data"))
    await ctx.recreate(req)
    result = await expect_ok("Exec", lambda: ctx.run(req.workspace_id, ctx.adapter.read_local("dropped")))
    exit_ = result.require_exit()
    ensure(
        exit_.exit_code == 3 and not result.stdout,
        "Exec",
        "the Machine-local file absent after recreation (read exits 3)",
        result.where(),
    )
    return Passed()


async def check_workspace_survives(ctx: CheckContext) -> Outcome:
    """Host workspace content written from inside survives Stop/Start and recreation, inside and on the host."""
    if MountType.BIND not in ctx.caps.mount_types:
        return await refuse_mount(ctx, MountType.BIND, cap.MOUNT_BIND)
    source = Path(ctx.adapter.mount_source(MountType.BIND, ctx.scratch, "workspace"))
    target = ctx.adapter.workspace_target
    mount = Mount(MountType.BIND, str(source), target)
    req = await ctx.create(request=replace(ctx.request("workspace"), workspace_mount=mount))
    await ctx.run_ok(req.workspace_id, ctx.adapter.write_file(f"{target}/project.txt", "workspace data"))
    for step in ("Stop/Start", "recreation"):
        if step == "Stop/Start":
            await expect_ok("Stop", lambda: ctx.driver.stop(req.workspace_id))
            await expect_ok("Start", lambda: ctx.driver.start(req.workspace_id))
        else:
            await ctx.recreate(req)
        read = ctx.adapter.read_file(f"{target}/project.txt")
        await ctx.require_stdout(req.workspace_id, read, b"workspace data", f"the workspace file inside after {step}")
        _hostfs.require(source / "project.txt", "workspace data", f"the workspace data after {step}")
    return Passed()


async def check_size(ctx: CheckContext) -> Outcome:
    """A requested storage size is what the Machine's root filesystem has, or RunImage refuses it explicitly."""
    size = ctx.adapter.storage_request
    req = ctx.adapter.with_resources(ctx.request("size"), storage=size)
    if not ctx.ext.storage_limits:
        return await ctx.run_image_refused(
            cap.STORAGE_LIMITS,
            req,
            "storage_bytes",
            note="host_requirements.storage_bytes without extensions.storage_limits",
        )
    try:
        await ctx.driver.run_image(req)
    except Exception as exc:
        if category_of(exc) not in {"UNSUPPORTED", "INVALID_ARGUMENT", "FAILED_PRECONDITION"}:
            fail("RunImage", "the storage size honoured or refused explicitly", describe(exc))
        await ctx.require_absent(req.workspace_id, after="RunImage with storage_bytes was refused")
        return Passed(note=f"storage size refused: {describe(exc)}")
    result = await ctx.run_ok(req.workspace_id, ctx.adapter.root_size_kib())
    try:
        kib = int(result.stdout.strip())
    except ValueError:
        fail("Exec", "the root filesystem size in KiB", repr(result.stdout))
    ensure(
        0.85 * size <= kib * 1024 <= 1.10 * size,
        "Exec",
        f"a root filesystem of about {size} bytes (-15%/+10%)",
        f"{kib * 1024} bytes",
    )
    return Passed()


CASES = (
    Case("storage.local_survives_restart", "A Machine-local file survives Stop/Start", check_local_survives_restart),
    Case(
        "storage.local_gone_after_recreate",
        "A Machine-local file is gone after recreation",
        check_local_gone_after_recreate,
    ),
    Case(
        "storage.workspace_survives",
        "Host workspace content survives Stop/Start and recreation",
        check_workspace_survives,
        gated_by=(cap.MOUNT_BIND,),
    ),
    Case(
        "storage.size",
        "Requested storage size honoured or refused explicitly",
        check_size,
        gated_by=(cap.STORAGE_LIMITS,),
    ),
)
