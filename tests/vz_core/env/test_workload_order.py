"""`vz up`'s part of service order (vz_core.env._workload.start_workloads): a service that depends on another
Machine's service is handed to its Machine only once that one is in the asked state; what does not get there in
time fails `vz up` naming it and what it waits for; a service that cannot start fails it at once.

The Machines are simulated by an in-test driver whose services change state on each poll (the agent's own
supervision is tested against the real agent in tests/vz_drivers/_agent/test_agent_services.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from vz_core.env._context import Context
from vz_core.env._definition import parse_definition
from vz_core.env._records import EnvironmentRecord, MachineRecord
from vz_core.env._workload import start_workloads
from vz_core.errors import RuntimeFailureError, RuntimeTimeoutError
from vz_core.services import ServiceSpec, ServiceState


class SimulatedMachines:
    """set_services / service_states of every Machine: a service runs on the poll after it was set, and becomes
    healthy ``healthy_after`` polls later (never, when None)."""

    def __init__(self, healthy_after: dict[str, int | None], exits: dict[str, int] | None = None) -> None:
        self.healthy_after = healthy_after
        self.exits = exits or {}
        self.sets: list[tuple[str, tuple[str, ...]]] = []
        self.states: dict[str, dict[str, ServiceState]] = {}
        self.age: dict[tuple[str, str], int] = {}

    async def set_services(self, workspace_id: str, specs: Sequence[ServiceSpec]) -> tuple[ServiceState, ...]:
        self.sets.append((workspace_id, tuple(s.name for s in specs)))
        current = self.states.setdefault(workspace_id, {})
        for name in list(current):
            if name not in {s.name for s in specs}:
                del current[name]
        for spec in specs:
            if spec.name not in current:
                current[spec.name] = ServiceState(spec.name, "waiting", "starting" if spec.health else "")
                self.age[(workspace_id, spec.name)] = 0
        return tuple(current.values())

    async def service_states(self, workspace_id: str) -> tuple[ServiceState, ...]:
        current = self.states.get(workspace_id, {})
        for name, st in list(current.items()):
            age = self.age[(workspace_id, name)] = self.age[(workspace_id, name)] + 1
            if name in self.exits:
                current[name] = replace(st, state="exited", last_exit_code=self.exits[name], pid=0)
                continue
            after = self.healthy_after.get(name)
            health = st.health
            if health and after is not None and age > after:
                health = "healthy"
            current[name] = replace(st, state="running", pid=100 + age, health=health)
        return tuple(current.values())


class Pool:
    def __init__(self, driver: SimulatedMachines) -> None:
        self.driver = driver

    async def get(self, name: str, options: Any = None, *, recorded: bool = False) -> tuple[Any, None]:
        return self.driver, None


def definition() -> Any:
    machine = {"profile": "developer", "driver": "linux_native", "image": "vz:default"}
    return parse_definition(
        {
            "version": 2,
            "project_id": "order-1",
            "default_machine": "app",
            "machines": [
                {
                    **machine,
                    "name": "app",
                    "services": [
                        {
                            "name": "web",
                            "port": 8080,
                            "command": "serve",
                            "depends_on": {"db/kv": {"condition": "service_healthy"}},
                        },
                        {"name": "worker", "port": 9000, "command": "work", "depends_on": ["web"]},
                        {"name": "cron", "port": 9001, "command": "tick"},
                    ],
                },
                {
                    **machine,
                    "name": "db",
                    "services": [{"name": "kv", "port": 5984, "command": "kv", "health": {"tcp": True, "interval": 1}}],
                },
            ],
            "paths": [{"from": "app", "to": "db", "service": "kv"}],
        }
    )


ENV = EnvironmentRecord("env_1", "order-1", "default", "running", "/w", "app", "", "")


def records() -> dict[str, MachineRecord]:
    return {
        name: MachineRecord("env_1", f"mch_{name}", name, f"ws-{name}", "linux_native", {}, "running", "", "")
        for name in ("app", "db")
    }


def context(**environ: str) -> Context:
    return Context(cwd=Path("/"), environ=environ)


async def test_a_dependency_on_another_machine_is_waited_for_before_the_dependent_is_handed_over() -> None:
    machines = SimulatedMachines({"kv": 3})
    await start_workloads(context(), Pool(machines), definition(), ENV, records())  # type: ignore[arg-type]
    app_sets = [names for ws, names in machines.sets if ws == "ws-app"]
    # First only cron (web waits for db/kv healthy, worker for web); then all three, once kv was healthy.
    assert app_sets == [("cron",), ("web", "worker", "cron")]
    assert [names for ws, names in machines.sets if ws == "ws-db"] == [("kv",)]
    assert all(s.state == "running" for s in machines.states["ws-app"].values())


async def test_a_dependency_that_never_gets_there_fails_naming_the_service_and_what_it_waits_for() -> None:
    machines = SimulatedMachines({"kv": None})
    with pytest.raises(RuntimeTimeoutError) as info:
        await start_workloads(
            context(VZ_SERVICES_TIMEOUT="1"),
            Pool(machines),  # type: ignore[arg-type]
            definition(),
            ENV,
            records(),
        )
    message = str(info.value)
    assert "service web of machine app did not get ready within 1 s" in message, message
    assert "it waits for db/kv (service_healthy), which is running, starting" in message, message
    assert "VZ_SERVICES_TIMEOUT" in message
    assert ("ws-app", ("web", "worker", "cron")) not in machines.sets  # never handed over


async def test_a_service_that_exits_with_restart_no_fails_at_once() -> None:
    machines = SimulatedMachines({"kv": 1}, exits={"cron": 2})
    with pytest.raises(
        RuntimeFailureError, match="service cron of machine app did not start: exited, last exit code 2"
    ):
        await start_workloads(context(), Pool(machines), definition(), ENV, records())  # type: ignore[arg-type]


async def test_a_bad_timeout_is_refused() -> None:
    from vz_core.errors import UserError

    with pytest.raises(UserError, match="VZ_SERVICES_TIMEOUT='soon'"):
        await start_workloads(
            context(VZ_SERVICES_TIMEOUT="soon"),
            Pool(SimulatedMachines({})),  # type: ignore[arg-type]
            definition(),
            ENV,
            records(),
        )
