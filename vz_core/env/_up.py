"""`vz up`: create or reconcile an Environment from its definition.

Life of `vz up` here: vz.json → ProjectDefinition → secrets resolved → every driver acquired, negotiated
(Info, Extensions), preflighted and checked against what each Machine asks for (target, profile, egress,
workspace projection, mounts, volumes, resources) → Environment selected (or created) under the project lock
→ the Environment lock → interrupted operations explained → Find on every recorded Machine → plan → blocked
changes refused → ReusePreflight for reused Machines → operation record → steps (RunImage / Start / Delete)
→ records persisted after each step → operation finished. Everything that can be refused is refused before
the first mutation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vz_core.drivers import driver_key
from vz_core.env._context import (
    Context,
    Project,
    choose,
    converge_stale,
    delete_owned,
    developer_identity,
    fail_operation,
    holder,
    learn_recorded_secrets,
    lock_environment,
    observed,
    open_store,
)
from vz_core.env._discover import DefinitionHeader, find_definition
from vz_core.env._drivers import DriverPool
from vz_core.env._errors import ConflictError, DefinitionError, PlanError
from vz_core.env._ids import new_env_id, new_machine_id, workspace_id
from vz_core.env._locks import FileLock, env_lock_path, project_lock_path
from vz_core.env._plan import Observed, Plan, RecordedMachine, Step, compute_plan
from vz_core.env._store import EnvironmentRecord, MachineRecord, Store
from vz_core.env._up_checks import (
    bind_source,
    check_bind_source,
    check_host_resources,
    check_local_image,
    check_machine,
    check_shared_workspace,
    check_worktree_writers,
    host_architecture,
)
from vz_core.env._up_network import attaches, ensure_route_domain, network_label, reattach_if_changed
from vz_core.env._up_request import run_request, volume_name
from vz_core.env._workload import check_workload_support, start_workloads
from vz_core.errors import NotFoundError, RuntimeFailureError, UserError
from vz_core.redact import Redactor

if TYPE_CHECKING:
    from vz_core.env._definition import Machine, ProjectDefinition

__all__ = ["host_architecture", "network_label", "up"]


# --- up -----------------------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    definition: ProjectDefinition
    path: Path
    environments: dict[str, dict[str, str]]
    native_arch: dict[str, str]
    redactor: Redactor


async def _prepare(ctx: Context, pool: DriverPool) -> _Prepared:
    from vz_core.env._definition import load_definition
    from vz_core.env._secrets import resolve_environment

    path = find_definition(ctx.cwd, ctx.definition_file)
    definition = load_definition(path)
    redactor = ctx.redactor
    environments: dict[str, dict[str, str]] = {}
    native: dict[str, str] = {}
    for index, machine in enumerate(definition.machines):
        where = f"$.machines[{index}]"
        environments[machine.name] = resolve_environment(
            machine, ctx.environ, json_path=f"{where}.environment", redactor=redactor
        )
    # Secrets of Machines recorded earlier (maybe no longer in vz.json) are masked before any driver speaks.
    with open_store(ctx) as store:
        for env in store.environments(definition.project_id):
            learn_recorded_secrets(ctx, store.machines(env.env_id))
    # The bind-source policy depends on the host alone: checked before any driver is asked anything.
    for index, machine in enumerate(definition.machines):
        for number, mount in enumerate(machine.mounts):
            if mount.type == "bind":
                where = f"$.machines[{index}].mounts[{number}].source"
                check_bind_source(ctx.progress, bind_source(path.parent, mount.source or ""), path.parent, where)
    check_shared_workspace(definition, where="$.machines")
    host_arch = host_architecture()
    checked: set[tuple[str, str]] = set()
    from vz_core.drivers import validate_project_options
    from vz_core.env._definition import check_image_reference
    from vz_core.registry import DriverRegistry

    builtin = set(DriverRegistry().names())  # built-in drivers read vz's image references (docs/images.md)

    for index, machine in enumerate(definition.machines):
        where = f"$.machines[{index}]"
        try:
            # Host-scoped and unknown options are refused here, naming the key, before any driver is built.
            validate_project_options(machine.driver, machine.driver_options, where=f"{where}.driver_options")
        except NotFoundError as exc:
            raise UserError(f"{where}.driver: {exc.message}") from None
        if machine.driver in builtin:
            try:
                check_image_reference(machine.image)
            except ValueError as exc:
                raise UserError(f"{where}.image: {exc}") from None
            check_local_image(machine.image, f"{where}.image")
        check_host_resources(machine, where)
    attaching: set[str] = set()
    for index, machine in enumerate(definition.machines):
        where = f"$.machines[{index}]"
        try:
            _, facts = await pool.get(machine.driver, machine.driver_options)
        except NotFoundError as exc:
            raise UserError(f"{where}.driver: {exc.message}") from None
        key = driver_key(machine.driver, machine.driver_options)
        if key not in checked:
            with ctx.progress.step("preflight", f"checking driver {machine.driver}", driver=machine.driver):
                await pool.preflight(machine.driver, machine.driver_options)
            checked.add(key)
        # The target comes from the definition (target.arch, else this host's architecture): no runtime is asked
        # for TargetArchitecture before the Machine's workspace exists; the answer is checked after creation.
        native[machine.name] = host_arch
        check_machine(machine, facts, host_arch, path.parent, where, ctx.progress, definition.version)
        check_workload_support(machine, facts, where)
        if attaches(facts):
            attaching.add(machine.name)
    # A path, export or import of a Machine whose driver cannot join it to the route domain would never connect.
    from vz_core.env._definition import unreachable_problems

    problems = unreachable_problems(definition, attaching)
    if problems:
        lines = "\n".join(f"  {where}: {message}" for where, message in problems)
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        raise DefinitionError(f"{path} declares network paths no driver can realize ({count}):\n{lines}", problems)
    return _Prepared(definition, path, environments, native, redactor)


async def up(
    ctx: Context, *, environment: str | None = None, recreate: bool = False, dry_run: bool = False
) -> dict[str, Any]:
    """Create or reconcile the selected Environment; the result object of `vz up --json` (docs/cli.md)."""
    pool = DriverPool(ctx.redactor, ctx.drivers)
    store: Store | None = None
    env_lock: FileLock | None = None
    try:
        prepared = await _prepare(ctx, pool)
        definition = prepared.definition
        project = Project(DefinitionHeader(prepared.path, definition.project_id), definition.project_id)
        worktree = str(prepared.path.parent)
        store = open_store(ctx)
        op_id: str | None = None
        project_lock = FileLock(project_lock_path(definition.project_id))
        await project_lock.acquire(holder("up", ctx))
        try:
            choice = choose(ctx, store, project, environment, for_up=True)
            env = choice.environment
            if env is None and choice.create_name and ctx.redactor.redact(choice.create_name) != choice.create_name:
                # A name is stored and shown everywhere: a secret value in it would be at rest and in every list.
                raise UserError(
                    f"--environment {ctx.redactor.redact(choice.create_name)}: the name contains the value of a "
                    "secret of this project (a variable vz.json's secret references read); nothing was created. "
                    "Choose a name that is no secret."
                )
            check_worktree_writers(store, definition, env, worktree)
            if env is None and not dry_run:
                assert choice.create_name is not None
                env_id = new_env_id()
                env_lock = FileLock(env_lock_path(env_id))
                if not env_lock.try_acquire(holder("up", ctx)):
                    raise ConflictError(f"the lock of the new Environment {env_id} is taken; retry")
                with store.transaction() as db:
                    store.touch_project(db, definition.project_id, str(prepared.path))
                    env = store.create_environment(
                        db,
                        env_id=env_id,
                        project_id=definition.project_id,
                        name=choice.create_name,
                        worktree=worktree,
                        default_machine=definition.effective_default_machine(),
                    )
                    store.bind(db, definition.project_id, worktree, env_id)
                    op_id = store.begin_operation(db, env_id=env_id, project_id=definition.project_id, kind="up")
                ctx.progress.note(
                    "environment-created",
                    f"created Environment {env.label()}",
                    environment=env.name,
                    environment_id=env.env_id,
                )
            elif env is not None and choice.via == "flag" and not dry_run:
                _bind_selected(ctx, store, env, definition.project_id, worktree)
        finally:
            project_lock.release()
        if env is None:  # dry run of a new Environment: everything would be created
            plan = compute_plan(
                [(m.name, m.recorded()) for m in definition.machines],
                [],
                {},
                recorded_default=None,
                desired_default=definition.effective_default_machine(),
                recreate=recreate,
            )
            result = _up_result(None, choice.create_name, plan, dry_run=True, project_id=definition.project_id)
            return ctx.redactor.redact_data(result)
        if env_lock is None:
            env_lock = await lock_environment(ctx, store, env, "up")
            env = store.environment(env.env_id) or env
        converge_stale(ctx, store, env, env_lock, op_id)
        result = await _reconcile(ctx, store, pool, prepared, env, op_id, recreate=recreate, dry_run=dry_run)
        return ctx.redactor.redact_data(result)
    finally:
        if env_lock is not None:
            env_lock.release()
        if store is not None:
            store.close()
        await pool.aclose()


def _bind_selected(ctx: Context, store: Store, env: EnvironmentRecord, project_id: str, worktree: str) -> None:
    """`vz up --environment X`: bind this worktree to X, once X is known to be this project's and alive."""
    if env.project_id != project_id:  # selection only offers the project's own; checked again before writing
        raise ConflictError(f"Environment {env.label()} belongs to project {env.project_id!r}, not {project_id!r}")
    if env.state == "deleting":
        raise ConflictError(
            f"Environment {env.label()} is being deleted (or a delete was interrupted); run `vz delete "
            f"--environment {env.env_id}` to finish it, then `vz up --environment {env.name}`"
        )
    if env.env_id in store.bindings_here(project_id, worktree):
        return
    with store.transaction() as db:
        store.bind(db, project_id, worktree, env.env_id)
    where = "" if env.worktree == worktree else f"; its Machines project the worktree it was created in, {env.worktree}"
    ctx.progress.note(
        "environment-bound",
        f"bound this worktree ({worktree}) to Environment {env.label()}{where}",
        environment=env.name,
        environment_id=env.env_id,
        worktree=worktree,
    )


