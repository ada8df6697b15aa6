"""resources: requested CPUs and memory are what the Machine sees; impossible requests fail before creation."""

from __future__ import annotations

import functools

from vz_conformance import _capabilities as cap
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._expect import ensure, expect_error, fail
from vz_conformance._outcome import Outcome, Passed

__all__ = ["CASES", "check_impossible_refused", "check_visible"]

REFUSALS = {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "UNSUPPORTED", "UNAVAILABLE", "PERMISSION_DENIED"}


async def _refusal(ctx: CheckContext) -> Outcome:
    cpus, memory = ctx.adapter.resource_request
    req = ctx.adapter.with_resources(ctx.request("limits"), cpus=cpus, memory=memory)
    return await ctx.run_image_refused(
        cap.RESOURCE_LIMITS,
        req,
        "cpus/memory_bytes",
        note="host_requirements.cpus/memory_bytes without extensions.resource_limits",
    )


async def check_visible(ctx: CheckContext) -> Outcome:
    """The Machine sees the requested CPUs (online count) and memory (MemTotal within 128 MiB)."""
    if not ctx.ext.resource_limits:
        return await _refusal(ctx)
    cpus, memory = ctx.adapter.resource_request
    req = await ctx.create(request=ctx.adapter.with_resources(ctx.request("limits"), cpus=cpus, memory=memory))
    seen_cpus = (await ctx.run_ok(req.workspace_id, ctx.adapter.cpu_count())).stdout.strip()
    ensure(seen_cpus == str(cpus).encode(), "Exec", f"{cpus} online CPU(s) inside the Machine", seen_cpus)
    raw = (await ctx.run_ok(req.workspace_id, ctx.adapter.mem_total_kib())).stdout.strip()
    try:
        seen_memory = int(raw) * 1024
    except ValueError:
        fail("Exec", "MemTotal in KiB", repr(raw))
    ensure(
        abs(seen_memory - memory) <= 128 * 1024 * 1024,
        "Exec",
        f"MemTotal within 128 MiB of {memory} bytes",
        f"{seen_memory} bytes",
    )
    return Passed()


async def check_impossible_refused(ctx: CheckContext) -> Outcome:
    """CPUs or memory no host can grant are refused by RunImage before anything is created."""
    if not ctx.ext.resource_limits:
        return await _refusal(ctx)
    cpus, memory = ctx.adapter.impossible_resources
    for label, kwargs in (("cpus", {"cpus": cpus}), ("memory_bytes", {"memory": memory})):
        req = ctx.adapter.with_resources(ctx.request("impossible"), **kwargs)
        await expect_error(
            "RunImage",
            functools.partial(ctx.driver.run_image, req),
            REFUSALS,
            note=f"host_requirements.{label}={kwargs}",
        )
        await ctx.require_absent(req.workspace_id, after=f"RunImage with impossible {label} was refused")
    return Passed()


CASES = (
    Case(
        "resources.visible",
        "Requested CPUs and memory are what the Machine sees",
        check_visible,
        gated_by=(cap.RESOURCE_LIMITS,),
    ),
    Case(
        "resources.impossible_refused",
        "Impossible CPU/memory requests fail before creation",
        check_impossible_refused,
        gated_by=(cap.RESOURCE_LIMITS,),
    ),
)
