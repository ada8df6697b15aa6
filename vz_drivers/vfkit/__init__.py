"""vfkit: Linux Machines on macOS through vfkit (Apple's Virtualization.framework). Status: DEV.

::

    from vz_drivers.vfkit import VfkitDriver
    driver = VfkitDriver(kernel="/path/Image", initrd="/path/initramfs.cpio.gz")

On any host but macOS, Info answers and Preflight says why vfkit cannot run here. The driver code is imported
on first use, so importing this package stays cheap. See docs/drivers/vfkit.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vz_drivers.vfkit._driver import VfkitDriver

__all__ = ["DRIVER_NAME", "VfkitDriver"]

DRIVER_NAME = "vfkit"


def __getattr__(name: str) -> Any:
    if name == "VfkitDriver":
        from vz_drivers.vfkit._driver import VfkitDriver

        return VfkitDriver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
