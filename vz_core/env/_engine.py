"""Environment operations: up, status, stop, delete, and preparing an exec.

Life of `vz up` here: vz.json → ProjectDefinition → secrets resolved → every driver acquired, negotiated
(Info, Extensions), preflighted and checked against what each Machine asks for (target, profile, egress,
workspace projection, mounts, volumes, resources) → Environment selected (or created) under the project lock
→ the Environment lock → interrupted operations explained → Find on every recorded Machine → plan → blocked
changes refused → ReusePreflight for reused Machines → operation record → steps (RunImage / Start / Delete)
→ records persisted after each step → operation finished. Everything that can be refused is refused before
the first mutation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vz_core._types import EgressPolicy, HostRequirements, MachineDetails, Mount, MountType, RunImageRequest
from vz_core.env._discover import DefinitionHeader, find_definition, read_header
from vz_core.env._drivers import DriverFacts, DriverPool
from vz_core.env._errors import ConflictError, DefinitionError, DefinitionNotFoundError, PlanError
from vz_core.env._ids import looks_like_env_id, new_env_id, new_machine_id, workspace_id
from vz_core.env._locks import FileLock, env_lock_path, project_lock_path
from vz_core.env._plan import Observed, Plan, RecordedMachine, Step, compute_plan, diff_specs
from vz_core.env._progress import Progress
from vz_core.env._select import (
    ENV_VAR_ENVIRONMENT,
    ENV_VAR_MACHINE,
    EnvironmentChoice,
    select_environment,
    select_machine,
)
from vz_core.env._store import EnvironmentRecord, MachineRecord, OperationRecord, Store
from vz_core.errors import (
    DriverError,
    FailedPreconditionError,
    NotFoundError,
    OperationCancelledError,
    RuntimeFailureError,
    UserError,
    VzError,
)
from vz_core.redact import Redactor

if TYPE_CHECKING:
    from vz_core.env._definition import Machine, ProjectDefinition

__all__ = ["Context", "ExecTarget", "delete", "prepare_exec", "status", "stop", "up"]

STATUS_SCHEMA = "vz.status/1"
# Ownership labels. Not under "vz.": that prefix carries settings a driver must understand (vz.profile, ...).
LABEL_PROJECT = "dev.vz.project"
LABEL_ENVIRONMENT = "dev.vz.environment"
LABEL_MACHINE = "dev.vz.machine"
DEVELOPER_IDENTITY = "root"
"""The resolved developer identity of vz Machines (remote_user and user are not set)."""


@dataclass
class Context:
    """Where a command runs: working directory, the caller's environment variables, output, state."""

    cwd: Path
    environ: Mapping[str, str]
    progress: Progress = field(default_factory=Progress)
    definition_file: Path | None = None
    store_path: Path | None = None
    redactor: Redactor = field(default_factory=Redactor)
    """Collects every secret resolved by the command; callers clean any message they show with it."""


# --- shared helpers ---------------------------------------------------------------------------------------


def _holder(kind: str) -> str:
    return f"vz {kind} (pid {os.getpid()})"


def _open_store(ctx: Context) -> Store:
    return Store(ctx.store_path)


def _observed(details: MachineDetails | None) -> Observed:
    if details is None:
        return "missing"
    return "running" if details.state.status == "running" else "stopped"


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


def _stale_operations(store: Store, env_id: str, lock: FileLock | None) -> list[OperationRecord]:
    """Operations still marked running whose process is gone (the Environment lock is free or held by us)."""
    running = store.operations(env_id, status="running")
    if not running:
        return []
    if lock is not None and lock.held:
        return running
    return running if FileLock(env_lock_path(env_id)).is_free() else []


def _explain_interrupted(op: OperationRecord) -> str:
    where = f" during {op.step!r}" if op.step else ""
    return (
        f"a previous `vz {op.kind}` ({op.op_id}, pid {op.pid}, started {op.started_at}) was interrupted{where}; "
        f"this command converges from what the drivers report"
    )


def _converge_stale(
    ctx: Context, store: Store, env: EnvironmentRecord, lock: FileLock, current_op: str | None = None
) -> None:
    for op in _stale_operations(store, env.env_id, lock):
        if op.op_id == current_op:
            continue
        ctx.progress.note(
            "interrupted-operation",
            _explain_interrupted(op),
            environment=env.name,
            environment_id=env.env_id,
            operation_id=op.op_id,
        )
        with store.transaction() as db:
            store.finish_operation(db, op.op_id, "interrupted", f"process {op.pid} ended during {op.step!r}")


