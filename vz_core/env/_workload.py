"""What `vz up` runs in the Machines once they run: setup steps, then services, in dependency order.

Setup steps (``machines[].setup``) run once per Machine, in order, as the developer identity in the workspace,
with the Machine's environment; their hash (with the image reference, the user, the workdir and the names of
the environment's variables) is recorded inside the Machine at ``SETUP_RECORD``, so a later `vz up` skips them
while it is unchanged and reruns them in place (saying so) when it changed. A recreated Machine has a fresh
filesystem and runs them again. A failing step fails `vz up` naming the step and its exit code; the Machine
stays for inspection.

Services with a ``command`` are handed to each Machine's agent (``Driver.set_services``), which supervises them
(restart, health, logs) independently of vz. A dependency inside one Machine is the agent's to wait for; one on
another Machine's service is vz's: a service is handed over only once what it depends on elsewhere is in the
asked state. `vz up` then waits until every service runs (and is healthy where it has a health check), up to
``VZ_SERVICES_TIMEOUT`` seconds (default 300), and fails naming the service that did not get there.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from vz_core._types import ExecExit, ExecOutput, ExecSpec
from vz_core.env._workload_def import argv_of, dependencies, dependency_ref, parse_restart
from vz_core.errors import RuntimeFailureError, RuntimeTimeoutError, UnsupportedError, UserError
from vz_core.services import HealthCheck, ServiceSpec, ServiceState

if TYPE_CHECKING:
    from vz_core._driver import Driver
    from vz_core.env._context import Context
    from vz_core.env._definition import Machine, ProjectDefinition
    from vz_core.env._drivers import DriverFacts, DriverPool
    from vz_core.env._store import EnvironmentRecord, MachineRecord

__all__ = [
    "SETUP_RECORD",
    "check_workload_support",
    "exec_identity",
    "has_services",
    "service_row",
    "service_rows",
    "service_specs",
    "setup_hash",
    "start_workloads",
]

SETUP_RECORD: Final = "/var/lib/vz/setup.json"
ENV_TIMEOUT: Final = "VZ_SERVICES_TIMEOUT"
DEFAULT_TIMEOUT: Final = 300.0
_POLL: Final = 0.25


def has_services(machine: Machine) -> bool:
    return any(s.command is not None for s in machine.services)


def check_workload_support(machine: Machine, facts: DriverFacts, where: str) -> None:
    """A Machine with services needs a driver that supervises them; refused before anything changes."""
    if has_services(machine) and not (facts.extensions and facts.extensions.services):
        index = next(i for i, s in enumerate(machine.services) if s.command is not None)
        raise UserError(
            f"{where}.services[{index}].command: driver {machine.driver!r} does not run services (its extensions "
            "do not offer them); choose a driver that does (linux_native, qemu) or remove the command"
        )


def exec_identity(machine: Machine) -> tuple[str, str]:
    """(user, workdir) setup steps run with: the developer identity (as `vz exec`), in the workspace."""
    workdir = machine.workspace.target if machine.workspace.projection != "none" else ""
    return machine.remote_user or "", workdir


def setup_hash(machine: Machine) -> str:
    user, workdir = exec_identity(machine)
    doc = {
        "steps": [list(argv_of(step)) for step in machine.setup],
        "image": machine.image,
        "user": user,
        "workdir": workdir,
        "environment": sorted(machine.environment),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _health(machine: Machine, index: int) -> HealthCheck | None:
    svc = machine.services[index]
    h = svc.health
    if h is None:
        return None
    port = 0
    if h.tcp is True:
        port = svc.port
    elif isinstance(h.tcp, int):
        port = h.tcp
    return HealthCheck(
        argv=argv_of(h.command) if h.command is not None else (),
        tcp_port=port,
        interval=h.interval,
        timeout=h.timeout,
        retries=h.retries,
        start_period=h.start_period or 0.0,
    )


def service_specs(machine: Machine, names: set[str] | None = None) -> list[ServiceSpec]:
    """The agent's service set of ``machine`` (only ``names``, when given): dependencies inside the Machine
    travel with it; those on other Machines are vz's to wait for and stay out."""
    out = []
    for index, svc in enumerate(machine.services):
        if svc.command is None or (names is not None and svc.name not in names):
            continue
        local = {}
        for ref, condition in dependencies(svc.depends_on).items():
            owner, name = dependency_ref(machine.name, ref)
            if owner == machine.name:
                local[name] = condition
        policy, retries = parse_restart(svc.restart)
        out.append(
            ServiceSpec(
                name=svc.name,
                argv=argv_of(svc.command),
                environment=dict(svc.environment),
                user=svc.user or "",
                workdir=svc.workdir or "",
                restart=policy,
                max_retries=retries,
                health=_health(machine, index),
                depends_on=local,
                stop_timeout=svc.stop_timeout,
            )
        )
    return out


