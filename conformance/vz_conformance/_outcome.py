"""What a check returns: it passed, or it does not apply because the driver declared a capability absent.

A failure is never a return value: a check raises ``AssertionError`` whose text says which RPC, which frame,
what was expected and what happened. Anything else a check raises is reported as a failure too.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NotApplicable", "Outcome", "Passed", "WireUnavailableError"]


@dataclass(frozen=True)
class Passed:
    """The case held. ``note`` records what the check settled on when the contract allows a choice
    (for example "environment refused as UNSUPPORTED")."""

    note: str = ""


@dataclass(frozen=True)
class NotApplicable:
    """The driver declared ``capability`` absent and the suite verified it refuses the call correctly.

    ``capability`` is the declaration that made the case not applicable (for example ``capabilities.logs``
    or ``extensions.egress_policies``); ``refusal`` says what the suite checked (which call, which error).
    Build it only through ``CheckContext.not_applicable`` so the refusal is always verified first.
    """

    capability: str
    refusal: str

    def __post_init__(self) -> None:
        if not self.capability or not self.refusal:
            raise ValueError("NotApplicable needs the capability and the verified refusal")


Outcome = Passed | NotApplicable


class WireUnavailableError(RuntimeError):
    """The raw gRPC channel needed by a wire-level case cannot be opened in this setup (the case cannot run)."""