async def _lock_environment(ctx: Context, store: Store, env: EnvironmentRecord, kind: str) -> FileLock:
    lock = FileLock(env_lock_path(env.env_id))

    def waiting(holder: str) -> None:
        ctx.progress.note(
            "waiting",
            f"waiting for another operation on Environment {env.label()} to finish ({holder or 'unknown holder'})",
            environment=env.name,
            environment_id=env.env_id,
            holder=holder,
        )

    await lock.acquire(_holder(kind), on_wait=waiting)
    if store.environment(env.env_id) is None:
        lock.release()
        raise ConflictError(
            f"Environment {env.label()} was deleted by another command while this one waited; nothing was changed"
        )
    return lock


@dataclass(frozen=True)
class _Project:
    header: DefinitionHeader | None
    project_id: str


def _resolve_project(ctx: Context, explicit_env: str | None, *, required: bool = True) -> _Project | None:
    """The project to act on: from vz.json, or, without one, from an Environment id given explicitly."""
    try:
        path = find_definition(ctx.cwd, ctx.definition_file)
    except DefinitionNotFoundError:
        env_id = explicit_env if explicit_env and looks_like_env_id(explicit_env) else None
        env_id = env_id or ctx.environ.get(ENV_VAR_ENVIRONMENT) or None
        if env_id and ctx.definition_file is None:
            with _open_store(ctx) as store:
                record = store.environment(env_id)
            if record is not None:
                return _Project(None, record.project_id)
        if not required:
            return None
        raise
    header = read_header(path)
    return _Project(header, header.project_id)


def _select_existing(ctx: Context, store: Store, project: _Project, explicit: str | None) -> EnvironmentRecord:
    choice = _choose(ctx, store, project, explicit, for_up=False)
    assert choice.environment is not None
    return choice.environment


def _choose(ctx: Context, store: Store, project: _Project, explicit: str | None, *, for_up: bool) -> EnvironmentChoice:
    worktree = str(project.header.worktree) if project.header else None
    return select_environment(
        project_id=project.project_id,
        environments=store.environments(project.project_id),
        explicit=explicit,
        env_var=ctx.environ.get(ENV_VAR_ENVIRONMENT) or None,
        bound_env_id=store.binding(project.project_id, worktree) if worktree else None,
        bound_env_ids=store.bound_env_ids(project.project_id),
        for_up=for_up,
        all_environments=store.environments(),
    )


# --- capability checks (before any mutation) ---------------------------------------------------------------


