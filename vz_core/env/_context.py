"""What every Environment operation shares: the command's Context, finding the project and the Environment,
the state store, locks, interrupted operations, the secrets to mask, and deleting a Machine we own.

Nothing here imports pydantic: `vz exec` goes through this module on its hot path.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vz_core._types import MachineDetails
from vz_core.env._discover import DefinitionHeader, find_definition, load_json, read_header
from vz_core.env._errors import ConflictError, DefinitionError, DefinitionNotFoundError
from vz_core.env._ids import looks_like_env_id
from vz_core.env._locks import FileLock, env_lock_path
from vz_core.env._plan import Observed
from vz_core.env._progress import Progress
from vz_core.env._select import ENV_VAR_ENVIRONMENT, EnvironmentChoice, select_environment
from vz_core.env._store import EnvironmentRecord, MachineRecord, OperationRecord, Store
from vz_core.errors import FailedPreconditionError, OperationCancelledError
from vz_core.redact import Redactor

if TYPE_CHECKING:
    from vz_core.drivers import DriverSource

__all__ = [
    "DEVELOPER_IDENTITY",
    "LABEL_ENVIRONMENT",
    "LABEL_MACHINE",
    "LABEL_PROJECT",
    "Context",
    "Project",
    "choose",
    "converge_stale",
    "delete_owned",
    "developer_identity",
    "explain_interrupted",
    "fail_operation",
    "holder",
    "learn_definition_secrets",
    "learn_project_secrets",
    "learn_recorded_secrets",
    "lock_environment",
    "observed",
    "open_store",
    "resolve_project",
    "select_existing",
    "stale_operations",
]

# Ownership labels. Not under "vz.": that prefix carries settings a driver must understand (vz.profile, ...).
LABEL_PROJECT = "dev.vz.project"
LABEL_ENVIRONMENT = "dev.vz.environment"
LABEL_MACHINE = "dev.vz.machine"
DEVELOPER_IDENTITY = "root"
"""The developer identity of a Machine whose vz.json sets neither remote_user nor user."""


def developer_identity(spec: Mapping[str, Any]) -> str:
    """A recorded Machine's developer identity: remote_user, else user, else root (PROTOCOL.md §2)."""
    for key in ("remote_user", "user"):
        value = spec.get(key)
        if isinstance(value, str) and value:
            return value
    return DEVELOPER_IDENTITY


def _secret_redactor() -> Redactor:
    # Every value this Redactor learns is a declared secret, so short ones are masked too (as whole tokens).
    return Redactor(short_tokens=True)


@dataclass
class Context:
    """Where a command runs: working directory, the caller's environment variables, output, state."""

    cwd: Path
    environ: Mapping[str, str]
    progress: Progress = field(default_factory=Progress)
    definition_file: Path | None = None
    store_path: Path | None = None
    client_pid: int | None = None
    """The process that asked for this operation when it is not this one (the vz daemon's client)."""
    redactor: Redactor = field(default_factory=_secret_redactor)
    """Every secret value of the Environments the command touches that can be resolved now (the definition's
    and the recorded Machines' secret references, read from ``environ``). Results and stored errors are cleaned
    with it; callers clean anything else they show with it."""
    drivers: DriverSource | None = None
    """Where the command's drivers come from: the vz daemon's session pool (shared, supervised plugin sessions);
    None: ``vz_core.drivers.open_driver`` builds each one (built-ins in-process: tests and benchmarks)."""


# --- secrets --------------------------------------------------------------------------------------------------


def _secret_vars(environment: object) -> Iterable[str]:
    if isinstance(environment, dict):
        for value in environment.values():
            if isinstance(value, dict) and isinstance(value.get("from_env"), str):
                yield value["from_env"]


def _learn(ctx: Context, variables: Iterable[str]) -> None:
    for name in variables:
        value = ctx.environ.get(name)
        if value:
            ctx.redactor.add(value)


