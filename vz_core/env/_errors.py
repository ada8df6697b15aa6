"""Errors of the Environment layer, all under ``vz_core.errors.UserError``.

::

    UserError
    ├── DefinitionError              vz.json is invalid JSON or breaks the schema (paths in the message)
    ├── DefinitionNotFoundError      no vz.json upward from the working directory (names where it looked)
    ├── PlanError                    `vz up` would need an immutable or unsafe change (explains --recreate)
    ├── ConflictError                another operation holds what was asked for (busy, already exists)
    └── SelectionError
        ├── SelectionNotFoundError   a selector that is present matched nothing
        └── AmbiguousSelectionError  more than one candidate; the message lists them
            └── UnboundWorktreeError this worktree is bound to none of the project's Environments
"""

from __future__ import annotations

from collections.abc import Sequence

from vz_core.errors import SelectionError, UserError

__all__ = [
    "AmbiguousSelectionError",
    "ConflictError",
    "DefinitionError",
    "DefinitionNotFoundError",
    "PlanError",
    "SelectionNotFoundError",
    "UnboundWorktreeError",
]


class DefinitionError(UserError):
    """vz.json could not be read, is not JSON, or breaks the schema.

    ``problems`` holds one ``(json_path, message)`` pair per violation, e.g. ``("$.machines[0].profile",
    "field required")``.
    """

    def __init__(self, message: str, problems: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class DefinitionNotFoundError(UserError):
    """No vz.json was found; ``searched`` lists every directory that was looked in."""

    def __init__(self, message: str, searched: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.searched = tuple(searched)


class PlanError(UserError):
    """Reconciling would need a change that cannot happen in place; nothing was changed."""


class ConflictError(UserError):
    """Something else holds the resource (a concurrent operation, an existing name)."""


class SelectionNotFoundError(SelectionError):
    """A selector (flag, environment variable, binding) named no Environment or Machine."""


class AmbiguousSelectionError(SelectionError):
    """More than one Environment or Machine could be meant; ``candidates`` lists them as "name (id)"."""

    def __init__(self, message: str, candidates: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.candidates = tuple(candidates)


class UnboundWorktreeError(AmbiguousSelectionError):
    """No selector, this worktree is bound to no Environment and the project has some: fail closed (never adopt
    another worktree's Environment, never create one beside it); ``candidates`` lists them all."""
