"""The reference fake driver: Machines are directories, commands are host processes, faults on request.

``FakeDriver`` is the first test double of vz and the reference the conformance suite is tested against:
it passes the suite, and each of its fault modes (``FAULT_MODES``) breaks exactly one rule. Run it as a
plugin with ``vz-driver-fake [--state-dir DIR] [--fault NAME ...]``.

The driver code is imported on first use, so importing the registration module stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vz_conformance.fake._faults import FAULT_DESCRIPTIONS, FAULT_MODES

if TYPE_CHECKING:
    from vz_conformance.fake._driver import FakeDriver

__all__ = ["FAULT_DESCRIPTIONS", "FAULT_MODES", "FakeDriver"]


def __getattr__(name: str) -> Any:
    if name == "FakeDriver":
        from vz_conformance.fake._driver import FakeDriver

        return FakeDriver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