def learn_recorded_secrets(ctx: Context, records: Iterable[MachineRecord]) -> None:
    """Register the secret values referenced by recorded Machines (their specs keep references, never values)."""
    for record in records:
        _learn(ctx, _secret_vars(record.spec.get("environment")))


def learn_definition_secrets(ctx: Context, path: Path | None) -> None:
    """Register the secret values a vz.json declares, read without validation (a broken file teaches nothing)."""
    if path is None:
        return
    try:
        data = load_json(path)
    except DefinitionError:
        return
    machines = data.get("machines") if isinstance(data, dict) else None
    for machine in machines if isinstance(machines, list) else ():
        if isinstance(machine, dict):
            _learn(ctx, _secret_vars(machine.get("environment")))


def learn_project_secrets(ctx: Context, explicit_env: str | None = None, *, recorded: bool = True) -> None:
    """Register every secret value of the project the command acts on, before anything else is done with what
    the caller supplied (selectors, argv, workdir: any of them may hold a secret and is masked with these).

    The project is the one of the nearest vz.json (or ``--file``), else the one of an Environment id given
    explicitly or in ``VZ_ENVIRONMENT_ID``. Its secrets are the references vz.json declares and those of the
    recorded Machines of each of its Environments, read from ``ctx.environ`` (values are never stored). Nothing
    here fails: a missing or broken vz.json or an unreadable store teaches what it can, and the command then
    reports that problem itself. ``recorded=False`` reads vz.json only (the CLI, which opens no state store).
    """
    project_id: str | None = None
    try:
        path: Path | None = find_definition(ctx.cwd, ctx.definition_file)
    except (DefinitionNotFoundError, DefinitionError, OSError):
        path = None
    if path is not None:
        learn_definition_secrets(ctx, path)
        try:
            data = load_json(path)
        except DefinitionError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("project_id"), str):
            project_id = data["project_id"]
    if not recorded:
        return
    try:
        with open_store(ctx) as store:
            if project_id is None:
                for candidate in (explicit_env, ctx.environ.get(ENV_VAR_ENVIRONMENT)):
                    if candidate and looks_like_env_id(candidate):
                        record = store.environment(candidate)
                        if record is not None:
                            project_id = record.project_id
                            break
            if project_id is None:
                return
            for env in store.environments(project_id):
                learn_recorded_secrets(ctx, store.machines(env.env_id))
    except Exception:  # the store's own problem is reported by the command that needs it
        return


# --- store, locks, interrupted operations ------------------------------------------------------------------------


def holder(kind: str, ctx: Context | None = None) -> str:
    """Who holds a lock, as a waiter is told: the command, and the client's pid when the vz daemon runs it."""
    client = ctx.client_pid if ctx is not None else None
    if client is not None and client != os.getpid():
        return f"vz {kind} (pid {client}, run by the vz daemon, pid {os.getpid()})"
    return f"vz {kind} (pid {os.getpid()})"


def open_store(ctx: Context) -> Store:
    return Store(ctx.store_path)


def observed(details: MachineDetails | None) -> Observed:
    if details is None:
        return "missing"
    return "running" if details.state.status == "running" else "stopped"


def stale_operations(store: Store, env_id: str, lock: FileLock | None) -> list[OperationRecord]:
    """Operations still marked running whose process is gone (the Environment lock is free or held by us)."""
    running = store.operations(env_id, status="running")
    if not running:
        return []
    if lock is not None and lock.held:
        return running
    return running if FileLock(env_lock_path(env_id)).is_free() else []


def explain_interrupted(op: OperationRecord) -> str:
    where = f" during {op.step!r}" if op.step else ""
    return (
        f"a previous `vz {op.kind}` ({op.op_id}, pid {op.pid}, started {op.started_at}) was interrupted{where}; "
        f"this command converges from what the drivers report"
    )