async def _reconcile(
    ctx: Context,
    store: Store,
    pool: DriverPool,
    prepared: _Prepared,
    env: EnvironmentRecord,
    op_id: str | None,
    *,
    recreate: bool,
    dry_run: bool,
) -> dict[str, Any]:
    definition = prepared.definition
    project_id = definition.project_id
    try:
        recorded = store.machines(env.env_id)
        learn_recorded_secrets(ctx, recorded)  # Machines no longer in vz.json may hold other secrets
        seen: dict[str, Observed] = {}
        for record in recorded:
            driver, _ = await pool.get(record.driver, record.driver_options, recorded=True)
            seen[record.machine_id] = observed(await driver.find(record.workspace_id))
        plan = compute_plan(
            [(m.name, m.recorded()) for m in definition.machines],
            [RecordedMachine(r.name, r.machine_id, r.spec, r.state) for r in recorded],
            seen,
            recorded_default=env.default_machine,
            desired_default=definition.effective_default_machine(),
            recreate=recreate,
        )
        ctx.progress.note(
            "plan",
            "\n".join([f"plan for Environment {env.label()}:", *("  " + line for line in plan.lines())]),
            environment=env.name,
            environment_id=env.env_id,
            plan=plan.to_json(),
        )
        if plan.blocked:
            raise PlanError(_blocked_message(env, plan.blocked))
        if dry_run:
            return _up_result(env, None, plan, dry_run=True, project_id=project_id)
        await _preflight_plan(pool, definition, plan, recorded)
    except BaseException as exc:
        if op_id is not None:  # only a brand-new Environment has an operation open this early
            fail_operation(store, env, op_id, exc, prepared.redactor)
        raise
    with store.transaction() as db:
        if op_id is None:
            op_id = store.begin_operation(db, env_id=env.env_id, project_id=project_id, kind="up", plan=plan.to_json())
        else:
            store.set_operation_plan(db, op_id, plan.to_json())
    try:
        topology = await ensure_route_domain(ctx, pool, definition, env, recorded)
        for step in plan.steps:
            await _apply_step(ctx, store, pool, prepared, env, op_id, step, recorded, topology)
        with store.transaction() as db:
            store.operation_step(db, op_id, "setup and services")
        machines = {r.name: r for r in store.machines(env.env_id)}
        await start_workloads(ctx, pool, definition, env, machines)
        with store.transaction() as db:
            store.touch_project(db, project_id, str(prepared.path))
            store.set_environment(
                db, env.env_id, state="running", default_machine=definition.effective_default_machine() or ""
            )
            store.finish_operation(db, op_id, "succeeded")
    except BaseException as exc:
        fail_operation(store, env, op_id, exc, prepared.redactor)
        raise
    final = store.environment(env.env_id) or env
    return _up_result(final, None, plan, dry_run=False, project_id=project_id, store=store)


