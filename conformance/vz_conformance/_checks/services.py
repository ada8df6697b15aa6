"""services: long-running commands the Machine supervises (vz.machine.v1 SetServices / ServiceStates /
ServiceLogs), or UNSUPPORTED.

A service keeps running under the Machine (its process stays the same while nothing happens to it); its output
is kept per service, across its restarts; ``on-failure`` restarts it up to ``max_retries`` times and then
reports it failed with its last exit code, ``no`` leaves an exited service exited, ``always`` restarts even a
clean exit; a health command that passes makes the service healthy and one that fails makes it unhealthy while
it keeps running; a service waiting on ``service_healthy`` starts only once its dependency is healthy; a bad set
is INVALID_ARGUMENT and changes nothing; a service taken out of the set is stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from vz_conformance import _capabilities as cap
from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._expect import ensure, expect_error, expect_ok, fail
from vz_conformance._outcome import Outcome, Passed
from vz_core.errors import UnsupportedError
from vz_core.services import HealthCheck, ServiceSpec, ServiceState

__all__ = ["CASES", "check_health_and_order", "check_restart_policies", "check_supervised"]

_WITHIN = 30.0
"""Seconds a service may take to reach the state a check waits for (a slow VM under emulation included)."""


async def _call(ctx: CheckContext, name: str, *args: object) -> object:
    method = getattr(ctx.driver, name, None)
    if not callable(method):  # an in-process driver without the methods: what its plugin server answers
        raise UnsupportedError("this driver does not supervise services")
    return await method(*args)


async def _set(ctx: CheckContext, workspace_id: str, specs: Sequence[ServiceSpec]) -> tuple[ServiceState, ...]:
    names = [s.name for s in specs]
    result = await expect_ok("SetServices", lambda: _call(ctx, "set_services", workspace_id, specs), note=f"{names}")
    return result  # type: ignore[return-value]


async def _states(ctx: CheckContext, workspace_id: str) -> dict[str, ServiceState]:
    result = await expect_ok("ServiceStates", lambda: _call(ctx, "service_states", workspace_id))
    return {s.name: s for s in result}  # type: ignore[attr-defined]


async def _logs(ctx: CheckContext, workspace_id: str, name: str) -> bytes:
    result = await expect_ok("ServiceLogs", lambda: _call(ctx, "service_logs", workspace_id, name, 0), note=name)
    return result  # type: ignore[return-value]


async def _until(
    ctx: CheckContext, workspace_id: str, name: str, what: str, ok: Callable[[ServiceState], bool]
) -> ServiceState:
    """Poll ServiceStates until service ``name`` satisfies ``ok`` (≤ ``_WITHIN`` s); fail naming the last state."""
    deadline = time.monotonic() + _WITHIN
    last: ServiceState | None = None
    while True:
        last = (await _states(ctx, workspace_id)).get(name)
        if last is not None and ok(last):
            return last
        if time.monotonic() > deadline:
            fail("ServiceStates", f"service {name!r} {what} within {_WITHIN:.0f} s", repr(last))
        await asyncio.sleep(0.2)


async def _refusal(ctx: CheckContext) -> Outcome:
    req = await ctx.create("noservices")
    spec = ServiceSpec("s", ctx.adapter.idle(60, "vzc-service"))
    return await ctx.not_applicable(
        cap.SERVICES,
        "SetServices refused as UNSUPPORTED",
        lambda: expect_error(
            "SetServices",
            lambda: _call(ctx, "set_services", req.workspace_id, [spec]),
            "UNSUPPORTED",
            note="extensions.services=false",
        ),
    )


def _announce(marker: str) -> tuple[str, ...]:
    """Print ``marker`` and ``$VZC_NAME``, then idle (the process the service is)."""
    return ("sh", "-c", 'echo "$1 $VZC_NAME"; exec sleep 600', "sh", marker)


async def check_supervised(ctx: CheckContext) -> Outcome:
    """A service runs as one supervised process with its environment and its own log; a bad set is refused and
    changes nothing; SetServices without it stops it."""
    if not ctx.declared(cap.SERVICES):
        return await _refusal(ctx)
    req = await ctx.create("services")
    wid = req.workspace_id
    marker = f"vzc-service-{ctx.token}"
    spec = ServiceSpec("web", _announce(marker), environment={"VZC_NAME": "web-env"})
    await _set(ctx, wid, [spec])
    running = await _until(ctx, wid, "web", "is running with a pid", lambda s: s.state == "running" and s.pid > 0)
    await asyncio.sleep(2.0)
    later = (await _states(ctx, wid)).get("web")
    ensure(
        later is not None and later.state == "running" and later.pid == running.pid and later.restarts == 0,
        "ServiceStates",
        f"service 'web' still running as pid {running.pid} after 2 s, never restarted",
        repr(later),
    )
    deadline = time.monotonic() + _WITHIN
    while f"{marker} web-env".encode() not in (log := await _logs(ctx, wid, "web")):
        if time.monotonic() > deadline:
            fail("ServiceLogs", f"the output {marker} web-env of service 'web'", repr(log[-200:]))
        await asyncio.sleep(0.2)
    bad = ServiceSpec("worker", ctx.adapter.idle(60, marker), depends_on={"missing": "service_started"})
    await expect_error(
        "SetServices",
        lambda: _call(ctx, "set_services", wid, [spec, bad]),
        "INVALID_ARGUMENT",
        note="a service depending on one not in the set",
    )
    after = (await _states(ctx, wid)).get("web")
    ensure(
        after is not None and after.pid == running.pid and set(await _states(ctx, wid)) == {"web"},
        "ServiceStates",
        f"after a refused set, only service 'web', still pid {running.pid}",
        repr(await _states(ctx, wid)),
    )
    await _set(ctx, wid, [])
    ensure(not await _states(ctx, wid), "ServiceStates", "no service after SetServices([])", "services left")
    return Passed()


async def check_restart_policies(ctx: CheckContext) -> Outcome:
    """on-failure restarts up to max_retries and then reports failed with the last exit code, keeping the output
    of every run; no leaves a clean exit exited; always restarts a clean exit."""
    if not ctx.declared(cap.SERVICES):
        return await _refusal(ctx)
    req = await ctx.create("restart")
    wid = req.workspace_id
    marker = f"vzc-run-{ctx.token}"
    specs = [
        ServiceSpec("flaky", ctx.adapter.fail_with(3, marker), restart="on-failure", max_retries=2),
        ServiceSpec("once", ctx.adapter.true(), restart="no"),
        ServiceSpec("again", ctx.adapter.true(), restart="always"),
    ]
    await _set(ctx, wid, specs)
    flaky = await _until(ctx, wid, "flaky", "is failed after 2 restarts", lambda s: s.state == "failed")
    ensure(
        flaky.restarts == 2 and flaky.last_exit_code == 3,
        "ServiceStates",
        "service 'flaky' (exit 3, on-failure, max_retries 2): 2 restarts, last exit code 3",
        repr(flaky),
    )
    log = await _logs(ctx, wid, "flaky")
    ensure(
        log.count(marker.encode()) == 3,
        "ServiceLogs",
        f"the output of all 3 runs of 'flaky' ({marker!r} 3 times)",
        f"{log.count(marker.encode())} times in {log[-300:]!r}",
    )
    once = await _until(ctx, wid, "once", "is exited", lambda s: s.state == "exited")
    ensure(
        once.restarts == 0 and once.last_exit_code == 0,
        "ServiceStates",
        "service 'once' (exit 0, restart no): exited, 0 restarts, exit code 0",
        repr(once),
    )
    await _until(ctx, wid, "again", "is restarted at least twice (restart always)", lambda s: s.restarts >= 2)
    await asyncio.sleep(1.0)
    still = (await _states(ctx, wid))["once"]
    ensure(still.restarts == 0, "ServiceStates", "service 'once' never restarted", repr(still))
    return Passed()


async def check_health_and_order(ctx: CheckContext) -> Outcome:
    """A passing health command makes a service healthy, a failing one unhealthy while it runs on; a service
    waiting for service_healthy starts only after its dependency is healthy."""
    if not ctx.declared(cap.SERVICES):
        return await _refusal(ctx)
    req = await ctx.create("health")
    wid = req.workspace_id
    marker = f"vzc-health-{ctx.token}"
    passes = HealthCheck(argv=ctx.adapter.true(), interval=0.3, timeout=10.0, retries=2)
    fails = HealthCheck(argv=ctx.adapter.fail_with(1, "unhealthy"), interval=0.3, timeout=10.0, retries=2)
    specs = [
        ServiceSpec("db", ctx.adapter.idle(600, marker), health=passes),
        ServiceSpec(
            "sick",
            ctx.adapter.idle(600, marker),
            health=fails,
        ),
        ServiceSpec("app", ctx.adapter.idle(600, marker), depends_on={"db": "service_healthy"}),
    ]
    await _set(ctx, wid, specs)
    app = await _until(ctx, wid, "app", "is running", lambda s: s.state == "running")
    db = (await _states(ctx, wid))["db"]
    ensure(
        db.health == "healthy" and db.state == "running",
        "ServiceStates",
        "service 'db' healthy and running once 'app' (depends_on db: service_healthy) runs",
        repr(db),
    )
    sick = await _until(ctx, wid, "sick", "is unhealthy", lambda s: s.health == "unhealthy")
    ensure(sick.state == "running", "ServiceStates", "service 'sick' unhealthy but still running", repr(sick))
    await asyncio.sleep(1.5)
    now = await _states(ctx, wid)
    ensure(
        now["db"].health == "healthy" and now["db"].restarts == 0 and now["app"].pid == app.pid,
        "ServiceStates",
        "'db' still healthy, never restarted, and 'app' still the same process 1.5 s later",
        repr(now),
    )
    return Passed()


CASES = (
    Case(
        "services.supervised",
        "SetServices: a service runs supervised with its environment and log; a bad set changes nothing; "
        "a service taken out of the set stops (or UNSUPPORTED)",
        check_supervised,
        gated_by=(cap.SERVICES,),
    ),
    Case(
        "services.restart_policies",
        "restart no / on-failure (max_retries) / always, exit codes, output kept across restarts (or UNSUPPORTED)",
        check_restart_policies,
        gated_by=(cap.SERVICES,),
    ),
    Case(
        "services.health_and_order",
        "health commands (healthy, unhealthy) and depends_on service_healthy (or UNSUPPORTED)",
        check_health_and_order,
        gated_by=(cap.SERVICES,),
    ),
)