async def _no_input() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover


async def _run(driver: Driver, spec: ExecSpec, on_output: Any = None) -> tuple[ExecExit, bytes]:
    out = bytearray()
    events = driver.exec(spec, _no_input())
    try:
        async for event in events:
            if isinstance(event, ExecOutput):
                if on_output is not None:
                    on_output(event.stream, event.data)
                else:
                    out += event.data
            else:
                return event, bytes(out)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    raise RuntimeFailureError("the exec stream ended without an exit status")


@dataclass
class _Line:
    """Turns output chunks into progress lines (one note per complete line)."""

    emit: Any
    buffer: bytes = b""

    def feed(self, stream: str, data: bytes) -> None:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self.emit(stream, line.decode(errors="replace"))

    def flush(self) -> None:
        if self.buffer:
            self.emit("stdout", self.buffer.decode(errors="replace"))
            self.buffer = b""


def _spelled(step: str | Sequence[str]) -> str:
    text = step if isinstance(step, str) else " ".join(step)
    return text if len(text) <= 60 else text[:57] + "..."


async def run_setup(
    ctx: Context, driver: Driver, record: MachineRecord, machine: Machine, index: int, env: EnvironmentRecord
) -> None:
    if not machine.setup:
        return
    fields: dict[str, Any] = {
        "environment": env.name,
        "environment_id": env.env_id,
        "machine": machine.name,
        "machine_id": record.machine_id,
    }
    digest = setup_hash(machine)
    root = ExecSpec(workspace_id=record.workspace_id, argv=("cat", SETUP_RECORD), user="root")
    exit_, data = await _run(driver, root)
    before = ""
    if exit_.exit_code == 0:
        try:
            before = str(json.loads(data).get("hash", ""))
        except (ValueError, AttributeError):
            before = ""
    if before == digest:
        ctx.progress.note(
            "setup-skipped", f"machine {machine.name}: setup steps unchanged since they ran; skipped", **fields
        )
        return
    if before:
        ctx.progress.note(
            "setup-changed",
            f"machine {machine.name}: setup steps (or the image, user or environment they run with) changed since "
            "they last ran; running them again in place. `vz up --recreate` starts from a fresh Machine instead",
            **fields,
        )
    user, workdir = exec_identity(machine)
    total = len(machine.setup)
    for number, step in enumerate(machine.setup):
        where = f"$.machines[{index}].setup[{number}]"

        def emit(stream: str, line: str, number: int = number) -> None:
            ctx.progress.note("setup-output", f"  {line}", step=number, stream=stream, line=line, **fields)

        lines = _Line(emit)
        label = f"machine {machine.name}: setup {number + 1}/{total}: {_spelled(step)}"
        with ctx.progress.step("setup", label, step=number, **fields):
            spec = ExecSpec(workspace_id=record.workspace_id, argv=argv_of(step), user=user, workdir=workdir)
            result, _ = await _run(driver, spec, lines.feed)
            lines.flush()
        if result.exit_code != 0 or result.signal:
            how = f"signal {result.signal}" if result.signal else f"exit code {result.exit_code}"
            raise RuntimeFailureError(
                f"{where} ({_spelled(step)}) failed in machine {machine.name} with {how}; the Machine is left "
                f"running for inspection (`vz exec --machine {machine.name} -- sh`); fix the step and run `vz up` "
                "again (steps run again from the first)"
            )
    doc = json.dumps({"hash": digest, "steps": total}).encode()
    write = ExecSpec(
        workspace_id=record.workspace_id,
        argv=("sh", "-c", f"mkdir -p /var/lib/vz && printf '%s\\n' \"$1\" > {SETUP_RECORD}", "sh", doc.decode()),
        user="root",
    )
    written, err = await _run(driver, write)
    if written.exit_code != 0:
        raise RuntimeFailureError(
            f"machine {machine.name}: the setup steps ran, but recording them in {SETUP_RECORD} failed "
            f"(exit code {written.exit_code}: {err.decode(errors='replace').strip()}); they will run again"
        )


