"""The records the state store returns, and how each is read from its row (a row that cannot be read is a
``BadRecord``, which the store reports as a damaged database)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BadRecord",
    "EnvironmentRecord",
    "MachineRecord",
    "OperationRecord",
    "VolumeRecord",
    "env_record",
    "machine_record",
    "operation_record",
    "volume_record",
]


@dataclass(frozen=True)
class EnvironmentRecord:
    env_id: str
    project_id: str
    name: str
    state: str
    """creating | running | stopped | deleting | failed"""
    worktree: str
    """The project directory the Environment was created from (its workspace source)."""
    default_machine: str | None
    created_at: str
    updated_at: str

    def label(self) -> str:
        return f"{self.name} ({self.env_id})"


@dataclass(frozen=True)
class MachineRecord:
    env_id: str
    machine_id: str
    name: str
    workspace_id: str
    driver: str
    spec: dict[str, Any]
    """The Machine's definition as last applied (secret references only)."""
    state: str
    """creating | running | stopped | deleting | failed"""
    created_at: str
    updated_at: str

    def label(self) -> str:
        return f"{self.name} ({self.machine_id})"

    @property
    def driver_options(self) -> dict[str, Any]:
        options = self.spec.get("driver_options") or {}
        return dict(options) if isinstance(options, dict) else {}


@dataclass(frozen=True)
class VolumeRecord:
    env_id: str
    machine_id: str
    name: str
    backend_name: str
    """The volume's name in its driver (the Mount source vz sent)."""
    created_at: str
    project_id: str = ""
    driver: str = ""
    driver_options: dict[str, Any] = field(default_factory=dict)
    state: str = "attached"
    """attached (its Machine's record exists) | kept (its Environment or Machine was deleted without it)"""

    def label(self) -> str:
        return self.backend_name


@dataclass(frozen=True)
class OperationRecord:
    op_id: str
    env_id: str
    project_id: str
    kind: str
    status: str
    """running | succeeded | failed | interrupted"""
    pid: int
    step: str
    plan: Any
    error: str
    started_at: str
    finished_at: str | None


def env_record(row: sqlite3.Row) -> EnvironmentRecord:
    return EnvironmentRecord(**{k: row[k] for k in row.keys()})


class BadRecord(Exception):
    pass


def machine_record(row: sqlite3.Row) -> MachineRecord:
    data = {k: row[k] for k in row.keys()}
    try:
        spec = json.loads(data["spec"])
    except (TypeError, ValueError, RecursionError):
        spec = None
    if not isinstance(spec, dict):
        raise BadRecord(f"machine {data['name']!r} of Environment {data['env_id']}: its spec is not a JSON object")
    data["spec"] = spec
    return MachineRecord(**data)


def volume_record(row: sqlite3.Row) -> VolumeRecord:
    data = {k: row[k] for k in row.keys()}
    try:
        options = json.loads(data.get("driver_options") or "{}")
    except (TypeError, ValueError, RecursionError):
        options = {}
    data["driver_options"] = options if isinstance(options, dict) else {}
    return VolumeRecord(**data)


def operation_record(row: sqlite3.Row) -> OperationRecord:
    data = {k: row[k] for k in row.keys()}
    try:
        data["plan"] = json.loads(data["plan"]) if data["plan"] else None
    except (TypeError, ValueError, RecursionError):
        data["plan"] = None  # the plan is history for people; an unreadable one is shown as absent
    return OperationRecord(**data)