async def _preflight_plan(
    pool: DriverPool, definition: ProjectDefinition, plan: Plan, recorded: list[MachineRecord]
) -> None:
    """The read-only checks of a plan, before its first mutation: ProvisioningPreflight of every driver that will
    create a Machine (a failing one leaves an old Machine that a DELETE-mode recreate would replace untouched),
    ReusePreflight of every reused Machine."""
    provisioned: set[tuple[str, str]] = set()
    for step in plan.steps:
        if step.action in ("create", "recreate"):
            machine = definition.machine(step.machine)
            key = driver_key(machine.driver, machine.driver_options)
            driver, facts = await pool.get(machine.driver, machine.driver_options)
            caps = facts.info.capabilities
            if key not in provisioned and caps is not None and caps.provisioning_preflight:
                await driver.provisioning_preflight()
            provisioned.add(key)
    # Read-only checks of reused Machines, before the first mutation.
    for step in plan.steps:
        if step.action in ("keep", "start") and step.machine_id is not None:
            record = next(r for r in recorded if r.machine_id == step.machine_id)
            driver, facts = await pool.get(record.driver, record.driver_options, recorded=True)
            caps = facts.info.capabilities
            if caps is not None and caps.reuse_preflight:
                await driver.reuse_preflight(record.workspace_id, developer_identity(record.spec))


