"""Which Environment and which Machine a command means.

Environment, first match wins:

1. ``--environment`` (a name or an id) — when given and wrong, it fails; nothing further is tried;
2. ``VZ_ENVIRONMENT_ID`` (an id) — likewise;
3. this worktree's binding (the Environment the first `vz up` in this directory used or created);
4. the sole bound Environment of the project (or the sole Environment when none is bound);
5. none at all: `vz up` creates ``default``; other commands fail (nothing to act on).

More than one candidate at step 4 is an ambiguity: it fails and lists them. `vz up --environment NAME` with an
unknown *name* creates that Environment; an unknown *id* is always an error.

Machine: ``--machine`` (name or id) → ``VZ_MACHINE_ID`` → the Environment's default Machine → its sole
Machine; several and no default is an ambiguity.

There is no global "current" Environment: nothing here reads or writes state other than the records given.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from vz_core.env._errors import AmbiguousSelectionError, SelectionNotFoundError
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
    via: Literal["flag", "env-var", "binding", "sole", "new"]


def _listing(envs: Sequence[EnvironmentRecord]) -> str:
    return ", ".join(e.label() for e in envs) or "none"


def select_environment(
    *,
    project_id: str,
    environments: Sequence[EnvironmentRecord],
    explicit: str | None,
    env_var: str | None,
    bound_env_id: str | None,
    bound_env_ids: Collection[str],
    for_up: bool,
    all_environments: Sequence[EnvironmentRecord] = (),
) -> EnvironmentChoice:
    """Apply the selection order. ``environments`` are the project's; ``all_environments`` (optional, every
    project's) only improves the message when an id belongs to another project."""
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
    if bound_env_id is not None:
        for env in environments:
            if env.env_id == bound_env_id:
                return EnvironmentChoice(env, None, "binding")
    bound = [e for e in environments if e.env_id in bound_env_ids]
    candidates = bound or list(environments)
    if len(candidates) == 1:
        return EnvironmentChoice(candidates[0], None, "sole")
    if not candidates:
        if for_up:
            return EnvironmentChoice(None, DEFAULT_ENVIRONMENT, "new")
        raise SelectionNotFoundError(f"project {project_id!r} has no Environment yet; create one with `vz up`")
    labels = [e.label() for e in candidates]
    raise AmbiguousSelectionError(
        f"project {project_id!r} has several Environments and this directory is bound to none of them: "
        f"{', '.join(labels)}; choose one with --environment NAME (or set {ENV_VAR_ENVIRONMENT})",
        labels,
    )


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
