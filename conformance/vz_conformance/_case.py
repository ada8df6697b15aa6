"""A case of the catalogue: stable id, label, description, what can make it not applicable, where it runs."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vz_conformance._outcome import Outcome
from vz_conformance._providers import ProviderMode

if TYPE_CHECKING:
    from vz_conformance._context import CheckContext

__all__ = ["BOTH", "EXTERNAL_ONLY", "Case", "CheckFn"]

CheckFn = Callable[["CheckContext"], Coroutine[Any, Any, Outcome]]
BOTH: tuple[ProviderMode, ...] = ("in-process", "external")
EXTERNAL_ONLY: tuple[ProviderMode, ...] = ("external",)


@dataclass(frozen=True)
class Case:
    """One entry of the catalogue.

    ``id`` is ``<label>.<name>`` and never changes meaning once published. ``gated_by`` lists the declared
    capabilities whose absence (with a verified refusal) may make the case not applicable; a case with an
    empty ``gated_by`` must pass. ``modes`` says where the case exists: crash/compatibility cases need a
    plugin process and exist only in external runs.
    """

    id: str
    description: str
    check: CheckFn
    gated_by: tuple[str, ...] = ()
    modes: tuple[ProviderMode, ...] = BOTH

    @property
    def label(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.id.split(".", 1)[1]
