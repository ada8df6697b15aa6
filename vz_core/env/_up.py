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

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vz_core._types import EgressPolicy, HostRequirements, Mount, MountType, RunImageRequest
from vz_core.env._context import (
    LABEL_ENVIRONMENT,
    LABEL_MACHINE,
    LABEL_PROJECT,
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
from vz_core.env._drivers import DriverFacts, DriverPool
from vz_core.env._errors import ConflictError, DefinitionError, PlanError
from vz_core.env._ids import new_env_id, new_machine_id, workspace_id
from vz_core.env._locks import FileLock, env_lock_path, project_lock_path
from vz_core.env._plan import Observed, Plan, RecordedMachine, Step, compute_plan
from vz_core.env._progress import Progress
from vz_core.env._store import EnvironmentRecord, MachineRecord, Store
from vz_core.errors import NotFoundError, RuntimeFailureError, UserError
from vz_core.redact import Redactor
from vz_core.rules import host_task_limit, max_pids

if TYPE_CHECKING:
    from vz_core.env._definition import Machine, ProjectDefinition

__all__ = ["up"]


# --- capability checks (before any mutation) ---------------------------------------------------------------


def _check_bind_source(progress: Progress, source: Path, worktree: Path, where: str) -> None:
    """The bind-source policy (docs/user-guide.md): '/' is refused; the home directory itself and anything
    outside the project directory are allowed with a warning, since the Machine can read (or write) them."""
    resolved = source.resolve()
    if resolved == Path("/"):
        raise UserError(
            f"{where}: the host root directory '/' cannot be bind-mounted into a Machine (it would expose the whole "
            "host); mount the directories the Machine needs instead"
        )
    home = Path.home().resolve()
    project = worktree.resolve()
    if resolved == home:
        progress.note(
            "warning",
            f"warning: {where}: bind-mounts your whole home directory {home} into the Machine (keys, tokens and "
            "shell history included); mount only what it needs",
            field=where,
        )
    elif resolved != project and project not in resolved.parents:
        progress.note(
            "warning",
            f"warning: {where}: {resolved} is outside the project directory {project}; the Machine can reach it",
            field=where,
        )


def _check_machine(
    machine: Machine,
    facts: DriverFacts,
    native_arch: str,
    worktree: Path,
    where: str,
    progress: Progress,
    version: int = 1,
) -> None:
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
        if version == 2:
            raise UserError(
                f"{where}.egress: {driver} cannot isolate the Machine's network (version 2 egress needs a driver "
                "that enforces 'deny'; docs/network.md)"
            )
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
            f"{where}.resources.disk: {driver} cannot enforce a disk size (extensions.storage_limits is false): a "
            'Machine can fill the disk that holds VZ_HOME; remove resources.disk (docs/security.md, "Resource '
            'limits")'
        )
    if res.pids is not None and not (ext and ext.pids_limits):
        raise UserError(
            f"{where}.resources.pids: {driver} does not enforce a pids limit (extensions.pids_limits is false"
            + (
                "; its Machines have their own kernel, so their processes never use the host's PIDs"
                if ext and ext.accelerator not in ("", "none")
                else ""
            )
            + "); remove resources.pids"
        )


def host_architecture() -> str:
    """This host's CPU architecture in Runtime Protocol terms ("amd64" | "arm64")."""
    import platform

    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _host_memory() -> int | None:
    from vz_core.platform.files import physical_memory

    return physical_memory()


def _check_host_resources(machine: Machine, where: str) -> None:
    """Resources this host cannot give at all are refused before anything is created or removed."""
    res = machine.resources
    cpus = os.cpu_count()
    if res.cpus is not None and cpus is not None and res.cpus > cpus:
        raise UserError(
            f"{where}.resources.cpus: {res.cpus} CPUs asked for, this host has {cpus}; lower resources.cpus "
            f"(at most {cpus}) or remove it"
        )
    memory = _host_memory()
    if res.memory is not None and memory is not None and res.memory > memory:
        raise UserError(
            f"{where}.resources.memory: {res.memory} bytes asked for, this host has {memory}; lower resources.memory "
            "or remove it"
        )
    if res.pids is not None:
        host_limit = host_task_limit()
        most = max_pids(host_limit)
        if res.pids > most:
            raise UserError(
                f"{where}.resources.pids: {res.pids} asked for, more than half of the {host_limit} tasks this host "
                f"can have (kernel.pid_max, kernel.threads-max); lower resources.pids to at most {most}, or remove it "
                "for the default"
            )


def _check_local_image(image: str, where: str) -> None:
    """A local image source (an OCI layout directory, a docker-archive file) must exist before anything changes."""
    if image.startswith("oci:"):
        rest = image[4:]
        if "@" in rest:
            rest = rest.rpartition("@")[0]
        else:
            head, _, last = rest.rpartition("/")
            if ":" in last:
                rest = f"{head}/{last.partition(':')[0]}"
        if not (Path(rest) / "index.json").is_file():
            raise UserError(f"{where}: {rest} is not an OCI image layout directory (no index.json there)")
    elif image.startswith("docker-archive:"):
        archive = image[len("docker-archive:") :].partition(":")[0]
        if not Path(archive).is_file():
            raise UserError(f"{where}: the docker-archive file {archive} does not exist")


