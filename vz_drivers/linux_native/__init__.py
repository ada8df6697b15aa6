"""linux_native: Linux Machines on a Linux host, run by runc with their own namespaces and cgroups.

::

    from vz_drivers.linux_native import LinuxNativeDriver
    driver = LinuxNativeDriver(state_dir="/var/lib/vz/linux_native")

``cleanup_state(state_dir)`` removes every Machine, volume, cgroup and NAT table a state directory owns (tests,
uninstall). The driver code is imported on first use, so importing this package stays cheap.
See docs/drivers/linux_native.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vz_drivers.linux_native._driver import LinuxNativeDriver

__all__ = ["DRIVER_NAME", "LinuxNativeDriver", "cleanup_state"]

DRIVER_NAME = "linux_native"


async def cleanup_state(state_dir: str, **options: Any) -> None:
    """Delete every Machine recorded under ``state_dir`` and everything the host holds for them."""
    from vz_drivers.linux_native._driver import LinuxNativeDriver

    driver = LinuxNativeDriver(state_dir=state_dir, **options)
    await driver.remove_everything()


def __getattr__(name: str) -> Any:
    if name == "LinuxNativeDriver":
        from vz_drivers.linux_native._driver import LinuxNativeDriver

        return LinuxNativeDriver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
