"""Which Environment and which Machine a command means.

Environment, first match wins:

1. ``--environment`` (a name or an id) — when given and wrong, it fails; nothing further is tried;
2. ``VZ_ENVIRONMENT_ID`` (an id) — likewise;
3. this worktree's bindings: exactly one → that Environment; several → an ambiguity listing them;
4. none bound here: when the project has no Environment at all, `vz up` creates ``default`` (other commands
   fail: nothing to act on); when it has some, every command fails closed, listing each candidate (name, id,
   the worktrees it is bound to) and the commands that select or create one. A new worktree never silently
   adopts an Environment another worktree uses, and never creates one beside it.

`vz up --environment NAME` with an unknown *name* creates that Environment; an unknown *id* is always an error.
`vz up --environment X` binds this worktree to X (one worktree may own several Environments).

Machine: ``--machine`` (name or id) → ``VZ_MACHINE_ID`` → the Environment's default Machine → its sole
Machine; several and no default is an ambiguity.

There is no global "current" Environment: nothing here reads or writes state other than the records given.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from vz_core.env._errors import AmbiguousSelectionError, SelectionNotFoundError, UnboundWorktreeError
from vz_core.env._ids import NAME_RE, looks_like_env_id, looks_like_machine_id
from vz_core.env._store import EnvironmentRecord, MachineRecord

__all__ = ["DEFAULT_ENVIRONMENT", "EnvironmentChoice", "select_environment", "select_machine"]

DEFAULT_ENVIRONMENT = "default"
ENV_VAR_ENVIRONMENT = "VZ_ENVIRONMENT_ID"
ENV_VAR_MACHINE = "VZ_MACHINE_ID"


@dataclass(frozen=True)
class EnvironmentChoice:
    """The outcome of Environment selection: an existing record, or the name of one to create (up only)."""

    environment: EnvironmentRecord | None
    create_name: str | None
    via: Literal["flag", "env-var", "binding", "new"]


def _listing(envs: Sequence[EnvironmentRecord]) -> str:
    return ", ".join(e.label() for e in envs) or "none"


def _where_bound(env: EnvironmentRecord, bindings: Mapping[str, Sequence[str]]) -> str:
    places = bindings.get(env.env_id) or ()
    return f"bound to {', '.join(places)}" if places else "bound to no worktree"


def select_environment(
    *,
    project_id: str,
    environments: Sequence[EnvironmentRecord],
    explicit: str | None,
    env_var: str | None,
    bound_here: Collection[str],
    for_up: bool,
    bindings: Mapping[str, Sequence[str]] | None = None,
    worktree: str | None = None,
    all_environments: Sequence[EnvironmentRecord] = (),
) -> EnvironmentChoice:
    """Apply the selection order. ``environments`` are the project's; ``bound_here`` the env_ids this worktree
    is bound to; ``bindings`` (env_id → worktrees) and ``all_environments`` (every project's) only improve the
    messages."""
    bindings = bindings or {}
    if explicit is not None:
        explicit = explicit.strip()
        for env in environments:
            if explicit in (env.env_id, env.name):
                return EnvironmentChoice(env, None, "flag")
        if looks_like_env_id(explicit):
            raise SelectionNotFoundError(
                f"--environment {explicit}: no Environment with that id in project {project_id!r}"
                f"{_elsewhere(explicit, all_environments)}; Environments: {_listing(environments)}"
            )
        if for_up:
            if not NAME_RE.fullmatch(explicit):
                raise SelectionNotFoundError(
                    f"--environment {explicit!r} is not a valid Environment name (lowercase letters, digits and "
                    "inner dashes, 1..40 characters) nor an Environment id"
                )
            return EnvironmentChoice(None, explicit, "new")
        raise SelectionNotFoundError(
            f"--environment {explicit}: project {project_id!r} has no Environment with that name or id; "
            f"Environments: {_listing(environments)} (`vz up --environment {explicit}` creates it)"
        )
    if env_var:
        for env in environments:
            if env.env_id == env_var:
                return EnvironmentChoice(env, None, "env-var")
        raise SelectionNotFoundError(
            f"{ENV_VAR_ENVIRONMENT}={env_var} names no Environment of project {project_id!r}"
            f"{_elsewhere(env_var, all_environments)}; unset it or set it to one of: {_listing(environments)}"
        )
    here = [e for e in environments if e.env_id in bound_here]
    if len(here) == 1:
        return EnvironmentChoice(here[0], None, "binding")
    if len(here) > 1:
        labels = [e.label() for e in here]
        raise AmbiguousSelectionError(
            f"this worktree{_at(worktree)} is bound to several Environments of project {project_id!r}: "
            f"{', '.join(labels)}; choose one with --environment NAME (or set {ENV_VAR_ENVIRONMENT})",
            labels,
        )
    if not environments:
        if for_up:
            return EnvironmentChoice(None, DEFAULT_ENVIRONMENT, "new")
        raise SelectionNotFoundError(f"project {project_id!r} has no Environment yet; create one with `vz up`")
    labels = [e.label() for e in environments]
    candidates = "; ".join(f"{e.label()}, {_where_bound(e, bindings)}" for e in environments)
    raise UnboundWorktreeError(
        f"this worktree{_at(worktree)} is bound to no Environment, and project {project_id!r} already has "
        f"{len(environments)}: {candidates}. Nothing was selected or changed. Use one with "
        f"`vz up --environment NAME` (binds this worktree to it) or `--environment NAME` on this command; create "
        f"a new one with `vz up --environment NEW-NAME`; `vz status --all` shows them all",
        labels,
    )


def _at(worktree: str | None) -> str:
    return f" ({worktree})" if worktree else ""


def _elsewhere(env_id: str, all_environments: Sequence[EnvironmentRecord]) -> str:
    for env in all_environments:
        if env.env_id == env_id:
            return f" (it belongs to project {env.project_id!r})"
    return ""


def select_machine(
    *,
    environment: EnvironmentRecord,
    machines: Sequence[MachineRecord],
    explicit: str | None,
    env_var: str | None,
) -> MachineRecord:
    """Apply the Machine selection order within one Environment."""
    listing = ", ".join(m.label() for m in machines) or "none"
    if explicit is not None:
        explicit = explicit.strip()
        for machine in machines:
            if explicit in (machine.machine_id, machine.name):
                return machine
        what = "id" if looks_like_machine_id(explicit) else "name or id"
        raise SelectionNotFoundError(
            f"--machine {explicit}: Environment {environment.label()} has no Machine with that {what}; "
            f"Machines: {listing}"
        )
    if env_var:
        for machine in machines:
            if machine.machine_id == env_var:
                return machine
        raise SelectionNotFoundError(
            f"{ENV_VAR_MACHINE}={env_var} names no Machine of Environment {environment.label()}; "
            f"unset it or set it to one of: {listing}"
        )
    if not machines:
        raise SelectionNotFoundError(
            f"Environment {environment.label()} has no Machines yet; run `vz up --environment {environment.name}`"
        )
    if environment.default_machine:
        for machine in machines:
            if machine.name == environment.default_machine:
                return machine
    if len(machines) == 1:
        return machines[0]
    labels = [m.label() for m in machines]
    raise AmbiguousSelectionError(
        f"Environment {environment.label()} has several Machines and no default_machine: {', '.join(labels)}; "
        f"choose one with --machine NAME (or set default_machine in vz.json)",
        labels,
    )
