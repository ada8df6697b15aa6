"""hostdir: an example vz driver whose Machines are directories on the host.

``HostdirDriver`` implements the Machine contract (``vz_core.Driver``); ``vz-driver-hostdir`` serves it as a
Runtime Protocol plugin (``vz_driver_hostdir.plugin``); ``vz_driver_hostdir.adapter`` tells the conformance
suite how to drive it.
"""

from __future__ import annotations

from vz_driver_hostdir._driver import IMAGE, VERSION, HostdirDriver

__version__ = VERSION
__all__ = ["IMAGE", "HostdirDriver", "__version__"]
