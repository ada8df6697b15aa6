"""vz core: the host, the Driver contract, and everything shared.

Public surface for driver authors: the ``Driver`` base class, the plain values it speaks, and the error tree
(``vz_core.errors``). Nothing here exposes protobuf types.
"""

from __future__ import annotations

from vz_core._driver import Driver
from vz_core._types import (
    API_MAJOR,
    API_MINOR,
    ARCHITECTURES,
    MAX_CHUNK,
    Capabilities,
    DriverInfo,
    EgressPolicy,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecSpec,
    Extensions,
    GpuRequirement,
    HostRequirements,
    MachineConfig,
    MachineDetails,
    MachineMount,
    MachineState,
    Mount,
    MountType,
    RecreateMode,
    RunImageRequest,
)

__all__ = [
    "API_MAJOR",
    "API_MINOR",
    "ARCHITECTURES",
    "MAX_CHUNK",
    "Capabilities",
    "Driver",
    "DriverInfo",
    "EgressPolicy",
    "ExecEvent",
    "ExecExit",
    "ExecOutput",
    "ExecSpec",
    "Extensions",
    "GpuRequirement",
    "HostRequirements",
    "MachineConfig",
    "MachineDetails",
    "MachineMount",
    "MachineState",
    "Mount",
    "MountType",
    "RecreateMode",
    "RunImageRequest",
]