def _blocked_message(env: EnvironmentRecord, blocked: tuple[Step, ...]) -> str:
    lines = []
    for step in blocked:
        if step.action == "remove":
            lines.append(f"  machine {step.machine}: recorded in the Environment but no longer in vz.json")
        else:
            kinds = {c.kind for c in step.changes}
            what = "identity" if "identity" in kinds else "creation-time settings"
            lines.append(f"  machine {step.machine}: {what} changed: {step.reason}")
    return (
        f"vz up would have to replace or remove Machines of Environment {env.label()}; nothing was changed:\n"
        + "\n".join(lines)
        + "\nThese cannot change in place. Run `vz up --recreate` to replace them (Machine-local data is "
        "discarded; named volumes and the workspace are kept), or restore vz.json."
    )


async def _apply_step(
    ctx: Context,
    store: Store,
    pool: DriverPool,
    prepared: _Prepared,
    env: EnvironmentRecord,
    op_id: str,
    step: Step,
    recorded: list[MachineRecord],
    topology: Mapping[str, Any] | None = None,
) -> None:
    fields: dict[str, Any] = {"environment": env.name, "environment_id": env.env_id, "machine": step.machine}
    record = next((r for r in recorded if r.machine_id == step.machine_id), None)
    with store.transaction() as db:
        store.operation_step(db, op_id, f"{step.action} {step.machine}")
    if step.action == "remove":
        assert record is not None
        driver, _ = await pool.get(record.driver, record.driver_options, recorded=True)
        with ctx.progress.step("remove", f"removing machine {step.machine}", machine_id=record.machine_id, **fields):
            await delete_owned(driver, record, env)
            with store.transaction() as db:
                for kept in store.volumes(env.env_id, record.machine_id):  # data stays: listed, removable
                    store.keep_volume(db, kept.backend_name)
                store.delete_machine(db, env.env_id, record.machine_id)
        return
    machine = prepared.definition.machine(step.machine)
    if step.action == "keep":
        assert record is not None
        if topology is not None:
            driver, facts = await pool.get(machine.driver, machine.driver_options)
            if attaches(facts):
                await reattach_if_changed(ctx, driver, record, topology, env)
        if record.state != "running":
            with store.transaction() as db:
                store.set_machine_state(db, env.env_id, record.machine_id, "running")
        return
    if step.action == "start":
        assert record is not None
        driver, _ = await pool.get(machine.driver, machine.driver_options)
        with ctx.progress.step("start", f"starting machine {step.machine}", machine_id=record.machine_id, **fields):
            await driver.start(record.workspace_id)
            with store.transaction() as db:
                store.set_machine_state(db, env.env_id, record.machine_id, "running")
        return
    await _create_machine(ctx, store, pool, prepared, env, step, record, machine, fields, topology)


