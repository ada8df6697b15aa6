"""The case catalogue: data, in a fixed order, with stable ids.

A label is the unit of selection. ``select(mode, labels)`` is the full set a run of those labels must
contain; ``digest()`` pins the catalogue a report was produced against.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from vz_conformance import _capabilities as cap
from vz_conformance._case import Case
from vz_conformance._checks import (
    cancel,
    checkpoint,
    crash,
    discovery,
    egress,
    exec,
    identity,
    lifecycle,
    local_exec,
    logs,
    malformed,
    mounts,
    network,
    pty,
    recreate,
    resources,
    services,
    storage,
)
from vz_conformance._labels import LABELS
from vz_conformance._providers import ProviderMode

__all__ = ["CATALOGUE", "LABELS", "by_id", "digest", "select", "unknown_labels"]

CATALOGUE: tuple[Case, ...] = (
    *discovery.CASES,
    *lifecycle.CASES,
    *exec.CASES,
    *local_exec.CASES,
    *cancel.CASES,
    *pty.CASES,
    *malformed.CASES,
    *logs.CASES,
    *mounts.CASES,
    *storage.CASES,
    *resources.CASES,
    *identity.CASES,
    *recreate.CASES,
    *egress.CASES,
    *network.CASES,
    *services.CASES,
    *crash.CASES,
    *checkpoint.CASES,
)


def _validate() -> None:
    seen: set[str] = set()
    for case in CATALOGUE:
        if case.id in seen:
            raise RuntimeError(f"duplicate case id {case.id!r} in the catalogue")
        seen.add(case.id)
        if case.label not in LABELS:
            raise RuntimeError(f"case {case.id!r} has unknown label {case.label!r}")
        for name in case.gated_by:
            if name not in cap.ALL:
                raise RuntimeError(f"case {case.id!r} is gated by unknown capability {name!r}")


_validate()
_BY_ID = {case.id: case for case in CATALOGUE}


def by_id(case_id: str) -> Case:
    return _BY_ID[case_id]


def unknown_labels(labels: Iterable[str]) -> list[str]:
    return sorted(set(labels) - set(LABELS))


def select(mode: ProviderMode, labels: Iterable[str] | None = None) -> tuple[Case, ...]:
    """Every case of ``labels`` (all labels when None) that exists in ``mode``, in catalogue order."""
    wanted = set(LABELS if labels is None else labels)
    bad = unknown_labels(wanted)
    if bad:
        raise ValueError(f"unknown label(s) {bad}; known labels: {', '.join(LABELS)}")
    return tuple(case for case in CATALOGUE if case.label in wanted and mode in case.modes)


def digest() -> str:
    """A fingerprint of the catalogue (ids, labels, modes, gates): reports from another catalogue never pass."""
    lines = [f"{c.id}|{','.join(c.modes)}|{','.join(c.gated_by)}" for c in CATALOGUE]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