def _check_machine(machine: Machine, facts: DriverFacts, native_arch: str, worktree: Path, where: str) -> None:
    """Refuse what the driver did not advertise, naming the field and what to do."""
    driver = f"driver {facts.name!r}"
    caps = facts.info.capabilities
    mount_types = set(caps.mount_types) if caps else set()
    ext = facts.extensions
    if machine.target.os not in facts.target_os:
        raise UserError(
            f"{where}.target.os: {driver} cannot run {machine.target.os} Machines on this host (it runs: "
            f"{', '.join(facts.target_os) or 'nothing'}); choose another driver (`vz driver list`)"
        )
    from vz_core.capability_matrix import current_host_os, lookup

    entry = lookup(facts.name, current_host_os(), machine.target.os)
    if entry is not None and entry.status == "PLANNED":
        raise UserError(
            f"{where}: {driver} running {machine.target.os} Machines on a {entry.host_os} host is planned, not "
            "implemented yet (see docs/capability-matrix.md)"
        )
    if machine.target.arch is not None and machine.target.arch != native_arch:
        raise UserError(
            f"{where}.target.arch: {driver} runs {native_arch} Machines on this host, not {machine.target.arch}; "
            f"remove target.arch or set it to {native_arch!r} (vz never substitutes another target)"
        )
    if machine.profile != "developer" and machine.profile not in facts.profiles:
        raise UserError(
            f"{where}.profile: {driver} does not offer the {machine.profile!r} profile (it offers: "
            f"{', '.join(facts.profiles) or 'none'}); choose a driver that does, or use profile 'developer'"
        )
    if machine.egress == "deny" and (ext is None or EgressPolicy.DENY not in ext.egress_policies):
        raise UserError(
            f"{where}.egress: {driver} cannot deny outbound traffic (it advertises no 'deny' egress policy); "
            "use egress 'allow' or a driver that enforces 'deny'"
        )
    projection = machine.workspace.projection
    if projection in ("read-write", "read-only") and MountType.BIND not in mount_types:
        raise UserError(
            f"{where}.workspace.projection: {driver} cannot project the workspace {projection} (it supports no "
            f"bind mounts); set workspace.projection to 'none'" + (" or 'snapshot'" if ext and ext.snapshots else "")
        )
    if projection == "snapshot" and not (ext and ext.snapshots):
        raise UserError(
            f"{where}.workspace.projection: {driver} does not support 'snapshot' workspaces; use 'read-write', "
            "'read-only' or 'none'"
        )
    for index, mount in enumerate(machine.mounts):
        wanted = MountType.BIND if mount.type == "bind" else MountType.TMPFS
        if wanted not in mount_types:
            raise UserError(f"{where}.mounts[{index}]: {driver} does not support {mount.type} mounts; remove it")
        if mount.type == "bind":
            source = _bind_source(worktree, mount.source or "")
            if not source.exists():
                raise UserError(f"{where}.mounts[{index}].source: {source} does not exist on this host")
    if machine.volumes and MountType.VOLUME not in mount_types:
        raise UserError(f"{where}.volumes: {driver} does not support named volumes; remove them")
    res = machine.resources
    if (res.cpus is not None or res.memory is not None) and not (ext and ext.resource_limits):
        raise UserError(
            f"{where}.resources: {driver} cannot enforce CPU or memory limits (extensions.resource_limits is "
            "false); remove resources.cpus / resources.memory"
        )
    if res.disk is not None and not (ext and ext.storage_limits):
        raise UserError(
            f"{where}.resources.disk: {driver} cannot enforce a disk size (extensions.storage_limits is false); "
            "remove it"
        )


def _bind_source(worktree: Path, source: str) -> Path:
    path = Path(os.path.expanduser(source))
    return path if path.is_absolute() else (worktree / path).resolve()


def _volume_name(env_id: str, machine_id: str, volume: str) -> str:
    return f"vz-{env_id}-{machine_id}-{volume}"


def _run_request(
    *,
    project_id: str,
    env: EnvironmentRecord,
    machine_id: str,
    machine: Machine,
    facts: DriverFacts,
    native_arch: str,
    environment: Mapping[str, str],
    allow_recreate: bool = False,
) -> RunImageRequest:
    labels = [
        f"{LABEL_PROJECT}={project_id}",
        f"{LABEL_ENVIRONMENT}={env.env_id}",
        f"{LABEL_MACHINE}={machine_id}",
    ]
    if machine.profile in facts.profiles:
        labels.append(f"vz.profile={machine.profile}")
    ext = facts.extensions
    if ext is not None and EgressPolicy[machine.egress.upper()] in ext.egress_policies:
        labels.append(f"vz.egress={machine.egress}")
    worktree = Path(env.worktree)
    workspace_mount = None
    projection = machine.workspace.projection
    if projection != "none":
        workspace_mount = Mount(
            MountType.BIND, str(worktree), machine.workspace.target, read_only=projection == "read-only"
        )
        if projection == "snapshot":
            labels.append("vz.workspace=snapshot")
    mounts: list[Mount] = []
    for mount in machine.mounts:
        if mount.type == "bind":
            mounts.append(
                Mount(MountType.BIND, str(_bind_source(worktree, mount.source or "")), mount.target, mount.read_only)
            )
        else:
            mounts.append(Mount(MountType.TMPFS, "", mount.target, mount.read_only))
    for volume in machine.volumes:
        name = _volume_name(env.env_id, machine_id, volume.name)
        mounts.append(Mount(MountType.VOLUME, name, volume.target, volume.read_only))
    res = machine.resources
    requirements = (
        HostRequirements(cpus=res.cpus or 0, memory_bytes=res.memory or 0, storage_bytes=res.disk or 0)
        if res.requested()
        else None
    )
    env_vars = dict(environment)
    env_vars.update({"VZ_PROJECT_ID": project_id, "VZ_ENVIRONMENT_ID": env.env_id, "VZ_MACHINE_ID": machine_id})
    return RunImageRequest(
        workspace_id=workspace_id(project_id, env.env_id, machine_id),
        image=machine.image,
        environment=env_vars,
        labels=tuple(labels),
        workspace_mount=workspace_mount,
        mounts=tuple(mounts),
        platform=f"{machine.target.os}/{machine.target.arch or native_arch}",
        host_requirements=requirements,
        allow_recreate=allow_recreate,
    )


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
    probe = f"vz-{definition.project_id}-probe"
    checked: dict[tuple[str, str], str] = {}
    for index, machine in enumerate(definition.machines):
        where = f"$.machines[{index}]"
        try:
            driver, facts = await pool.get(machine.driver, machine.driver_options)
        except NotFoundError as exc:
            raise UserError(f"{where}.driver: {exc.message}") from None
        key = (machine.driver, repr(sorted(machine.driver_options.items())))
        if key not in checked:
            with ctx.progress.step("preflight", f"checking driver {machine.driver}", driver=machine.driver):
                await pool.preflight(machine.driver, machine.driver_options)
                checked[key] = await driver.target_architecture(probe)
        native[machine.name] = checked[key]
        _check_machine(machine, facts, native[machine.name], path.parent, where)
    return _Prepared(definition, path, environments, native, redactor)