def _check_shared_workspace(definition: ProjectDefinition, where: str) -> None:
    """Two Machines projecting one worktree read-write must declare how they share it."""
    writers = [m for m in definition.machines if m.workspace.projection == "read-write"]
    if len(writers) > 1:
        undeclared = [m.name for m in writers if m.workspace.sharing != "shared"]
        if undeclared:
            names = ", ".join(m.name for m in writers)
            raise UserError(
                f"{where}: machines {names} all project the worktree read-write, and {', '.join(undeclared)} "
                'declare(s) no consistency contract; set workspace.sharing to "shared" on each (they then write '
                "the same files concurrently, with no locking or ordering between Machines beyond what the files "
                "themselves provide), or make all but one read-only, snapshot or none"
            )


def _check_worktree_writers(
    store: Store, definition: ProjectDefinition, env: EnvironmentRecord | None, worktree: str
) -> None:
    """Another Environment's Machine already projects this worktree read-write: without the declared "shared"
    contract on this definition's read-write Machines, a second writer is refused before anything changes."""
    target_tree = env.worktree if env is not None else worktree
    writers = [m for m in definition.machines if m.workspace.projection == "read-write"]
    if not writers or all(m.workspace.sharing == "shared" for m in writers):
        return
    for other in store.environments(definition.project_id):
        if (env is not None and other.env_id == env.env_id) or other.worktree != target_tree:
            continue
        for record in store.machines(other.env_id):
            workspace = record.spec.get("workspace")
            if isinstance(workspace, dict) and workspace.get("projection", "read-write") == "read-write":
                names = ", ".join(m.name for m in writers)
                raise UserError(
                    f"$.machines: machine {record.name} of Environment {other.label()} already projects "
                    f"{target_tree} read-write, and {names} would too with no consistency contract declared; set "
                    'workspace.sharing to "shared" on them (concurrent writers, no ordering or locking between '
                    "Machines), make them read-only, snapshot or none, or delete that Environment first; nothing "
                    "was changed"
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
    network: str | None = None,
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
    if network is not None:
        labels.append(f"vz.network={network}")
    if machine.resources.pids is not None:
        labels.append(f"vz.pids={machine.resources.pids}")
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
        user=machine.user or "",
        remote_user=machine.remote_user or "",
        allow_recreate=allow_recreate,
    )


# --- route domain (docs/network.md, "linux_native attachment") ----------------------------------------------


def _attaches(facts: DriverFacts) -> bool:
    """Whether the driver joins a Machine to its route domain from the ``vz.network`` label (Extensions fact)."""
    from vz_core.network.label import FACT_KEY

    ext = facts.extensions
    return ext is not None and FACT_KEY in ext.facts


def network_label(plan: Mapping[str, Any], machine: str) -> str | None:
    """The ``vz.network`` label of one Machine: its topology plan slice (a plan holding only that Machine and its
    networks, no rules) as compact JSON; None for a Machine attached to no network."""
    from vz_core.network.label import machine_slice

    return machine_slice(plan, machine)


async def _ensure_route_domain(
    ctx: Context,
    pool: DriverPool,
    definition: ProjectDefinition,
    env: EnvironmentRecord,
    recorded: list[MachineRecord] | None = None,
) -> dict[str, Any] | None:
    """Compile a version 2 Environment's plan and realize its route domain before any Machine is created or
    started (idempotent); the plan's JSON, or None when no Machine's driver attaches to route domains.

    Today this runs in the process running `vz up` (the daemon, since the CLI goes through it); the daemon is
    meant to own the domain and its long-lived parts (DNS, relays) once it keeps the plans it serves."""
    if definition.version != 2:
        return None
    attaching = False
    for machine in definition.machines:
        _, facts = await pool.get(machine.driver, machine.driver_options)
        attaching = attaching or _attaches(facts)
    if not attaching:
        return None
    if sys.platform != "linux":  # route domains are Linux-only (vz_core.network): refused before anything exists
        raise UserError(
            f"this Environment's networks need route domains, which exist only on Linux hosts ({sys.platform} "
            "has none); run it on a Linux host, or remove its `networks` to use it here"
        )
    from vz_core.env._topology import compile_topology
    from vz_core.network import ensure_domain, ensure_egress

    plan = compile_topology(definition, env.env_id).to_json()
    fields = {"environment": env.name, "environment_id": env.env_id, "route_domain": plan["route_domain"]}
    with ctx.progress.step("network", f"preparing route domain {plan['route_domain']}", **fields):
        await ensure_domain(plan)
        await ensure_egress(plan)  # before the Machines start: their first start has their egress (idempotent)
        # The label is fixed at creation: each recorded Machine's current slice is what its driver attaches
        # with at its next start (vz_core.network.label.current_slice).
        import asyncio

        from vz_core.network.label import write_slices

        names = {m.name for m in definition.machines}
        await asyncio.to_thread(
            write_slices,
            env.env_id,
            {r.machine_id: network_label(plan, r.name) for r in recorded or [] if r.name in names},
        )
    return plan


