"""`vz status`: what vz recorded, what each driver reports now, and the drift from vz.json (docs/cli.md).

Read-only: no lock, no operation record. A driver that fails is reported in its Machine's row (masked), never
raised.

Live health: every Machine row says where its state comes from. ``health`` is ``{"source": "driver", "state",
"checked_at", "error": null}`` when its driver answered Find just now (``state`` is then what the driver
reports: running, stopped or missing), and ``{"source": "record", "state": <recorded state>, ...,
"error": "..."}`` when it could not be asked (the recorded state is all there is). ``recorded_state`` is always
the record's; ``state`` keeps its old meaning (observed, "unknown" without an answer). Each Environment gets a
``health`` summary of its Machines' (``running`` when all run, ``stopped`` when none does, ``degraded`` in
between or when one is missing, ``unknown`` when a driver could not be asked, ``empty`` without Machines).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vz_core._types import MachineDetails
from vz_core.env._context import (
    Context,
    explain_interrupted,
    learn_definition_secrets,
    learn_recorded_secrets,
    observed,
    open_store,
    resolve_project,
    select_existing,
    stale_operations,
)
from vz_core.env._drivers import DriverPool
from vz_core.env._errors import DefinitionError
from vz_core.env._plan import diff_specs
from vz_core.env._select import select_machine
from vz_core.env._store import EnvironmentRecord, MachineRecord, OperationRecord, Store, utcnow
from vz_core.env._workload import service_rows
from vz_core.errors import VzError

if TYPE_CHECKING:
    from vz_core.env._definition import ProjectDefinition

__all__ = ["STATUS_SCHEMA", "environment_health", "status"]

STATUS_SCHEMA = "vz.status/1"


async def status(
    ctx: Context, *, environment: str | None = None, all_environments: bool = False, machine: str | None = None
) -> dict[str, Any]:
    """The `vz status --json` object: topology, ids, targets, drivers, observed state, drift (docs/cli.md)."""
    project = resolve_project(ctx, environment, required=not all_environments)
    learn_definition_secrets(ctx, project.header.path if project is not None and project.header else None)
    definition: ProjectDefinition | None = None
    definition_error = ""
    if project is not None and project.header is not None:
        from vz_core.env._definition import load_definition

        try:
            definition = load_definition(project.header.path)
        except DefinitionError as exc:
            definition_error = str(exc)
    pool = DriverPool(ctx.redactor, ctx.drivers)
    store = open_store(ctx)
    try:
        if all_environments:
            envs = store.environments(project.project_id if project else None)
        else:
            assert project is not None
            envs = [select_existing(ctx, store, project, environment)]
        out_envs = []
        for env in envs:
            defn = definition if definition is not None and definition.project_id == env.project_id else None
            out_envs.append(await _env_status(ctx, store, pool, env, defn, definition_error, machine))
        report = {
            "schema": STATUS_SCHEMA,
            "project": None
            if project is None
            else {
                "id": project.project_id,
                "definition": str(project.header.path) if project.header else None,
                "definition_error": definition_error or None,
            },
            "environments": out_envs,
        }
        return ctx.redactor.redact_data(report)
    finally:
        store.close()
        await pool.aclose()


async def _env_status(
    ctx: Context,
    store: Store,
    pool: DriverPool,
    env: EnvironmentRecord,
    definition: ProjectDefinition | None,
    definition_error: str,
    only_machine: str | None,
) -> dict[str, Any]:
    records = store.machines(env.env_id)
    learn_recorded_secrets(ctx, records)  # before any driver is asked: what it reports is masked
    if only_machine is not None:
        records = [select_machine(environment=env, machines=records, explicit=only_machine, env_var=None)]
    ops = store.operations(env.env_id)
    stale = stale_operations(store, env.env_id, None)
    machines_out = []
    for record in records:
        machines_out.append(await _machine_status(pool, env, record, definition, definition_error))
    drift: dict[str, Any]
    if definition is None:
        drift = {
            "status": "unknown",
            "error": definition_error or "no vz.json of this project was found from here",
            "not_created": [],
            "default_machine": None,
        }
    else:
        names = {r.name for r in store.machines(env.env_id)}
        not_created = [m.name for m in definition.machines if m.name not in names]
        desired_default = definition.effective_default_machine()
        default_change = (
            None
            if desired_default == env.default_machine
            else {"recorded": env.default_machine, "desired": desired_default}
        )
        drifted = (
            bool(not_created)
            or default_change is not None
            or any(m["drift"]["status"] != "in-sync" for m in machines_out)
        )
        drift = {
            "status": "drifted" if drifted else "in-sync",
            "not_created": not_created,
            "default_machine": default_change,
        }
    return {
        "id": env.env_id,
        "name": env.name,
        "project_id": env.project_id,
        "state": env.state,
        "health": environment_health(machines_out),
        "worktree": env.worktree,
        "bound_worktrees": store.bindings_of(env.env_id),
        "default_machine": env.default_machine,
        "created_at": env.created_at,
        "updated_at": env.updated_at,
        "last_operation": _op_json(ops[-1] if ops else None),
        "interrupted_operations": [
            {**(_op_json(op) or {}), "explanation": explain_interrupted(op).split(";")[0]} for op in stale
        ],
        "machines": machines_out,
        "drift": drift,
    }


async def _machine_status(
    pool: DriverPool,
    env: EnvironmentRecord,
    record: MachineRecord,
    definition: ProjectDefinition | None,
    definition_error: str,
) -> dict[str, Any]:
    spec = record.spec
    target = dict(spec.get("target") or {})
    driver_json: dict[str, Any]
    state = "unknown"
    find_json = None
    error = ""
    services: list[dict[str, Any]] = []
    try:
        driver, facts = await pool.get(record.driver, record.driver_options, recorded=True)
        driver_json = facts.describe()
        from vz_core._install import provenance_of

        driver_json["provenance"] = provenance_of(record.driver).get("provenance")
        found = await driver.find(record.workspace_id)
        state = observed(found)
        find_json = _find_json(found)
        if state == "running" and facts.extensions is not None and facts.extensions.services:
            try:
                services = await service_rows(driver, record.workspace_id)
            except VzError as exc:  # the Machine's state stands; only its services are unknown
                error = f"its services could not be read: {exc}"
        if not target.get("arch"):
            target["arch"] = await driver.target_architecture(record.workspace_id)
    except VzError as exc:
        driver_json = {"name": record.driver, "error": str(exc)}
        error = str(exc)
    health = {
        "source": "record" if find_json is None and state == "unknown" else "driver",
        "state": record.state if state == "unknown" else state,
        "checked_at": utcnow(),
        "error": error or None,
    }
    driver_json["matrix"] = _matrix_json(record.driver, str(target.get("os") or "linux"))
    drift: dict[str, Any]
    if definition is None:
        drift = {"status": "unknown", "changes": []}
    else:
        try:
            desired = definition.machine(record.name)
        except KeyError:
            drift = {"status": "not-in-definition", "changes": []}
        else:
            changes = diff_specs(spec, desired.recorded())
            drift = {"status": "drifted" if changes else "in-sync", "changes": [c.to_json() for c in changes]}
    return {
        "id": record.machine_id,
        "name": record.name,
        "workspace_id": record.workspace_id,
        "default": record.name == env.default_machine,
        "target": target,
        "profile": spec.get("profile"),
        "image": spec.get("image"),
        "workspace": spec.get("workspace"),
        "driver": driver_json,
        "state": state,
        "recorded_state": record.state,
        "health": health,
        "find": find_json,
        "error": error or None,
        "drift": drift,
        "services": services,
    }


def environment_health(machines: list[dict[str, Any]]) -> dict[str, Any]:
    """The health summary of an Environment from its Machine rows (see the module docstring)."""
    healths = [m["health"] for m in machines]
    states = {h["state"] for h in healths}
    if not healths:
        state = "empty"
    elif any(h["source"] != "driver" for h in healths):
        state = "unknown"
    elif states == {"running"}:
        state = "running"
    elif "running" not in states and "missing" not in states:
        state = "stopped"
    else:
        state = "degraded"
    source = "driver" if healths and all(h["source"] == "driver" for h in healths) else "record"
    checked = max((h["checked_at"] for h in healths), default=utcnow())
    return {"source": source, "state": state, "checked_at": checked}


def _matrix_json(driver: str, target_os: str) -> dict[str, str] | None:
    """This host/target pair's row of the capability matrix (None when the matrix does not list it)."""
    from vz_core.capability_matrix import current_host_os, lookup

    entry = lookup(driver, current_host_os(), target_os)
    return None if entry is None else {"status": entry.status, "host_os": entry.host_os, "note": entry.note}


def _find_json(details: MachineDetails | None) -> dict[str, Any] | None:
    if details is None:
        return None
    return {
        "id": details.id,
        "created_at": details.created_at,
        "status": details.state.status,
        "started_at": details.state.started_at,
        "exit_code": details.state.exit_code,
        "error": details.state.error,
    }


def _op_json(op: OperationRecord | None) -> dict[str, Any] | None:
    if op is None:
        return None
    return {
        "id": op.op_id,
        "kind": op.kind,
        "status": op.status,
        "step": op.step,
        "pid": op.pid,
        "started_at": op.started_at,
        "finished_at": op.finished_at,
        "error": op.error,
    }
