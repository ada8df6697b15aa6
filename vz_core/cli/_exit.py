"""Exit codes and how every understood error maps to one (documented in docs/cli.md)."""

from __future__ import annotations

from vz_core.errors import (
    AlreadyExistsError,
    DriverError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OperationCancelledError,
    UnsupportedError,
    UserError,
    VzError,
)

__all__ = ["BACKEND", "CONFLICT", "INTERRUPTED", "NOT_FOUND", "OK", "USAGE", "classify"]

OK = 0
BACKEND = 1
USAGE = 2
NOT_FOUND = 3
CONFLICT = 4
INTERRUPTED = 130

KINDS = {OK: "ok", BACKEND: "backend_failure", USAGE: "user_error", NOT_FOUND: "not_found", CONFLICT: "conflict"}


def classify(exc: VzError) -> tuple[int, str]:
    """(exit code, kind) of an understood error."""
    from vz_core.env import (
        AmbiguousSelectionError,
        ConflictError,
        DefinitionNotFoundError,
        PlanError,
        SelectionNotFoundError,
    )

    code: int
    if isinstance(exc, DefinitionNotFoundError | SelectionNotFoundError | NotFoundError):
        code = NOT_FOUND
    elif isinstance(exc, AmbiguousSelectionError | ConflictError | PlanError | AlreadyExistsError):
        code = CONFLICT
    elif isinstance(exc, OperationCancelledError):
        return INTERRUPTED, "interrupted"
    elif isinstance(exc, UserError | InvalidArgumentError | UnsupportedError | FailedPreconditionError):
        code = USAGE
    elif isinstance(exc, DriverError):
        code = BACKEND
    else:  # TrustError, PluginError and any other VzError: the backend side failed
        code = BACKEND
    return code, KINDS[code]