async def _reattach_if_changed(
    ctx: Context, driver: Any, record: MachineRecord, topology: Mapping[str, Any], env: EnvironmentRecord
) -> None:
    """A running Machine whose attachments changed since its last start is restarted (its data kept) so that
    its driver attaches it with its current slice: the domain ends are replaced, nothing else changes."""
    import asyncio

    from vz_core.network.label import LABEL, needs_reattach

    desired = network_label(topology, record.name)
    found = await driver.find(record.workspace_id)
    if found is None or found.state.status != "running":
        return
    created_with = found.config.labels.get(LABEL)
    if not await asyncio.to_thread(needs_reattach, env.env_id, record.machine_id, desired, created_with):
        return
    fields = {"environment": env.name, "environment_id": env.env_id, "machine": record.name}
    label = f"re-attaching machine {record.name} to its changed networks (restart)"
    with ctx.progress.step("reattach", label, machine_id=record.machine_id, **fields):
        await driver.stop(record.workspace_id)
        await driver.start(record.workspace_id)


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
                _check_bind_source(ctx.progress, _bind_source(path.parent, mount.source or ""), path.parent, where)
    _check_shared_workspace(definition, where="$.machines")
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
            _check_local_image(machine.image, f"{where}.image")
        _check_host_resources(machine, where)
    attaching: set[str] = set()
    for index, machine in enumerate(definition.machines):
        where = f"$.machines[{index}]"
        try:
            _, facts = await pool.get(machine.driver, machine.driver_options)
        except NotFoundError as exc:
            raise UserError(f"{where}.driver: {exc.message}") from None
        key = (machine.driver, repr(sorted(machine.driver_options.items())))
        if key not in checked:
            with ctx.progress.step("preflight", f"checking driver {machine.driver}", driver=machine.driver):
                await pool.preflight(machine.driver, machine.driver_options)
            checked.add(key)
        # The target comes from the definition (target.arch, else this host's architecture): no runtime is asked
        # for TargetArchitecture before the Machine's workspace exists; the answer is checked after creation.
        native[machine.name] = host_arch
        _check_machine(machine, facts, host_arch, path.parent, where, ctx.progress, definition.version)
        if _attaches(facts):
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
    pool = DriverPool(ctx.redactor)
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
            _check_worktree_writers(store, definition, env, worktree)
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
        # ProvisioningPreflight of every driver that will create a Machine, before the first mutation (a failing
        # one leaves an old Machine that a DELETE-mode recreate would replace untouched).
        provisioned: set[tuple[str, str]] = set()
        for step in plan.steps:
            if step.action in ("create", "recreate"):
                machine = definition.machine(step.machine)
                key = (machine.driver, repr(sorted(machine.driver_options.items())))
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
        topology = await _ensure_route_domain(ctx, pool, definition, env, recorded)
        for step in plan.steps:
            await _apply_step(ctx, store, pool, prepared, env, op_id, step, recorded, topology)
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
    definition = prepared.definition
    project_id = definition.project_id
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
    machine = definition.machine(step.machine)
    if step.action == "keep":
        assert record is not None
        if topology is not None:
            driver, facts = await pool.get(machine.driver, machine.driver_options)
            if _attaches(facts):
                await _reattach_if_changed(ctx, driver, record, topology, env)
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
        network=network_label(topology, machine.name) if topology is not None and _attaches(facts) else None,
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
        found = await driver.find(wsid)
        if found is None or found.state.status != "running":
            raise RuntimeFailureError(
                f"driver {machine.driver!r} returned from RunImage but machine {machine.name} is "
                f"{observed(found)}; see `vz status --environment {env.name}`"
            )
        wanted = request.platform.partition("/")[2]
        actual = await driver.target_architecture(wsid)
        if actual != wanted:
            raise RuntimeFailureError(
                f"driver {machine.driver!r} created machine {machine.name} for {actual}, not {wanted} as asked "
                f"(platform {request.platform}); set target.arch to {actual!r} in vz.json or choose a driver that "
                f"runs {wanted} Machines, then `vz up --recreate --environment {env.name}`"
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
            _record_volume(store, db, env, machine, machine_id, volume.name)


def _record_volume(store: Store, db: Any, env: EnvironmentRecord, machine: Machine, machine_id: str, name: str) -> None:
    store.put_volume(
        db,
        env.env_id,
        machine_id,
        name,
        _volume_name(env.env_id, machine_id, name),
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
