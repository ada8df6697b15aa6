"""egress: the default policy reaches a test destination; "vz.egress=deny" refuses, sends nothing, keeps exec
working, and holds across Stop/Start and recreation."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from vz_conformance import _capabilities as cap
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._expect import ensure, expect_ok
from vz_conformance._netdest import Destination, destination
from vz_conformance._outcome import Outcome, Passed
from vz_core import RunImageRequest

__all__ = ["CASES", "check_default_reaches", "check_deny_holds", "check_deny_refuses"]

DENY = "vz.egress=deny"


def _deny(ctx: CheckContext, purpose: str) -> RunImageRequest:
    req = ctx.request(purpose)
    return replace(req, labels=(*req.labels, DENY))


async def _refusal(ctx: CheckContext) -> Outcome:
    return await ctx.run_image_refused(
        cap.EGRESS,
        _deny(ctx, "noegress"),
        f"label {DENY!r}",
        note=f"label {DENY!r} without extensions.egress_policies DENY",
    )


async def _connects(ctx: CheckContext, workspace_id: str, dest: Destination) -> bool:
    result = await expect_ok("Exec", lambda: ctx.run(workspace_id, ctx.adapter.tcp_connect(dest.host, dest.port)))
    return result.require_exit().success


async def _denied(ctx: CheckContext, workspace_id: str, dest: Destination, after: str) -> None:
    packets = dest.rx_packets()
    arrived = len(dest.received)
    ensure(
        not await _connects(ctx, workspace_id, dest),
        "Exec",
        f"the connection refused under {DENY} ({after})",
        "it connected",
    )
    await asyncio.sleep(0.2)  # let a stray packet reach the counter before reading it
    ensure(
        len(dest.received) == arrived,
        "test destination",
        f"nothing received under {DENY} ({after})",
        dest.received[arrived:],
    )
    ensure(
        dest.rx_packets() == packets,
        "test destination",
        f"no packet sent to it under {DENY} ({after})",
        f"{dest.rx_packets() - packets} packets",
    )
    await ctx.run_ok(workspace_id, ctx.adapter.true())


async def check_default_reaches(ctx: CheckContext) -> Outcome:
    """Under the default policy a Machine reaches the test destination."""
    if not ctx.declared(cap.EGRESS):
        return await _refusal(ctx)
    async with destination() as dest:
        req = await ctx.create("allow")
        ensure(
            await _connects(ctx, req.workspace_id, dest), "Exec", "a connection to the test destination", "it failed"
        )
        await asyncio.sleep(0.2)
        ensure(
            any(b"vz-conformance" in data for data in dest.received),
            "test destination",
            "the probe line",
            dest.received,
        )
    return Passed()


async def check_deny_refuses(ctx: CheckContext) -> Outcome:
    """Under vz.egress=deny the connection is refused, nothing reaches the destination, exec keeps working."""
    if not ctx.declared(cap.EGRESS):
        return await _refusal(ctx)
    async with destination() as dest:
        req = await ctx.create(request=_deny(ctx, "deny"))
        await _denied(ctx, req.workspace_id, dest, "a new Machine")
    return Passed()


async def check_deny_holds(ctx: CheckContext) -> Outcome:
    """vz.egress=deny still holds after Stop/Start and after recreation."""
    if not ctx.declared(cap.EGRESS):
        return await _refusal(ctx)
    async with destination() as dest:
        req = await ctx.create(request=_deny(ctx, "deny"))
        await expect_ok("Stop", lambda: ctx.driver.stop(req.workspace_id))
        await expect_ok("Start", lambda: ctx.driver.start(req.workspace_id))
        await _denied(ctx, req.workspace_id, dest, "after Stop/Start")
        await ctx.recreate(req)
        await _denied(ctx, req.workspace_id, dest, "after recreation")
    return Passed()


CASES = (
    Case(
        "egress.default_reaches",
        "Default policy reaches a test destination in a suite-made netns",
        check_default_reaches,
        gated_by=(cap.EGRESS,),
    ),
    Case(
        "egress.deny_refuses",
        "vz.egress=deny refuses, sends nothing, keeps exec working",
        check_deny_refuses,
        gated_by=(cap.EGRESS,),
    ),
    Case(
        "egress.deny_holds",
        "vz.egress=deny holds after Stop/Start and recreation",
        check_deny_holds,
        gated_by=(cap.EGRESS,),
    ),
)
