"""hyperv: Linux Machines on Windows as Hyper-V Generation 2 virtual machines. Status: DEV.

::

    from vz_drivers.hyperv import HypervDriver
    driver = HypervDriver(switch="Default Switch")

On any host but Windows, Info answers and Preflight says why Hyper-V cannot run here; nothing is touched. The
driver code is imported on first use, so importing this package stays cheap. See docs/drivers/hyperv.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vz_drivers.hyperv._driver import HypervDriver

__all__ = ["DRIVER_NAME", "HypervDriver"]

DRIVER_NAME = "hyperv"
_LAZY = {"HypervDriver": "vz_drivers.hyperv._driver"}


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