def _timeout(ctx: Context) -> float:
    raw = ctx.environ.get(ENV_TIMEOUT, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        raise UserError(f"{ENV_TIMEOUT}={raw!r}: give the seconds `vz up` waits for services, 1..86400")
    return value


def _met(state: ServiceState | None, condition: str) -> bool:
    if state is None:
        return False
    if condition == "service_healthy":
        return state.health == "healthy"
    if condition == "service_completed_successfully":
        return state.state == "exited" and state.last_exit_code == 0 and not state.last_signal
    return state.state == "running"


def _ready(state: ServiceState) -> bool:
    """What `vz up` waits for: running, and healthy when it has a health check; a one-shot that exited 0."""
    if state.state == "exited":
        return state.last_exit_code == 0 and not state.last_signal
    return state.state == "running" and state.health in ("", "healthy")


def _hopeless(state: ServiceState, restart: str) -> bool:
    """The service will not get anywhere without a change: failed, or exited badly with no restart coming."""
    if state.state == "failed":
        return True
    return state.state == "exited" and restart == "no" and (state.last_exit_code != 0 or bool(state.last_signal))


def _describe(state: ServiceState | None) -> str:
    if state is None:
        return "not started yet"
    parts = [state.state]
    if state.health:
        parts.append(state.health)
    if state.last_exit_code is not None:
        parts.append(f"last exit code {state.last_exit_code}{' ' + state.last_signal if state.last_signal else ''}")
    if state.restarts:
        parts.append(f"{state.restarts} restarts")
    if state.last_error:
        parts.append(state.last_error)
    return ", ".join(parts)


async def start_workloads(
    ctx: Context,
    pool: DriverPool,
    definition: ProjectDefinition,
    env: EnvironmentRecord,
    records: Mapping[str, MachineRecord],
) -> None:
    """Setup steps of every Machine, then every Machine's services (see the module's docstring)."""
    drivers: dict[str, Driver] = {}
    for machine in definition.machines:
        record = records[machine.name]
        drivers[machine.name], _ = await pool.get(record.driver, record.driver_options, recorded=True)
    for index, machine in enumerate(definition.machines):
        await run_setup(ctx, drivers[machine.name], records[machine.name], machine, index, env)
    running = [m for m in definition.machines if has_services(m)]
    for machine in definition.machines:
        if not has_services(machine):  # services removed from vz.json stop
            await _clear(drivers[machine.name], records[machine.name])
    if not running:
        return
    limit = _timeout(ctx)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    sent: dict[str, set[str] | None] = dict.fromkeys((m.name for m in running), None)
    restart = {(m.name, s.name): parse_restart(s.restart)[0] for m in running for s in m.services if s.command}
    everything = sorted(restart)
    fields = {"environment": env.name, "environment_id": env.env_id}
    with ctx.progress.step("services", f"starting the services of Environment {env.label()}", **fields):
        while True:
            states: dict[tuple[str, str], ServiceState] = {}
            for machine in running:
                if sent[machine.name] is not None:
                    for st in await _states(drivers[machine.name], records[machine.name]):
                        states[(machine.name, st.name)] = st
            changed = False
            for machine in running:
                eligible = _eligible(machine, states)
                if eligible != sent[machine.name]:
                    specs = service_specs(machine, eligible)
                    for st in await _set(drivers[machine.name], records[machine.name], machine, specs):
                        states[(machine.name, st.name)] = st
                    sent[machine.name] = eligible
                    changed = True
            if all(k in states and _ready(states[k]) for k in everything):
                for key in everything:
                    ready = states[key]
                    ctx.progress.note(
                        "service-ready",
                        f"service {key[1]} of machine {key[0]}: {_describe(ready)}",
                        machine=key[0],
                        service=key[1],
                        state=ready.state,
                        health=ready.health,
                        **fields,
                    )
                return
            for key in everything:
                found = states.get(key)
                if found is not None and _hopeless(found, restart[key]):
                    raise RuntimeFailureError(
                        f"service {key[1]} of machine {key[0]} did not start: {_describe(found)}; `vz status "
                        f"--environment {env.name}` shows its state; fix vz.json, then `vz up` again"
                    )
            if loop.time() > deadline:
                key = next(k for k in everything if not (k in states and _ready(states[k])))
                why = _waiting_for(definition, key, states)
                raise RuntimeTimeoutError(
                    f"service {key[1]} of machine {key[0]} did not get ready within {limit:g} s "
                    f"({_describe(states.get(key))}{why}); `vz status --environment {env.name}` shows every "
                    f"service; {ENV_TIMEOUT} sets how long `vz up` waits"
                )
            if not changed:
                await asyncio.sleep(_POLL)


def _waiting_for(
    definition: ProjectDefinition, key: tuple[str, str], states: Mapping[tuple[str, str], ServiceState]
) -> str:
    machine = definition.machine(key[0])
    svc = next(s for s in machine.services if s.name == key[1])
    for ref, condition in dependencies(svc.depends_on).items():
        dep = dependency_ref(machine.name, ref)
        if not _met(states.get(dep), condition):
            return f"; it waits for {dep[0]}/{dep[1]} ({condition}), which is {_describe(states.get(dep))}"
    return ""


def _eligible(machine: Machine, states: Mapping[tuple[str, str], ServiceState]) -> set[str]:
    """Services of ``machine`` whose dependencies on other Machines are met, and whose dependencies inside it
    are eligible too (the agent refuses a set naming a service it does not have)."""
    out: set[str] = set()
    pending = [s for s in machine.services if s.command is not None]
    grew = True
    while grew:
        grew = False
        for svc in pending:
            if svc.name in out:
                continue
            refs = [(dependency_ref(machine.name, ref), c) for ref, c in dependencies(svc.depends_on).items()]
            if all(
                name in out if owner == machine.name else _met(states.get((owner, name)), c)
                for (owner, name), c in refs
            ):
                out.add(svc.name)
                grew = True
    return out


async def _states(driver: Driver, record: MachineRecord) -> tuple[ServiceState, ...]:
    method = getattr(driver, "service_states", None)
    if method is None:
        return ()
    states: tuple[ServiceState, ...] = await method(record.workspace_id)
    return states


async def _set(
    driver: Driver, record: MachineRecord, machine: Machine, specs: Sequence[ServiceSpec]
) -> tuple[ServiceState, ...]:
    method = getattr(driver, "set_services", None)
    if method is None:
        if specs:
            raise UnsupportedError(f"driver {record.driver!r} of machine {machine.name} does not run services")
        return ()
    states: tuple[ServiceState, ...] = await method(record.workspace_id, specs)
    return states


async def _clear(driver: Driver, record: MachineRecord) -> None:
    """An empty set for a Machine whose driver runs services (those removed from vz.json stop)."""
    method = getattr(driver, "set_services", None)
    if method is None:
        return
    try:
        await method(record.workspace_id, ())
    except UnsupportedError:
        pass  # an agent that predates services runs none


def service_row(state: ServiceState) -> dict[str, Any]:
    """One service in `vz status --json` (vz.api.v1 ``ServiceStatus``)."""
    return {
        "name": state.name,
        "state": state.state,
        "health": state.health,
        "pid": state.pid,
        "restarts": state.restarts,
        "last_exit_code": state.last_exit_code,
        "last_signal": state.last_signal,
        "last_error": state.last_error,
        "started_at": state.started_at,
    }


async def service_rows(driver: Driver, workspace_id: str) -> list[dict[str, Any]]:
    """The services of a running Machine for `vz status`; an agent that predates services runs none."""
    method = getattr(driver, "service_states", None)
    if method is None:
        return []
    try:
        states: tuple[ServiceState, ...] = await method(workspace_id)
    except UnsupportedError:
        return []
    return [service_row(s) for s in states]
