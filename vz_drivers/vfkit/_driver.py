"""The vfkit driver: Linux Machines on macOS through vfkit (Apple's Virtualization.framework).

Status: DEV. Written against vfkit 0.6's documented interface and tested here (Linux) against that interface
(flag grammar, a stand-in REST server, a stand-in vfkit process in front of the real guest agent); not yet
verified on a Mac. The macOS CI lane (.github/workflows/macos.yml) is what turns it ACTIVE.

The Driver contract is the shared agent-Machine layer's (``vz_drivers._machine``); ``VfkitBackend`` supplies
what differs. Info always answers. On a host that is not macOS, or without vfkit, Preflight fails with the
reason (``UnsupportedError`` / ``UnavailableError``), and RunImage fails the same way before anything is
created; Find of a Machine that was never created answers "not found", so status works everywhere.
See docs/drivers/vfkit.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vz_core.errors import FailedPreconditionError
from vz_drivers._machine import AgentMachineDriver
from vz_drivers.vfkit._backend import DRIVER_NAME, STATUS, VfkitBackend
from vz_drivers.vfkit._records import VfkitPaths, VfkitRecord

__all__ = ["DRIVER_NAME", "STATUS", "VfkitDriver"]


class VfkitDriver(AgentMachineDriver[VfkitRecord, VfkitPaths]):
    """Linux Machines as vfkit virtual machines (macOS).

    Its options (types, defaults, bounds and help) are declared once, in ``vz_drivers.vfkit.registration``;
    ``VfkitDriver(options)`` takes the declaration's ``Options`` (or keyword values, checked the same way).
    """

    def __init__(self, options: Mapping[str, Any] | None = None, /, **raw: Any) -> None:
        self._vfkit = VfkitBackend(options, **raw)
        super().__init__(self._vfkit)

    @classmethod
    def _with_backend(cls, backend: VfkitBackend) -> VfkitDriver:
        """A driver over a given backend (tests that run a stand-in vfkit)."""
        driver = cls.__new__(cls)
        driver._vfkit = backend
        AgentMachineDriver.__init__(driver, backend)
        return driver

    async def vm_state(self, workspace_id: str) -> str:
        """vfkit's own state of a running Machine (REST ``GET /vm/state``); ``FailedPreconditionError`` when stopped."""
        record = self._require(workspace_id)
        if not self._alive(record):
            raise FailedPreconditionError(f"Machine {workspace_id!r} is stopped")
        return await self._vfkit.vm_state(record)