async def up(
    ctx: Context, *, environment: str | None = None, recreate: bool = False, dry_run: bool = False
) -> dict[str, Any]:
    """Create or reconcile the selected Environment; the result object of `vz up --json` (docs/cli.md)."""
    pool = DriverPool()
    store: Store | None = None
    env_lock: FileLock | None = None
    try:
        prepared = await _prepare(ctx, pool)
        definition = prepared.definition
        project = _Project(DefinitionHeader(prepared.path, definition.project_id), definition.project_id)
        worktree = str(prepared.path.parent)
        store = _open_store(ctx)
        op_id: str | None = None
        project_lock = FileLock(project_lock_path(definition.project_id))
        await project_lock.acquire(_holder("up"))
        try:
            choice = _choose(ctx, store, project, environment, for_up=True)
            env = choice.environment
            if env is None and not dry_run:
                assert choice.create_name is not None
                env_id = new_env_id()
                env_lock = FileLock(env_lock_path(env_id))
                if not env_lock.try_acquire(_holder("up")):
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
                    if store.binding(definition.project_id, worktree) is None:
                        store.bind(db, definition.project_id, worktree, env_id)
                    op_id = store.begin_operation(db, env_id=env_id, project_id=definition.project_id, kind="up")
                ctx.progress.note(
                    "environment-created",
                    f"created Environment {env.label()}",
                    environment=env.name,
                    environment_id=env.env_id,
                )
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
            return _up_result(None, choice.create_name, plan, dry_run=True, project_id=definition.project_id)
        if env_lock is None:
            env_lock = await _lock_environment(ctx, store, env, "up")
            env = store.environment(env.env_id) or env
        _converge_stale(ctx, store, env, env_lock, op_id)
        return await _reconcile(ctx, store, pool, prepared, env, op_id, recreate=recreate, dry_run=dry_run)
    finally:
        if env_lock is not None:
            env_lock.release()
        if store is not None:
            store.close()
        await pool.aclose()


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
        observed: dict[str, Observed] = {}
        for record in recorded:
            driver, _ = await pool.get(record.driver, record.driver_options)
            observed[record.machine_id] = _observed(await driver.find(record.workspace_id))
        plan = compute_plan(
            [(m.name, m.recorded()) for m in definition.machines],
            [RecordedMachine(r.name, r.machine_id, r.spec, r.state) for r in recorded],
            observed,
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
        # Read-only checks of reused Machines, before the first mutation.
        for step in plan.steps:
            if step.action in ("keep", "start") and step.machine_id is not None:
                record = next(r for r in recorded if r.machine_id == step.machine_id)
                driver, facts = await pool.get(record.driver, record.driver_options)
                caps = facts.info.capabilities
                if caps is not None and caps.reuse_preflight:
                    await driver.reuse_preflight(record.workspace_id, DEVELOPER_IDENTITY)
    except BaseException as exc:
        if op_id is not None:  # only a brand-new Environment has an operation open this early
            _fail_operation(store, env, op_id, exc, prepared.redactor)
        raise
    with store.transaction() as db:
        if op_id is None:
            op_id = store.begin_operation(db, env_id=env.env_id, project_id=project_id, kind="up", plan=plan.to_json())
        else:
            store.set_operation_plan(db, op_id, plan.to_json())
    try:
        for step in plan.steps:
            await _apply_step(ctx, store, pool, prepared, env, op_id, step, recorded)
        with store.transaction() as db:
            store.touch_project(db, project_id, str(prepared.path))
            store.set_environment(
                db, env.env_id, state="running", default_machine=definition.effective_default_machine() or ""
            )
            store.finish_operation(db, op_id, "succeeded")
    except BaseException as exc:
        _fail_operation(store, env, op_id, exc, prepared.redactor)
        raise
    final = store.environment(env.env_id) or env
    return _up_result(final, None, plan, dry_run=False, project_id=project_id, store=store)


def _fail_operation(store: Store, env: EnvironmentRecord, op_id: str, exc: BaseException, redactor: Redactor) -> None:
    cancelled = not isinstance(exc, Exception) or isinstance(exc, OperationCancelledError)
    status = "interrupted" if cancelled else "failed"
    message = redactor.redact(str(exc) or type(exc).__name__)
    try:
        with store.transaction() as db:
            store.finish_operation(db, op_id, status, message)
            if status == "failed":
                store.set_environment(db, env.env_id, state="failed")
    except Exception:  # the original error is what the user must see
        pass


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
) -> None:
    definition = prepared.definition
    project_id = definition.project_id
    fields: dict[str, Any] = {"environment": env.name, "environment_id": env.env_id, "machine": step.machine}
    record = next((r for r in recorded if r.machine_id == step.machine_id), None)
    with store.transaction() as db:
        store.operation_step(db, op_id, f"{step.action} {step.machine}")
    if step.action == "remove":
        assert record is not None
        driver, _ = await pool.get(record.driver, record.driver_options)
        with ctx.progress.step("remove", f"removing machine {step.machine}", machine_id=record.machine_id, **fields):
            await _delete_owned(driver, record, env)
            with store.transaction() as db:
                store.delete_machine(db, env.env_id, record.machine_id)
        return
    machine = definition.machine(step.machine)
    if step.action == "keep":
        assert record is not None
        if record.state != "running":
            with store.transaction() as db:
                store.set_machine_state(db, env.env_id, record.machine_id, "running")
        return
    driver, facts = await pool.get(machine.driver, machine.driver_options)
    if step.action == "start":
        assert record is not None
        with ctx.progress.step("start", f"starting machine {step.machine}", machine_id=record.machine_id, **fields):
            await driver.start(record.workspace_id)
            with store.transaction() as db:
                store.set_machine_state(db, env.env_id, record.machine_id, "running")
        return
    machine_id = step.machine_id or new_machine_id()
    wsid = workspace_id(project_id, env.env_id, machine_id)
    fields["machine_id"] = machine_id
    request = _run_request(
        project_id=project_id,
        env=env,
        machine_id=machine_id,
        machine=machine,
        facts=facts,
        native_arch=prepared.native_arch[machine.name],
        environment=prepared.environments[machine.name],
    )
    caps = facts.info.capabilities
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
                store.put_volume(
                    db, env.env_id, machine_id, volume.name, _volume_name(env.env_id, machine_id, volume.name)
                )
        if caps is not None and caps.provisioning_preflight:
            await driver.provisioning_preflight()
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
                old_driver, _ = await pool.get(record.driver, record.driver_options)
                await _delete_owned(old_driver, record, env)
                await driver.run_image(request)
    with ctx.progress.step("boot", f"waiting for machine {machine.name} to run", **fields):
        found = await driver.find(wsid)
        if found is None or found.state.status != "running":
            raise RuntimeFailureError(
                f"driver {machine.driver!r} returned from RunImage but machine {machine.name} is "
                f"{_observed(found)}; see `vz status --environment {env.name}`"
            )
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
            store.put_volume(db, env.env_id, machine_id, volume.name, _volume_name(env.env_id, machine_id, volume.name))


