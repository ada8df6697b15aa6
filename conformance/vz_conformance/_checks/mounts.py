"""mounts: bind (read-write, read-only), named volumes, tmpfs; unsupported types refused with nothing created."""

from __future__ import annotations

import functools
import secrets
from pathlib import Path

from vz_conformance import _capabilities as cap
from vz_conformance import _hostfs
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._expect import ensure, expect_error, expect_ok
from vz_conformance._outcome import Outcome, Passed
from vz_core import Mount, MountType

__all__ = [
    "CASES",
    "check_bind_read_only",
    "check_bind_read_write",
    "check_tmpfs_reset",
    "check_unsupported_type",
    "check_volume_persists",
    "refuse_mount",
]


async def refuse_mount(ctx: CheckContext, kind: MountType, capability: str) -> Outcome:
    """Not applicable: RunImage with a ``kind`` mount must be UNSUPPORTED and create nothing."""
    source = ctx.adapter.mount_source(kind, ctx.scratch, secrets.token_hex(4))
    req = ctx.adapter.with_mounts(ctx.request("refuse"), Mount(kind, source, ctx.adapter.mount_target("refused")))
    return await ctx.run_image_refused(
        capability, req, f"a {kind.label} mount", note=f"a {kind.label} mount while capabilities.mount_types lacks it"
    )


def _name(kind: MountType | int) -> str:
    return kind.name if isinstance(kind, MountType) else f"unknown value {int(kind)}"


def _has(ctx: CheckContext, kind: MountType) -> bool:
    return kind in ctx.caps.mount_types


async def check_bind_read_write(ctx: CheckContext) -> Outcome:
    """A read-write bind mount: the Machine reads host files and the host sees files the Machine writes."""
    if not _has(ctx, MountType.BIND):
        return await refuse_mount(ctx, MountType.BIND, cap.MOUNT_BIND)
    source = Path(ctx.adapter.mount_source(MountType.BIND, ctx.scratch, "rw"))
    _hostfs.write(source / "from-host.txt", "written on the host")
    target = ctx.adapter.mount_target("rw")
    req = await ctx.create(
        request=ctx.adapter.with_mounts(ctx.request("bind"), Mount(MountType.BIND, str(source), target))
    )
    await ctx.require_stdout(
        req.workspace_id,
        ctx.adapter.read_file(f"{target}/from-host.txt"),
        b"written on the host",
        "the host file's content through the bind mount",
    )
    await ctx.run_ok(req.workspace_id, ctx.adapter.write_file(f"{target}/from-machine.txt", "written inside"))
    _hostfs.require(source / "from-machine.txt", "written inside", "the content written inside the Machine")
    return Passed()


async def check_bind_read_only(ctx: CheckContext) -> Outcome:
    """A read-only bind mount: readable inside, writes fail inside, the host directory is unchanged."""
    if not _has(ctx, MountType.BIND):
        return await refuse_mount(ctx, MountType.BIND, cap.MOUNT_BIND)
    source = Path(ctx.adapter.mount_source(MountType.BIND, ctx.scratch, "ro"))
    _hostfs.write(source / "kept.txt", "original")
    target = ctx.adapter.mount_target("ro")
    mount = Mount(MountType.BIND, str(source), target, read_only=True)
    req = await ctx.create(request=ctx.adapter.with_mounts(ctx.request("bind-ro"), mount))
    await ctx.require_stdout(
        req.workspace_id,
        ctx.adapter.read_file(f"{target}/kept.txt"),
        b"original",
        "the host file readable through the read-only mount",
    )
    for name in ("kept.txt", "new.txt"):
        result = await expect_ok(
            "Exec",
            functools.partial(ctx.run, req.workspace_id, ctx.adapter.write_file(f"{target}/{name}", "changed")),
        )
        exit_ = result.require_exit()
        ensure(not exit_.success, "Exec", f"writing {target}/{name} to fail on a read-only mount", exit_)
    ensure(
        _hostfs.names(source) == ["kept.txt"] and _hostfs.read(source / "kept.txt") == "original",
        "host filesystem",
        "the read-only source unchanged (only kept.txt, still 'original')",
        _hostfs.names(source),
    )
    return Passed()


