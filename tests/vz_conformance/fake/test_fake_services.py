"""The fake driver's services model the agent's: stop order and signals, Delete, bad sets, bounded logs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from fake_testlib import request, unique_id
from vz_conformance.fake import FakeDriver
from vz_conformance.fake._services import LOG_LIMIT

from vz_core.errors import FailedPreconditionError, InvalidArgumentError
from vz_core.services import ServiceSpec, ServiceState


async def _until(driver: FakeDriver, ws: str, name: str, ok: Callable[[ServiceState], bool]) -> ServiceState:
    state = None
    for _ in range(200):
        state = {s.name: s for s in await driver.service_states(ws)}.get(name)
        if state is not None and ok(state):
            return state
        await asyncio.sleep(0.05)
    raise AssertionError(f"service {name!r}: {state!r}")


async def test_stop_terminates_dependents_first_then_kills_after_the_timeout(
    driver: FakeDriver, machine: str, tmp_path: Path
) -> None:
    order = tmp_path / "order"
    trap = f'trap "echo $1 >> {order}; exit 0" TERM; while :; do sleep 0.1; done'
    stubborn = f'trap "echo stubborn-ignored >> {order}" TERM; while :; do sleep 0.1; done'
    specs = [
        ServiceSpec("db", ("sh", "-c", trap, "sh", "db")),
        ServiceSpec("app", ("sh", "-c", trap, "sh", "app"), depends_on={"db": "service_started"}),
        ServiceSpec("stuck", ("sh", "-c", stubborn), stop_timeout=0.5),
    ]
    await driver.set_services(machine, specs)
    for spec in specs:
        await _until(driver, machine, spec.name, lambda s: s.state == "running")
    await asyncio.sleep(0.3)  # the shells have set their traps
    await driver.stop(machine)
    lines = order.read_text().split()
    assert lines.index("app") < lines.index("db")  # dependents first
    assert "stubborn-ignored" in lines  # SIGTERM reached it; SIGKILL ended it after its timeout
    with pytest.raises(FailedPreconditionError):
        await driver.service_states(machine)
    await driver.start(machine)
    assert await driver.service_states(machine) == ()  # the host gives the set again on every start


async def test_delete_kills_services(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws))
    await driver.set_services(ws, [ServiceSpec("idle", ("sleep", "600"))])
    pid = (await _until(driver, ws, "idle", lambda s: s.pid > 0)).pid
    await driver.delete(ws)
    for _ in range(100):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"service process {pid} still runs after Delete")


@pytest.mark.parametrize(
    ("specs", "fragment"),
    [
        ([ServiceSpec("a", ("true",), depends_on={"a": "service_started"})], "cycle"),
        ([ServiceSpec("a", ("true",)), ServiceSpec("a", ("true",))], "twice"),
        ([ServiceSpec("a", ("true",), restart="sometimes")], "restart"),  # type: ignore[arg-type]
        ([ServiceSpec("a", ("true",), workdir="/no/such/dir")], "workdir"),
        ([ServiceSpec("b", ("true",)), ServiceSpec("a", ("true",), depends_on={"b": "service_healthy"})], "health"),
    ],
)
async def test_a_bad_set_is_refused_and_changes_nothing(
    driver: FakeDriver, machine: str, specs: list[ServiceSpec], fragment: str
) -> None:
    await driver.set_services(machine, [ServiceSpec("keep", ("sleep", "600"))])
    pid = (await _until(driver, machine, "keep", lambda s: s.pid > 0)).pid
    with pytest.raises(InvalidArgumentError) as info:
        await driver.set_services(machine, specs)
    assert fragment in info.value.message
    assert [(s.name, s.pid) for s in await driver.service_states(machine)] == [("keep", pid)]


async def test_logs_are_bounded_and_kept_across_restarts(driver: FakeDriver, machine: str) -> None:
    chunk = LOG_LIMIT // 2 + 1
    argv = ("sh", "-c", f"head -c {chunk} /dev/zero | tr '\\0' x; echo; exit 1")
    await driver.set_services(machine, [ServiceSpec("big", argv, restart="on-failure", max_retries=2)])
    state = await _until(driver, machine, "big", lambda s: s.state == "failed")
    assert state.restarts == 2 and state.log_bytes > 3 * chunk
    log = await driver.service_logs(machine, "big")
    assert len(log) == LOG_LIMIT
    assert log.endswith(b"vz-fake: service big exited (code 1)\n")
    assert await driver.service_logs(machine, "big", 10) == log[-10:]
    with pytest.raises(InvalidArgumentError):
        await driver.service_logs(machine, "nope")