async def _delete_owned(driver: Any, record: MachineRecord, env: EnvironmentRecord) -> None:
    """Delete a Machine only if what the driver holds under its workspace id is ours (ownership labels)."""
    found = await driver.find(record.workspace_id)
    if found is not None:
        owner = found.config.labels.get(LABEL_ENVIRONMENT)
        if owner is not None and owner != env.env_id:
            raise FailedPreconditionError(
                f"refusing to delete workspace {record.workspace_id!r}: it is labelled for Environment {owner}, "
                f"not {env.env_id}"
            )
    await driver.delete(record.workspace_id)


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


# --- stop / delete ----------------------------------------------------------------------------------------


async def stop(ctx: Context, *, environment: str | None = None) -> dict[str, Any]:
    """Stop every Machine of the selected Environment (idempotent); Machine-local data survives."""
    return await _mutate(ctx, environment, "stop")


async def delete(ctx: Context, *, environment: str | None = None) -> dict[str, Any]:
    """Delete the selected Environment: its Machines (through their drivers), then its records.

    Only the selected Environment's graph is traversed: Machines recorded under its env_id, each checked
    against the ownership label the driver reports before it is deleted.
    """
    return await _mutate(ctx, environment, "delete")


async def _mutate(ctx: Context, environment: str | None, kind: str) -> dict[str, Any]:
    project = _resolve_project(ctx, environment)
    assert project is not None
    pool = DriverPool()
    store = _open_store(ctx)
    lock: FileLock | None = None
    try:
        env = _select_existing(ctx, store, project, environment)
        lock = await _lock_environment(ctx, store, env, kind)
        env = store.environment(env.env_id) or env
        _converge_stale(ctx, store, env, lock)
        machines = store.machines(env.env_id)
        with store.transaction() as db:
            op_id = store.begin_operation(db, env_id=env.env_id, project_id=env.project_id, kind=kind)
            if kind == "delete":
                store.set_environment(db, env.env_id, state="deleting")
        results: list[dict[str, Any]] = []
        try:
            for record in machines:
                fields = {
                    "environment": env.name,
                    "environment_id": env.env_id,
                    "machine": record.name,
                    "machine_id": record.machine_id,
                }
                with store.transaction() as db:
                    store.operation_step(db, op_id, f"{kind} {record.name}")
                driver, _ = await pool.get(record.driver, record.driver_options)
                verb = "stopping" if kind == "stop" else "deleting"
                with ctx.progress.step(kind, f"{verb} machine {record.name}", **fields):
                    if kind == "stop":
                        try:
                            await driver.stop(record.workspace_id)
                            state = "stopped"
                        except NotFoundError:
                            state = "missing"
                            ctx.progress.note(
                                "missing", f"machine {record.name} no longer exists in its driver", **fields
                            )
                        with store.transaction() as db:
                            store.set_machine_state(db, env.env_id, record.machine_id, state)
                    else:
                        await _delete_owned(driver, record, env)
                        state = "deleted"
                        with store.transaction() as db:
                            store.delete_machine(db, env.env_id, record.machine_id)
                results.append({"id": record.machine_id, "name": record.name, "state": state})
            with store.transaction() as db:
                if kind == "delete":
                    store.delete_environment(db, env.env_id)
                else:
                    store.set_environment(db, env.env_id, state="stopped")
                store.finish_operation(db, op_id, "succeeded")
        except BaseException as exc:
            _fail_operation(store, env, op_id, exc, ctx.redactor)
            raise
        if kind == "delete":
            try:
                env_lock_path(env.env_id).unlink()
            except OSError:
                pass
        return {
            "project_id": env.project_id,
            "environment": {"id": env.env_id, "name": env.name, "state": "deleted" if kind == "delete" else "stopped"},
            "machines": results,
            "operation_id": op_id,
        }
    finally:
        if lock is not None:
            lock.release()
        store.close()
        await pool.aclose()