async def _create_machine(
    ctx: Context,
    store: Store,
    pool: DriverPool,
    prepared: _Prepared,
    env: EnvironmentRecord,
    step: Step,
    record: MachineRecord | None,
    machine: Machine,
    fields: dict[str, Any],
    topology: Mapping[str, Any] | None,
) -> None:
    """A create or recreate step: the Machine recorded as creating, RunImage, the boot awaited, recorded running."""
    project_id = prepared.definition.project_id
    driver, facts = await pool.get(machine.driver, machine.driver_options)
    machine_id = step.machine_id or new_machine_id()
    wsid = workspace_id(project_id, env.env_id, machine_id)
    fields["machine_id"] = machine_id
    request = run_request(
        project_id=project_id,
        env=env,
        machine_id=machine_id,
        machine=machine,
        facts=facts,
        native_arch=prepared.native_arch[machine.name],
        environment=prepared.environments[machine.name],
        network=network_label(topology, machine.name) if topology is not None and attaches(facts) else None,
    )
    if step.action == "create":
        with store.transaction() as db:
            if record is None:
                store.put_machine(
                    db,
                    env_id=env.env_id,
                    machine_id=machine_id,
                    name=machine.name,
                    workspace_id=wsid,
                    driver=machine.driver,
                    spec=machine.recorded(),
                    state="creating",
                )
            else:
                store.set_machine_state(db, env.env_id, machine_id, "creating")
            for volume in machine.volumes:
                _record_volume(store, db, env, machine, machine_id, volume.name)
        label = f"creating machine {machine.name} ({machine.driver}, {request.platform}, image {machine.image})"
        with ctx.progress.step("create", label, image=machine.image, **fields):
            await driver.run_image(request)
    else:  # recreate
        assert record is not None
        with ctx.progress.step("recreate", f"recreating machine {machine.name}: {step.reason}", **fields):
            same_driver = record.driver == machine.driver and record.driver_options == dict(machine.driver_options)
            if same_driver and facts.recreate_mode.name == "ON_RUN":
                from dataclasses import replace

                await driver.run_image(replace(request, allow_recreate=True))
            else:
                old_driver, _ = await pool.get(record.driver, record.driver_options, recorded=True)
                await delete_owned(old_driver, record, env)
                await driver.run_image(request)
    with ctx.progress.step("boot", f"waiting for machine {machine.name} to run", **fields):
        await _check_booted(driver, machine, env, wsid, request.platform)
    with store.transaction() as db:
        store.put_machine(
            db,
            env_id=env.env_id,
            machine_id=machine_id,
            name=machine.name,
            workspace_id=wsid,
            driver=machine.driver,
            spec=machine.recorded(),
            state="running",
        )
        for volume in machine.volumes:
            _record_volume(store, db, env, machine, machine_id, volume.name)


async def _check_booted(driver: Any, machine: Machine, env: EnvironmentRecord, wsid: str, platform: str) -> None:
    """After RunImage: the Machine runs, for the architecture asked for."""
    found = await driver.find(wsid)
    if found is None or found.state.status != "running":
        raise RuntimeFailureError(
            f"driver {machine.driver!r} returned from RunImage but machine {machine.name} is "
            f"{observed(found)}; see `vz status --environment {env.name}`"
        )
    wanted = platform.partition("/")[2]
    actual = await driver.target_architecture(wsid)
    if actual != wanted:
        raise RuntimeFailureError(
            f"driver {machine.driver!r} created machine {machine.name} for {actual}, not {wanted} as asked "
            f"(platform {platform}); set target.arch to {actual!r} in vz.json or choose a driver that "
            f"runs {wanted} Machines, then `vz up --recreate --environment {env.name}`"
        )


def _record_volume(store: Store, db: Any, env: EnvironmentRecord, machine: Machine, machine_id: str, name: str) -> None:
    store.put_volume(
        db,
        env.env_id,
        machine_id,
        name,
        volume_name(env.env_id, machine_id, name),
        project_id=env.project_id,
        driver=machine.driver,
        driver_options=dict(machine.driver_options),
    )


def _up_result(
    env: EnvironmentRecord | None,
    create_name: str | None,
    plan: Plan,
    *,
    dry_run: bool,
    project_id: str,
    store: Store | None = None,
) -> dict[str, Any]:
    machines = []
    if env is not None and store is not None:
        for record in store.machines(env.env_id):
            machines.append(
                {
                    "id": record.machine_id,
                    "name": record.name,
                    "workspace_id": record.workspace_id,
                    "driver": record.driver,
                    "state": record.state,
                    "default": record.name == env.default_machine,
                }
            )
    return {
        "project_id": project_id,
        "environment": {
            "id": env.env_id if env else None,
            "name": env.name if env else create_name,
            "state": env.state if env else "absent",
        },
        "dry_run": dry_run,
        "plan": plan.to_json(),
        "plan_lines": plan.lines(),
        "machines": machines,
    }
