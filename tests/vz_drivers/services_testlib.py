"""Services through a driver of the shared agent layer (linux_native, qemu): the agent supervises them in the
Machine, in dependency order, with health and restart; they outlive the driver object (a daemon or plugin that
went away) and a new one reports their state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from machine_testlib import run

from vz_core import Driver
from vz_core.services import HealthCheck, ServiceSpec, ServiceState


async def until(
    driver: Driver,
    workspace_id: str,
    check: Callable[[dict[str, ServiceState]], bool],
    what: str,
    within: float = 120,
) -> dict[str, ServiceState]:
    """Poll the driver's service states until ``check`` holds (they have no event to wait on)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        states = {s.name: s for s in await driver.service_states(workspace_id)}  # type: ignore[attr-defined]
        if check(states):
            return states
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {states}")
        await asyncio.sleep(0.2)


def example_set(tag: str) -> list[ServiceSpec]:
    """A key-value store with a health check, and an app that needs it healthy and restarts always."""
    db = ServiceSpec(
        name="db",
        argv=("sh", "-c", f"echo db {tag} up; sleep 0.5; touch /tmp/db-{tag}; exec sleep 100000"),
        health=HealthCheck(argv=("test", "-e", f"/tmp/db-{tag}"), interval=0.2, timeout=10, retries=3),
        stop_timeout=2,
    )
    app = ServiceSpec(
        name="app",
        argv=("sh", "-c", f"test -e /tmp/db-{tag} && echo app {tag} sees db; exec sleep 100000"),
        environment={"APP_MODE": "test"},
        restart="always",
        depends_on={"db": "service_healthy"},
        stop_timeout=2,
    )
    return [app, db]


async def check_services(make_driver: Callable[[], Driver], workspace_id: str, tag: str) -> None:
    """``make_driver`` gives a fresh driver object for the running Machine ``workspace_id``."""
    first = make_driver()
    try:
        ext = await first.extensions()
        assert ext is not None
        states = await first.set_services(workspace_id, example_set(tag))  # type: ignore[attr-defined]
        assert [s.name for s in states] == ["db", "app"]
        ready = await until(first, workspace_id, lambda s: s["app"].state == "running", "app running")
        assert ready["db"].health == "healthy" and ready["db"].state == "running"
        await until(first, workspace_id, lambda s: s["app"].log_bytes > 0, "app's output")
        logs = await first.service_logs(workspace_id, "app")  # type: ignore[attr-defined]
        assert logs == f"app {tag} sees db\n".encode()
    finally:
        await first.close()
    second = make_driver()  # the one that set them is gone; the agent kept them
    try:
        again = {s.name: s for s in await second.service_states(workspace_id)}  # type: ignore[attr-defined]
        assert {n: (s.pid, s.state) for n, s in again.items()} == {n: (s.pid, "running") for n, s in ready.items()}
        # Killed by something in the Machine: restart always brings it back.
        kill = await run(second, workspace_id, "kill", "-9", str(ready["app"].pid))
        assert kill.exit.exit_code == 0, kill.stderr
        back = await until(
            second, workspace_id, lambda s: s["app"].restarts == 1 and s["app"].state == "running", "app restarted"
        )
        assert back["app"].last_signal == "SIGKILL" and back["app"].pid != ready["app"].pid
        assert back["db"].pid == ready["db"].pid  # untouched
        assert await second.set_services(workspace_id, []) == ()  # type: ignore[attr-defined]
        gone = await run(second, workspace_id, "sh", "-c", f"kill -0 {back['db'].pid} 2>/dev/null || echo gone")
        assert gone.stdout == b"gone\n"
    finally:
        await second.close()
