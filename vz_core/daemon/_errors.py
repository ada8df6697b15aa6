"""What a failed call sends back: the error object of the local wire, and the one error → exit code mapping.

``classify_error`` is the mapping the CLI prints and the daemon sends (docs/cli.md, exit codes): one table for
both sides, so a command fails the same way whether the CLI or the daemon ran it. ``encode_error`` builds the
wire's error object ``E``::

    {"code": "NOT_FOUND", "message": "...", "kind": "not_found", "exit_code": 3, "details": {...} | None}

``code`` is the Runtime Protocol error code name of a driver error (``vz_core.errors``), or the nearest one for
errors the host found itself; ``details`` is the ``devsy.runtime.v1.RuntimeError`` JSON mapping (proto3, field
names preserved) when a driver said it. Everything textual is redacted with the call's secrets.

This module is light: the CLI imports it on its hot path.
"""

from __future__ import annotations

import sys
from typing import Any

from vz_core.redact import Redactor
from vz_core.wire import BACKEND, CONFLICT, INTERRUPTED, KINDS, NOT_FOUND, OK, USAGE, classify_core

__all__ = [
    "BACKEND",
    "CONFLICT",
    "INTERRUPTED",
    "KINDS",
    "NOT_FOUND",
    "OK",
    "USAGE",
    "CallFailed",
    "classify_error",
    "encode_error",
]


def classify_error(exc: BaseException) -> tuple[int, str]:
    """(exit code, kind) of an error: the table of docs/cli.md (``vz_core.wire``'s), by isinstance.

    The Environment layer's errors first (selection, definition, conflicts, plans), then the ``vz_core.errors``
    tree (``vz_core.wire.classify_core``): anything that is not a ``VzError`` (a bug, an OS error) is a
    backend failure (1); a cancellation is "interrupted" (130).
    """
    from vz_core.env import (
        AmbiguousSelectionError,
        ConflictError,
        DefinitionNotFoundError,
        PlanError,
        SelectionNotFoundError,
    )

    if isinstance(exc, DefinitionNotFoundError | SelectionNotFoundError):
        return NOT_FOUND, KINDS[NOT_FOUND]
    if isinstance(exc, AmbiguousSelectionError | ConflictError | PlanError):
        return CONFLICT, KINDS[CONFLICT]
    return classify_core(exc)


def _code_name(exc: BaseException, exit_code: int) -> str:
    """The Runtime Protocol code name of an error (its own for a driver error, the nearest one otherwise)."""
    from vz_core.errors import DriverError, PluginError, TrustError, UserError

    if isinstance(exc, DriverError):
        return exc.code
    if exit_code == NOT_FOUND:
        return "NOT_FOUND"
    if exit_code == CONFLICT:  # busy, ambiguous, or would need --recreate: the state does not allow it now
        return "FAILED_PRECONDITION"
    if exit_code == INTERRUPTED:
        return "CANCELLED"
    if isinstance(exc, UserError):
        return "INVALID_ARGUMENT"
    if isinstance(exc, TrustError):
        return "PERMISSION_DENIED"
    if isinstance(exc, PluginError):
        return "UNAVAILABLE"
    return "UNKNOWN"


def _runtime_error(exc: BaseException, redactor: Redactor) -> dict[str, Any] | None:
    """The devsy.runtime.v1.RuntimeError JSON mapping of a driver error (None for any other error)."""
    from vz_core.errors import DriverError

    if not isinstance(exc, DriverError):
        return None
    return {
        "code": f"RUNTIME_ERROR_CODE_{exc.code}",
        "message": redactor.redact(exc.message),
        "runtime_message": redactor.redact(exc.runtime_message),
        "retryable": bool(exc.retryable),
        "details": {str(k): redactor.redact(str(v)) for k, v in exc.details.items()},
    }


def _is_cancel(exc: BaseException) -> bool:
    # asyncio is not imported for this: when it is not loaded, nothing can have been cancelled.
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and isinstance(exc, asyncio.CancelledError)


def _message(exc: BaseException) -> str:
    from vz_core.errors import VzError

    if isinstance(exc, VzError):
        return str(exc) or type(exc).__name__
    if isinstance(exc, KeyboardInterrupt) or _is_cancel(exc):
        return "interrupted; run the command again to converge"
    # Not an error vz raises on purpose: say what it is, the daemon's log has the traceback.
    return f"internal error in the vz daemon: {type(exc).__name__}: {exc} (see `vz daemon logs`)"


def cancelled_message(method: str, reason: str | None) -> str:
    """The message of a call its client cancelled (``reason``: "cancelled by the client", "the client received
    SIGINT", ...; None: a hangup), in the terms of what the method was doing (docs/api.md, how each call ends)."""
    reason = reason or "the client closed the connection"
    if method == "Machines.Exec":
        return f"the command was killed: {reason} (the Machine keeps running)"
    from vz_core.wire import METHODS

    known = METHODS.get(method)
    if known is not None and known.operation:
        return f"interrupted: {reason}; run it again to converge"
    return f"cancelled: {reason}"


class CallFailed(Exception):
    """A call's failure, already encoded (``error`` is the wire's E, redacted with the call's secrets)."""

    def __init__(self, error: dict[str, Any], cause: BaseException | None = None) -> None:
        super().__init__(error.get("message", ""))
        self.error = error
        self.cause = cause


def encode_error(exc: BaseException, redactor: Redactor | None = None) -> dict[str, Any]:
    """The wire's error object E of ``exc`` (see the module docstring), every text masked with ``redactor``."""
    if isinstance(exc, CallFailed):
        return dict(exc.error)
    redactor = redactor if redactor is not None else Redactor()
    exit_code, kind = classify_error(exc)
    return {
        "code": _code_name(exc, exit_code),
        "message": redactor.redact(_message(exc)),
        "kind": kind,
        "exit_code": exit_code,
        "details": _runtime_error(exc, redactor),
    }
