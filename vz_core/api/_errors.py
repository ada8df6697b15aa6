"""``ApiError``: every failure of an API call, on either transport (the daemon's error object, docs/api.md)."""

from __future__ import annotations

from vz_core.wire import ErrorObject, error_fields

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = ["ApiError"]


class ApiError(ErrorObject, Exception):
    """A call failed. The fields are the daemon's error object (the same over the local wire and gRPC):

    * ``code``: the error category (``NOT_FOUND``, ``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``,
      ``UNAVAILABLE``, ``CANCELLED``, ... the Runtime Protocol's code names);
    * ``message``: one actionable line, already masked;
    * ``kind`` and ``exit_code``: what the CLI prints and exits with (``not_found``/3, ``user_error``/2,
      ``conflict``/4, ``backend_failure``/1, ``interrupted``/130, ``unavailable``/69 when no daemon runs);
    * ``details``: the driver's ``devsy.runtime.v1.RuntimeError`` as JSON (``code``, ``message``,
      ``runtime_message``, ``retryable``, ``details``) when a driver said it, else None.

    ``to_wire`` gives that error object back.
    """

    def __init__(
        self,
        code: str,
        message: str,
        kind: str = "backend_failure",
        exit_code: int = 1,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.kind = kind
        self.exit_code = exit_code
        self.details = details

    @classmethod
    def from_wire(cls, error: Mapping[str, Any]) -> ApiError:
        """The error of a daemon's error object ``{"code", "message", "kind", "exit_code", "details"}``."""
        return cls(**error_fields(error))

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.message!r}, kind={self.kind!r}, exit_code={self.exit_code})"
