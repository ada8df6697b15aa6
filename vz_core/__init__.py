"""vz core: the host, the Driver contract, and everything shared.

Public surface for driver authors: the ``Driver`` base class, the plain values it speaks, and the error tree
(``vz_core.errors``). Nothing here exposes protobuf types.
"""

from __future__ import annotations

# Not `from typing import TYPE_CHECKING`: importing typing costs milliseconds `vz exec` does not have. Type
# checkers treat a name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from vz_core._driver import Driver
    from vz_core._types import (
        API_MAJOR,
        API_MINOR,
        ARCHITECTURES,
        MAX_CHUNK,
        MAX_WINDOW,
        TERMINAL_COLS,
        TERMINAL_ROWS,
        TERMINAL_TERM,
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
        TerminalData,
        TerminalEof,
        TerminalEvent,
        TerminalInput,
        TerminalOutput,
        TerminalResize,
        TerminalSpec,
    )

__all__ = [
    "API_MAJOR",
    "API_MINOR",
    "ARCHITECTURES",
    "MAX_CHUNK",
    "MAX_WINDOW",
    "TERMINAL_COLS",
    "TERMINAL_ROWS",
    "TERMINAL_TERM",
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
    "TerminalData",
    "TerminalEof",
    "TerminalEvent",
    "TerminalInput",
    "TerminalOutput",
    "TerminalResize",
    "TerminalSpec",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use (PEP 562): every `vz` command imports this package first, and `vz exec`'s budget has
    # no room for the dataclass machinery behind these names.
    if name == "Driver":
        from vz_core._driver import Driver

        return Driver
    if name in __all__:
        from vz_core import _types

        return getattr(_types, name)
    raise AttributeError(f"module 'vz_core' has no attribute {name!r}")
