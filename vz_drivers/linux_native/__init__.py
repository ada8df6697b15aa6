"""linux_native: Linux Machines on a Linux host, run by runc with their own namespaces and cgroups.

::

    from vz_drivers.linux_native import LinuxNativeDriver
    driver = LinuxNativeDriver(state_dir="/var/lib/vz/linux_native")

``cleanup_state(state_dir)`` removes every Machine, volume, cgroup and NAT table a state directory owns (tests,
uninstall). The driver code is imported on first use, so importing this package stays cheap.
See docs/drivers/linux_native.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vz_drivers._lazy import lazy_exports

if TYPE_CHECKING:
    from vz_drivers.linux_native._driver import LinuxNativeDriver

__all__ = ["DRIVER_NAME", "LinuxNativeDriver", "cleanup_state"]

DRIVER_NAME = "linux_native"

__getattr__, cleanup_state = lazy_exports(__name__, "vz_drivers.linux_native._driver", ("LinuxNativeDriver",))