def converge_stale(
    ctx: Context, store: Store, env: EnvironmentRecord, lock: FileLock, current_op: str | None = None
) -> None:
    for op in stale_operations(store, env.env_id, lock):
        if op.op_id == current_op:
            continue
        ctx.progress.note(
            "interrupted-operation",
            explain_interrupted(op),
            environment=env.name,
            environment_id=env.env_id,
            operation_id=op.op_id,
        )
        with store.transaction() as db:
            store.finish_operation(db, op.op_id, "interrupted", f"process {op.pid} ended during {op.step!r}")


async def lock_environment(ctx: Context, store: Store, env: EnvironmentRecord, kind: str) -> FileLock:
    lock = FileLock(env_lock_path(env.env_id))

    def waiting(who: str) -> None:
        ctx.progress.note(
            "waiting",
            f"waiting for another operation on Environment {env.label()} to finish ({who or 'unknown holder'})",
            environment=env.name,
            environment_id=env.env_id,
            holder=who,
        )

    await lock.acquire(holder(kind, ctx), on_wait=waiting)
    if store.environment(env.env_id) is None:
        lock.release()
        raise ConflictError(
            f"Environment {env.label()} was deleted by another command while this one waited; nothing was changed"
        )
    return lock


def fail_operation(store: Store, env: EnvironmentRecord, op_id: str, exc: BaseException, redactor: Redactor) -> None:
    """Finish an operation as failed (or interrupted) with its error, masked: stored errors hold no secret."""
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


async def delete_owned(driver: Any, record: MachineRecord, env: EnvironmentRecord) -> None:
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


# --- project and Environment selection ------------------------------------------------------------------------


@dataclass(frozen=True)
class Project:
    header: DefinitionHeader | None
    project_id: str


def _from_env_id(ctx: Context, explicit_env: str | None) -> Project | None:
    env_id = explicit_env if explicit_env and looks_like_env_id(explicit_env) else None
    env_id = env_id or ctx.environ.get(ENV_VAR_ENVIRONMENT) or None
    if env_id and ctx.definition_file is None:
        with open_store(ctx) as store:
            record = store.environment(env_id)
        if record is not None:
            return Project(None, record.project_id)
    return None


def resolve_project(ctx: Context, explicit_env: str | None, *, required: bool = True) -> Project | None:
    """The project to act on: from vz.json, or, without one, from an Environment id given explicitly.

    An invalid vz.json does not lock the user out: with an Environment id (``--environment env_…`` or
    ``VZ_ENVIRONMENT``) the Environment is still found through the state store.
    """
    try:
        path = find_definition(ctx.cwd, ctx.definition_file)
    except DefinitionNotFoundError:
        project = _from_env_id(ctx, explicit_env)
        if project is not None or not required:
            return project
        raise
    try:
        header = read_header(path)
    except DefinitionError as exc:
        project = _from_env_id(ctx, explicit_env)
        if project is not None:
            return project
        raise DefinitionError(
            f"{exc}\n(fix vz.json, or select the Environment by its id: `--environment env_…`)",
            exc.problems,
        ) from None
    return Project(header, header.project_id)


def choose(ctx: Context, store: Store, project: Project, explicit: str | None, *, for_up: bool) -> EnvironmentChoice:
    worktree = str(project.header.worktree) if project.header else None
    return select_environment(
        project_id=project.project_id,
        environments=store.environments(project.project_id),
        explicit=explicit,
        env_var=ctx.environ.get(ENV_VAR_ENVIRONMENT) or None,
        bound_here=store.bindings_here(project.project_id, worktree) if worktree else (),
        bindings=store.project_bindings(project.project_id),
        worktree=worktree,
        for_up=for_up,
        all_environments=store.environments(),
    )


def select_existing(ctx: Context, store: Store, project: Project, explicit: str | None) -> EnvironmentRecord:
    selected = choose(ctx, store, project, explicit, for_up=False)
    assert selected.environment is not None
    return selected.environment
