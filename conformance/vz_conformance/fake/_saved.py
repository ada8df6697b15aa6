"""The fake's saved running state: a Machine's processes frozen in place, and a state file naming them.

A real driver writes the memory of its Machine to a file; the fake's Machines are host processes, so their
memory stays where it is: ``freeze`` stops every process group of the Machine (SIGSTOP) and ``write_state``
records which groups they are (leader pid and start time, so a reused pid is never taken for one) with the
Machine's id, sealed by a SHA-256 digest of the rest. ``read_state`` refuses a file that is not exactly such a
record for this Machine (corrupt, foreign, another Machine's, groups that no longer exist) with the reason;
``thaw`` lets the groups run on (SIGCONT). ``kill_saved`` ends them when the state is discarded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "STATE_NAME",
    "Group",
    "StateProblem",
    "freeze",
    "kill_saved",
    "read_state",
    "remove_state",
    "thaw",
    "write_state",
]

STATE_NAME = "saved-state.json"
_FORMAT = "vz-fake-saved-state/1"


class StateProblem(Exception):
    """The state file cannot be used; the message says why."""


@dataclass(frozen=True)
class Group:
    """A frozen process group: its leader's pid (= the group id) and start time."""

    pgid: int
    started: float


def identity(pid: int) -> Group | None:
    """The group led by ``pid`` as it is now, or None when that process is gone."""
    try:
        return Group(pid, psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return None


def freeze(groups: list[Group]) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group.pgid, signal.SIGSTOP)


def thaw(groups: list[Group]) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group.pgid, signal.SIGCONT)


def kill_saved(groups: list[Group]) -> None:
    """SIGKILL the frozen groups (those whose leader is still the process that was frozen)."""
    for group in groups:
        if identity(group.pgid) == group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group.pgid, signal.SIGKILL)


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_state(machine_dir: Path, machine_id: str, saved_at: str, groups: list[Group]) -> Path:
    """Write the state file atomically (temporary file, fsync, rename); its path."""
    body: dict[str, Any] = {
        "format": _FORMAT,
        "machine_id": machine_id,
        "saved_at": saved_at,
        "groups": [[g.pgid, g.started] for g in groups],
    }
    data = json.dumps({**body, "sha256": _digest(body)}, sort_keys=True).encode()
    path = machine_dir / STATE_NAME
    tmp = machine_dir / f".{STATE_NAME}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def raw_groups(machine_dir: Path) -> list[Group]:
    """The groups a state file names, without checking anything (to end them when it is discarded)."""
    try:
        data = json.loads((machine_dir / STATE_NAME).read_bytes())
        return [Group(int(pgid), float(started)) for pgid, started in data["groups"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def read_state(machine_dir: Path, machine_id: str) -> list[Group]:
    """The frozen groups of a valid state file for Machine ``machine_id``; ``StateProblem`` says why not."""
    path = machine_dir / STATE_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StateProblem("the Machine has no saved state") from None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        seal = data.pop("sha256")
    except (ValueError, KeyError, UnicodeDecodeError):
        raise StateProblem(f"the state file {path} is corrupt (not a sealed fake state record)") from None
    if seal != _digest(data):
        raise StateProblem(f"the state file {path} is corrupt (its SHA-256 seal does not match its content)")
    if data.get("format") != _FORMAT:
        raise StateProblem(f"the state file {path} is not in this driver's format ({_FORMAT})")
    if data.get("machine_id") != machine_id:
        raise StateProblem(f"the state file {path} belongs to another Machine (it was recreated since the save)")
    groups = [Group(int(pgid), float(started)) for pgid, started in data["groups"]]
    gone = [g.pgid for g in groups if identity(g.pgid) != g]
    if gone:
        raise StateProblem(
            f"the saved processes (groups {gone}) no longer exist (the host restarted, or they were killed)"
        )
    return groups


def remove_state(machine_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (machine_dir / STATE_NAME).unlink()
