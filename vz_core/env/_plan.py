"""Reconciliation: what `vz up` must do to make an Environment match vz.json.

``compute_plan`` is pure: desired Machines (from the definition, in definition order), recorded Machines (from
the state store) and what the drivers observed (Find) go in; an ordered, deterministic ``Plan`` comes out. The
same inputs always give the same plan.

Field classes of a Machine (everything vz sends to RunImage is fixed at creation, so a change needs a new
Machine; only ``--recreate`` may ask a driver to replace one):

* identity (``driver``, ``target``): which backend and platform realize the Machine;
* creation-time (image, profile, resources, workspace, mounts, volumes, environment, egress, driver options);
* Environment-level and mutable: adding a Machine, the default Machine: applied in place, identity kept.

Removing a Machine discards its data, so it also needs ``--recreate``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "IDENTITY_FIELDS",
    "Action",
    "Change",
    "Observed",
    "Plan",
    "RecordedMachine",
    "Step",
    "compute_plan",
    "diff_specs",
]

IDENTITY_FIELDS = ("driver", "target")
Action = Literal["create", "start", "keep", "recreate", "remove"]
Observed = Literal["running", "stopped", "missing"]


@dataclass(frozen=True)
class RecordedMachine:
    """The part of a state-store Machine row that planning needs."""

    name: str
    machine_id: str
    spec: Mapping[str, Any]
    state: str


@dataclass(frozen=True)
class Change:
    """One field whose desired value differs from the recorded one."""

    field: str
    kind: Literal["identity", "creation"]
    recorded: Any
    desired: Any

    def describe(self) -> str:
        if self.field == "environment":
            rec = self.recorded if isinstance(self.recorded, dict) else {}
            des = self.desired if isinstance(self.desired, dict) else {}
            keys = sorted(k for k in set(rec) | set(des) if rec.get(k) != des.get(k))
            return f"environment changed ({', '.join(keys)})"  # names only: values may be sensitive
        return f"{self.field} {_short(self.recorded)} → {_short(self.desired)}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field, "kind": self.kind}
        if self.field == "environment":
            rec = self.recorded if isinstance(self.recorded, dict) else {}
            des = self.desired if isinstance(self.desired, dict) else {}
            out["keys"] = sorted(k for k in set(rec) | set(des) if rec.get(k) != des.get(k))
        else:
            out["recorded"] = self.recorded
            out["desired"] = self.desired
        return out


@dataclass(frozen=True)
class Step:
    """One Machine-level action of a plan."""

    action: Action
    machine: str
    machine_id: str | None
    """None for a Machine that does not exist yet (its id is assigned when it is created)."""
    reason: str
    changes: tuple[Change, ...] = ()

    @property
    def mutates(self) -> bool:
        return self.action != "keep"

    def describe(self) -> str:
        sign = {"create": "+", "start": ">", "keep": "=", "recreate": "~", "remove": "-"}[self.action]
        text = f"{sign} {self.action} {self.machine}"
        if self.reason:
            text += f": {self.reason}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "machine": self.machine,
            "machine_id": self.machine_id,
            "reason": self.reason,
            "changes": [c.to_json() for c in self.changes],
        }


@dataclass(frozen=True)
class Plan:
    """What `vz up` will do, in order. ``blocked`` steps need ``--recreate`` and stop the plan when present."""

    steps: tuple[Step, ...]
    default_machine: tuple[str | None, str | None] | None = None
    """(recorded, desired) when the default Machine changes."""
    blocked: tuple[Step, ...] = field(default=())

    @property
    def changes_anything(self) -> bool:
        return self.default_machine is not None or any(s.mutates for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": [s.to_json() for s in self.steps],
            "default_machine": None
            if self.default_machine is None
            else {"recorded": self.default_machine[0], "desired": self.default_machine[1]},
            "blocked": [s.to_json() for s in self.blocked],
        }

    def lines(self) -> list[str]:
        out = [s.describe() for s in self.steps]
        if self.default_machine is not None:
            out.append(
                f"* default machine {self.default_machine[0] or '(none)'} → {self.default_machine[1] or '(none)'}"
            )
        return out


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 60 else text[:57] + "..."


def diff_specs(recorded: Mapping[str, Any], desired: Mapping[str, Any]) -> tuple[Change, ...]:
    """Changed fields between two Machine specs in their recorded (JSON) form, in a stable order."""
    changes: list[Change] = []
    for key in sorted(set(recorded) | set(desired)):
        if key == "name":
            continue
        old, new = recorded.get(key), desired.get(key)
        if old != new:
            kind: Literal["identity", "creation"] = "identity" if key in IDENTITY_FIELDS else "creation"
            changes.append(Change(key, kind, old, new))
    # Identity first: it is what the user most needs to see.
    return tuple(sorted(changes, key=lambda c: (c.kind != "identity", c.field)))


def compute_plan(
    desired: Sequence[tuple[str, Mapping[str, Any]]],
    recorded: Sequence[RecordedMachine],
    observed: Mapping[str, Observed],
    *,
    recorded_default: str | None,
    desired_default: str | None,
    recreate: bool,
) -> Plan:
    """The plan turning ``recorded`` (+ ``observed`` states by machine id) into ``desired``.

    ``desired`` is (name, recorded-form spec) in definition order. Without ``recreate``, identity/creation-time
    changes and removals land in ``blocked`` (and also appear as steps so the user sees the whole plan).
    """
    by_name = {r.name: r for r in recorded}
    steps: list[Step] = []
    blocked: list[Step] = []
    for name, spec in desired:
        record = by_name.get(name)
        if record is None:
            steps.append(Step("create", name, None, "new machine"))
            continue
        state = observed.get(record.machine_id, "missing")
        changes = diff_specs(record.spec, spec)
        if state == "missing":
            # Nothing exists to lose: (re)create it as defined now, keeping the Machine's id.
            reason = "missing from its driver (deleted outside vz, or an interrupted vz up)"
            if changes:
                reason += "; definition changed: " + "; ".join(c.describe() for c in changes)
            steps.append(Step("create", name, record.machine_id, reason, changes))
        elif changes:
            reason = "; ".join(c.describe() for c in changes)
            step = Step("recreate", name, record.machine_id, reason, changes)
            steps.append(step)
            if not recreate:
                blocked.append(step)
        elif state == "stopped":
            steps.append(Step("start", name, record.machine_id, "stopped"))
        elif record.state != "running":
            steps.append(Step("keep", name, record.machine_id, f"running (record said {record.state}: adopting it)"))
        else:
            steps.append(Step("keep", name, record.machine_id, "running, unchanged"))
    desired_names = {name for name, _ in desired}
    for record in sorted(recorded, key=lambda r: r.name):
        if record.name not in desired_names:
            step = Step("remove", record.name, record.machine_id, "no longer in vz.json (its data is discarded)")
            steps.append(step)
            if not recreate:
                blocked.append(step)
    default_change = None if recorded_default == desired_default else (recorded_default, desired_default)
    return Plan(tuple(steps), default_change, tuple(blocked))
