"""One error hierarchy for vz, mapped exactly once to the Runtime Protocol (PROTOCOL.md §5).

::

    VzError                                  root of everything vz raises on purpose
    ├── UserError                            caller misuse found by the host; nothing was changed
    │   ├── SelectionError                   no / ambiguous Environment or Machine selection
    │   │   ├── SelectionNotFoundError       (vz_core.env) a selector matched nothing
    │   │   └── AmbiguousSelectionError      (vz_core.env) several candidates, listed
    │   ├── DefinitionError                  (vz_core.env) vz.json unreadable, not strict JSON, or breaks the schema
    │   ├── DefinitionNotFoundError          (vz_core.env) no vz.json upward from here
    │   ├── PlanError                        (vz_core.env) `vz up` would need --recreate
    │   ├── ConflictError                    (vz_core.env) another operation holds what was asked for
    │   ├── StoreError                       (vz_core.env) the state database cannot be used (damaged, empty,
    │   │   │                                full disk, unreadable record, newer schema)
    │   │   └── StoreBusyError               also a ConflictError: locked by another vz after the wait
    │   └── RegistrationError                (vz_core.registry) a driver registration is invalid
    ├── TrustError                           a driver binary or manifest failed verification
    ├── PluginError                          a plugin process misbehaved (handshake, crash, protocol)
    └── DriverError                          a Runtime Protocol error category, carried on the wire
        ├── caller misuse:  InvalidArgumentError, NotFoundError, AlreadyExistsError,
        │                   FailedPreconditionError, PermissionDeniedError, UnsupportedError,
        │                   IncompatibleVersionError
        └── backend broke:  UnavailableError, RuntimeFailureError, RuntimeTimeoutError,
                            OperationCancelledError, UnknownRuntimeError

Every ``DriverError`` class has exactly one ``RuntimeErrorCode`` and one gRPC status code (``CATEGORY_TABLE``).
On the wire an error is a gRPC status whose ``google.rpc.Status.details`` hold exactly one
``devsy.runtime.v1.RuntimeError``; ``vz_core.rpc.error_to_status`` and ``vz_core.rpc.error_from_rpc`` are the
only translators (``error_class_for_code`` and ``error_class_for_grpc`` below are their lookup tables). The CLI
maps each class to an exit code once (``vz_core.cli._exit.classify``, by isinstance; docs/cli.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # grpc is imported lazily: `vz --help` and plain errors must not pay for it
    import grpc

__all__ = [
    "CATEGORY_TABLE",
    "AlreadyExistsError",
    "Category",
    "DriverError",
    "FailedPreconditionError",
    "IncompatibleVersionError",
    "InvalidArgumentError",
    "NotFoundError",
    "OperationCancelledError",
    "PermissionDeniedError",
    "PluginError",
    "RuntimeFailureError",
    "RuntimeTimeoutError",
    "SelectionError",
    "TrustError",
    "UnavailableError",
    "UnknownRuntimeError",
    "UnsupportedError",
    "UserError",
    "VzError",
    "error_class_for_code",
]


class VzError(Exception):
    """Root of every error vz raises on purpose. ``str()`` is one actionable line."""


class UserError(VzError):
    """The user asked for something invalid; nothing was changed."""


class SelectionError(UserError):
    """An Environment/Machine selector matched nothing or more than one candidate."""


class TrustError(VzError):
    """A driver binary or manifest failed verification; the binary was not launched."""


class PluginError(VzError):
    """A plugin process misbehaved (no/garbled handshake, wrong versions, crash)."""


@dataclass(frozen=True)
class Category:
    """One row of the error table: wire code name and number, gRPC status code name, retryability."""

    name: str
    number: int
    grpc_code_name: str
    retryable: bool = False

    @property
    def grpc_code(self) -> grpc.StatusCode:
        """The gRPC status code of this category."""
        import grpc

        code: grpc.StatusCode = getattr(grpc.StatusCode, self.grpc_code_name)
        return code


class DriverError(VzError):
    """An error of one Runtime Protocol category.

    ``message`` is actionable and shown to users; ``runtime_message`` holds backend diagnostics (redacted
    before display); ``details`` is a string map of context (which field, which workspace).
    """

    category: ClassVar[Category]

    def __init__(
        self,
        message: str,
        *,
        runtime_message: str = "",
        details: Mapping[str, str] | None = None,
        retryable: bool | None = None,
    ) -> None:
        if not message:
            raise ValueError("a DriverError needs a non-empty, actionable message")
        super().__init__(message)
        self.message = message
        self.runtime_message = runtime_message
        self.details: Mapping[str, str] = MappingProxyType(dict(details or {}))
        self.retryable = self.category.retryable if retryable is None else retryable

    @property
    def code(self) -> str:
        """The RuntimeErrorCode name without prefix, e.g. "NOT_FOUND"."""
        return self.category.name

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.runtime_message, dict(self.details), self.retryable))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code})"


def _rebuild(
    cls: type[DriverError], message: str, runtime_message: str, details: dict[str, str], retryable: bool
) -> DriverError:
    return cls(message, runtime_message=runtime_message, details=details, retryable=retryable)


def _category(name: str, number: int, code: str, retryable: bool = False) -> Category:
    return Category(name, number, code, retryable)


class UnknownRuntimeError(DriverError):
    """The backend failed in a way it could not classify."""

    category = _category("UNKNOWN", 0, "UNKNOWN")


class NotFoundError(DriverError):
    """The Machine (or a named resource) does not exist."""

    category = _category("NOT_FOUND", 1, "NOT_FOUND")


class AlreadyExistsError(DriverError):
    """The Machine already exists and the request did not allow recreation."""

    category = _category("ALREADY_EXISTS", 2, "ALREADY_EXISTS")


class InvalidArgumentError(DriverError):
    """The request is malformed (empty ids, bad frames, impossible values)."""

    category = _category("INVALID_ARGUMENT", 3, "INVALID_ARGUMENT")


class UnsupportedError(DriverError):
    """The driver or this host cannot do what was asked (capability absent)."""

    category = _category("UNSUPPORTED", 4, "UNIMPLEMENTED")


class UnavailableError(DriverError):
    """The backend or plugin is unreachable right now; retrying may help."""

    category = _category("UNAVAILABLE", 5, "UNAVAILABLE", retryable=True)


class FailedPreconditionError(DriverError):
    """The Machine is not in a state that allows the call (stopped, identity changed)."""

    category = _category("FAILED_PRECONDITION", 6, "FAILED_PRECONDITION")


class PermissionDeniedError(DriverError):
    """The backend refused for lack of permission."""

    category = _category("PERMISSION_DENIED", 7, "PERMISSION_DENIED")


class RuntimeTimeoutError(DriverError):
    """The operation ran out of time."""

    category = _category("TIMEOUT", 8, "DEADLINE_EXCEEDED")


class OperationCancelledError(DriverError):
    """The caller cancelled the operation."""

    category = _category("CANCELLED", 9, "CANCELLED")


class RuntimeFailureError(DriverError):
    """The backend broke while doing what was asked."""

    category = _category("RUNTIME_FAILURE", 10, "INTERNAL")


class IncompatibleVersionError(DriverError):
    """The peer speaks an API version this side cannot use."""

    category = _category("INCOMPATIBLE_VERSION", 11, "FAILED_PRECONDITION")


CATEGORY_TABLE: tuple[type[DriverError], ...] = (
    UnknownRuntimeError,
    NotFoundError,
    AlreadyExistsError,
    InvalidArgumentError,
    UnsupportedError,
    UnavailableError,
    FailedPreconditionError,
    PermissionDeniedError,
    RuntimeTimeoutError,
    OperationCancelledError,
    RuntimeFailureError,
    IncompatibleVersionError,
)
"""Every category, indexed by its RuntimeErrorCode number."""

_BY_NUMBER = {cls.category.number: cls for cls in CATEGORY_TABLE}

# A status that carries no RuntimeError detail (transport failures, peers that do not follow the convention)
# is classified by its gRPC code alone. INCOMPATIBLE_VERSION is only recognised through the detail.
_BY_GRPC_CODE: dict[str, type[DriverError]] = {
    "UNKNOWN": UnknownRuntimeError,
    "NOT_FOUND": NotFoundError,
    "ALREADY_EXISTS": AlreadyExistsError,
    "INVALID_ARGUMENT": InvalidArgumentError,
    "UNIMPLEMENTED": UnsupportedError,
    "UNAVAILABLE": UnavailableError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "UNAUTHENTICATED": PermissionDeniedError,
    "DEADLINE_EXCEEDED": RuntimeTimeoutError,
    "CANCELLED": OperationCancelledError,
    "INTERNAL": RuntimeFailureError,
    "RESOURCE_EXHAUSTED": RuntimeFailureError,
    "DATA_LOSS": RuntimeFailureError,
    "ABORTED": UnavailableError,
    "OUT_OF_RANGE": InvalidArgumentError,
}


def error_class_for_code(number: int) -> type[DriverError]:
    """The DriverError class of a RuntimeErrorCode number; unknown numbers map to UnknownRuntimeError."""
    return _BY_NUMBER.get(number, UnknownRuntimeError)


def error_class_for_grpc(code: grpc.StatusCode) -> type[DriverError]:
    """The DriverError class for a status that carried no RuntimeError detail."""
    return _BY_GRPC_CODE.get(code.name, UnknownRuntimeError)