async def check_volume_persists(ctx: CheckContext) -> Outcome:
    """A named volume keeps its files across Stop/Start and across recreation of the Machine."""
    if not _has(ctx, MountType.VOLUME):
        return await refuse_mount(ctx, MountType.VOLUME, cap.MOUNT_VOLUME)
    name = ctx.adapter.mount_source(MountType.VOLUME, ctx.scratch, f"{ctx.token}-{secrets.token_hex(3)}")
    target = ctx.adapter.mount_target("volume")
    req = await ctx.create(
        request=ctx.adapter.with_mounts(ctx.request("volume"), Mount(MountType.VOLUME, name, target))
    )
    await ctx.run_ok(req.workspace_id, ctx.adapter.write_file(f"{target}/kept.txt", "volume data"))
    await expect_ok("Stop", lambda: ctx.driver.stop(req.workspace_id))
    await expect_ok("Start", lambda: ctx.driver.start(req.workspace_id))
    read = ctx.adapter.read_file(f"{target}/kept.txt")
    await ctx.require_stdout(req.workspace_id, read, b"volume data", "the volume file after Stop/Start")
    await ctx.recreate(req)
    await ctx.require_stdout(req.workspace_id, read, b"volume data", "the volume file after recreation")
    return Passed()


async def check_tmpfs_reset(ctx: CheckContext) -> Outcome:
    """A tmpfs mount is writable and empty again after Stop/Start."""
    if not _has(ctx, MountType.TMPFS):
        return await refuse_mount(ctx, MountType.TMPFS, cap.MOUNT_TMPFS)
    target = ctx.adapter.mount_target("tmpfs")
    req = await ctx.create(request=ctx.adapter.with_mounts(ctx.request("tmpfs"), Mount(MountType.TMPFS, "", target)))
    await ctx.run_ok(req.workspace_id, ctx.adapter.write_file(f"{target}/scratch.txt", "temporary"))
    before = await ctx.run_ok(req.workspace_id, ctx.adapter.list_dir(target))
    ensure(b"scratch.txt" in before.stdout, "Exec", "the file written to tmpfs listed", before.stdout)
    await expect_ok("Stop", lambda: ctx.driver.stop(req.workspace_id))
    await expect_ok("Start", lambda: ctx.driver.start(req.workspace_id))
    after = await ctx.run_ok(req.workspace_id, ctx.adapter.list_dir(target))
    ensure(after.stdout.strip() == b"", "Exec", "an empty tmpfs after Stop/Start", after.stdout)
    return Passed()


async def check_unsupported_type(ctx: CheckContext) -> Outcome:
    """A mount type the driver does not declare → UNSUPPORTED with nothing created."""
    missing = [k for k in (MountType.BIND, MountType.VOLUME, MountType.TMPFS) if k not in ctx.caps.mount_types]
    kind = missing[0] if missing else MountType.UNSPECIFIED
    source = ctx.adapter.mount_source(kind, ctx.scratch, "unsupported") if missing else "unspecified"
    req = ctx.adapter.with_mounts(ctx.request("unsupported"), Mount(kind, source, ctx.adapter.mount_target("nope")))
    allowed = {"UNSUPPORTED"} if missing else {"UNSUPPORTED", "INVALID_ARGUMENT"}
    await expect_error(
        "RunImage",
        lambda: ctx.driver.run_image(req),
        allowed,
        note=f"mount type {kind.name} (declared: {[_name(k) for k in ctx.caps.mount_types]})",
    )
    await ctx.require_absent(req.workspace_id, after="RunImage with an unsupported mount type was refused")
    return Passed()


CASES = (
    Case(
        "mounts.bind_read_write",
        "Read-write bind: host files visible inside, Machine writes visible on the host",
        check_bind_read_write,
        gated_by=(cap.MOUNT_BIND,),
    ),
    Case(
        "mounts.bind_read_only",
        "Read-only bind rejects writes inside the Machine",
        check_bind_read_only,
        gated_by=(cap.MOUNT_BIND,),
    ),
    Case(
        "mounts.volume_persists",
        "Named volume survives Stop/Start and recreation",
        check_volume_persists,
        gated_by=(cap.MOUNT_VOLUME,),
    ),
    Case("mounts.tmpfs_reset", "tmpfs is empty after Stop/Start", check_tmpfs_reset, gated_by=(cap.MOUNT_TMPFS,)),
    Case("mounts.unsupported_type", "Unsupported mount type: UNSUPPORTED with nothing created", check_unsupported_type),
)
