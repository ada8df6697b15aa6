"""Saved running state of a Machine: what a driver reports when it saves one and when it tries to resume it.

Plain values shared by drivers, the plugin server and client and the Environment layer (no protobuf), for the
``vz.machine.v1`` RPCs ``SaveState`` and ``RestoreState``. A driver that can save a Machine's state has the
methods ``save_state(workspace_id) -> SavedState`` and ``restore_state(workspace_id) -> RestoreOutcome`` and
answers ``Extensions.save_state = True``. ``restore_state`` never half-restores: a state it cannot use is
discarded, the Machine stays stopped with its disk kept and ``RestoreOutcome.reason`` says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["NO_SAVED_STATE", "RestoreOutcome", "SavedState", "StateSaver"]

NO_SAVED_STATE = "the Machine has no saved state"
"""``RestoreOutcome.reason`` when nothing was saved (or the state was discarded by a later Start)."""


@dataclass(frozen=True)
class SavedState:
    """A Machine's saved running state (``vz.machine.v1.SavedState``)."""

    saved_at: str
    """RFC 3339, UTC."""
    size_bytes: int
    """Bytes the state uses on the driver's host."""
    path: str = ""
    """Absolute path of the state file on the driver's host; "" when the state is not one host file."""


@dataclass(frozen=True)
class RestoreOutcome:
    """What ``restore_state`` did (``vz.machine.v1.RestoreStateResponse``)."""

    restored: bool
    """The Machine runs again from its saved state."""
    reason: str = ""
    """When not restored: why. The Machine is stopped, its disk kept and the state discarded."""


@runtime_checkable
class StateSaver(Protocol):
    """A driver that saves and resumes Machines' running state."""

    async def save_state(self, workspace_id: str) -> SavedState: ...

    async def restore_state(self, workspace_id: str) -> RestoreOutcome: ...