# --- status -------------------------------------------------------------------------------------------------


async def status(
    ctx: Context, *, environment: str | None = None, all_environments: bool = False, machine: str | None = None
) -> dict[str, Any]:
    """The `vz status --json` object: topology, ids, targets, drivers, observed state, drift (docs/cli.md)."""
    project = _resolve_project(ctx, environment, required=not all_environments)
    definition: ProjectDefinition | None = None
    definition_error = ""
    if project is not None and project.header is not None:
        from vz_core.env._definition import load_definition

        try:
            definition = load_definition(project.header.path)
        except DefinitionError as exc:
            definition_error = str(exc)
    pool = DriverPool()
    store = _open_store(ctx)
    try:
        if all_environments:
            envs = store.environments(project.project_id if project else None)
        else:
            assert project is not None
            envs = [_select_existing(ctx, store, project, environment)]
        out_envs = []
        for env in envs:
            defn = definition if definition is not None and definition.project_id == env.project_id else None
            out_envs.append(await _env_status(ctx, store, pool, env, defn, definition_error, machine))
        return {
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
    if only_machine is not None:
        records = [select_machine(environment=env, machines=records, explicit=only_machine, env_var=None)]
    ops = store.operations(env.env_id)
    stale = _stale_operations(store, env.env_id, None)
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
        "worktree": env.worktree,
        "bound_worktrees": store.bindings_of(env.env_id),
        "default_machine": env.default_machine,
        "created_at": env.created_at,
        "updated_at": env.updated_at,
        "last_operation": _op_json(ops[-1] if ops else None),
        "interrupted_operations": [
            {**(_op_json(op) or {}), "explanation": _explain_interrupted(op).split(";")[0]} for op in stale
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
    try:
        driver, facts = await pool.get(record.driver, record.driver_options)
        driver_json = facts.describe()
        found = await driver.find(record.workspace_id)
        state = _observed(found)
        find_json = _find_json(found)
        if not target.get("arch"):
            target["arch"] = await driver.target_architecture(record.workspace_id)
    except VzError as exc:
        driver_json = {"name": record.driver, "error": str(exc)}
        error = str(exc)
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
        "find": find_json,
        "error": error or None,
        "drift": drift,
    }


def _matrix_json(driver: str, target_os: str) -> dict[str, str] | None:
    """This host/target pair's row of the capability matrix (None when the matrix does not list it)."""
    from vz_core.capability_matrix import current_host_os, lookup

    entry = lookup(driver, current_host_os(), target_os)
    return None if entry is None else {"status": entry.status, "host_os": entry.host_os, "note": entry.note}


# --- exec ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecTarget:
    """Everything `vz exec` needs to run a command: which Machine, through which driver, where."""

    environment: EnvironmentRecord
    machine: MachineRecord
    workdir: str


def prepare_exec(ctx: Context, *, environment: str | None = None, machine: str | None = None) -> ExecTarget:
    """Select the Environment and Machine for an exec, fast (no pydantic, no lock, no driver)."""
    project = _resolve_project(ctx, environment)
    assert project is not None
    with _open_store(ctx) as store:
        env = _select_existing(ctx, store, project, environment)
        record = select_machine(
            environment=env,
            machines=store.machines(env.env_id),
            explicit=machine,
            env_var=ctx.environ.get(ENV_VAR_MACHINE) or None,
        )
        if record.state in ("creating", "failed"):
            stale = _stale_operations(store, env.env_id, None)
            if stale:
                raise FailedPreconditionError(
                    f"machine {record.name} of Environment {env.label()} is not ready: "
                    f"{_explain_interrupted(stale[-1]).split(';')[0]}; run `vz up --environment {env.name}`"
                )
    workspace = record.spec.get("workspace") or {}
    workdir = ""
    if isinstance(workspace, dict) and workspace.get("projection", "none") != "none":
        workdir = str(workspace.get("target") or "")
    return ExecTarget(env, record, workdir)


def describe_driver_error(exc: DriverError, target: ExecTarget) -> str:
    """A user-facing line for an exec that the driver refused."""
    env = target.environment
    if isinstance(exc, NotFoundError):
        return (
            f"machine {target.machine.name} of Environment {env.label()} does not exist in driver "
            f"{target.machine.driver!r}; run `vz up --environment {env.name}` to recreate it"
        )
    if isinstance(exc, FailedPreconditionError):
        return (
            f"machine {target.machine.name} of Environment {env.label()} is not running; "
            f"run `vz up --environment {env.name}` to start it ({exc.message})"
        )
    return exc.message
