"""The one table of exit codes and kinds (docs/cli.md, exit codes): what the CLI exits with, what the daemon's
error objects carry, what ``vz_core.api.ApiError`` reports. Standard library only (``classify_core`` reads
``vz_core.errors`` when it is called)."""

from __future__ import annotations

__all__ = [
    "BACKEND",
    "CONFLICT",
    "INTERRUPTED",
    "KINDS",
    "NOT_FOUND",
    "OK",
    "UNAVAILABLE",
    "USAGE",
    "classify_core",
    "kind_of",
]

OK = 0
BACKEND = 1
USAGE = 2
NOT_FOUND = 3
CONFLICT = 4
UNAVAILABLE = 69
"""No vz daemon is reachable (none runs and autostart is off, or it could not be started): EX_UNAVAILABLE."""
INTERRUPTED = 130

KINDS = {
    OK: "ok",
    BACKEND: "backend_failure",
    USAGE: "user_error",
    NOT_FOUND: "not_found",
    CONFLICT: "conflict",
    UNAVAILABLE: "unavailable",
    INTERRUPTED: "interrupted",
}
"""Exit code -> the ``kind`` an error object carries with it."""


def kind_of(exit_code: int) -> str:
    """The kind of an exit code (``backend_failure`` for any code not in the table)."""
    return KINDS.get(exit_code, KINDS[BACKEND])


def classify_core(exc: BaseException) -> tuple[int, str]:
    """(exit code, kind) of an error of the ``vz_core.errors`` tree, by isinstance: the part of the table that
    needs no Environment layer (``vz_core.daemon.classify_error`` adds the Environment layer's errors first).

    Anything else (a bug, an OS error, a plugin or trust failure) is a backend failure (1); a cancellation is
    "interrupted" (130).
    """
    import sys

    from vz_core.errors import (
        AlreadyExistsError,
        FailedPreconditionError,
        InvalidArgumentError,
        NotFoundError,
        OperationCancelledError,
        UnsupportedError,
        UserError,
    )

    asyncio = sys.modules.get("asyncio")  # not imported for this: when it is not loaded, nothing was cancelled
    cancelled = asyncio is not None and isinstance(exc, asyncio.CancelledError)
    if isinstance(exc, NotFoundError):
        code = NOT_FOUND
    elif isinstance(exc, AlreadyExistsError):
        code = CONFLICT
    elif isinstance(exc, OperationCancelledError | KeyboardInterrupt) or cancelled:
        code = INTERRUPTED
    elif isinstance(exc, UserError | InvalidArgumentError | UnsupportedError | FailedPreconditionError):
        code = USAGE
    else:
        code = BACKEND
    return code, KINDS[code]
