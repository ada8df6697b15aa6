"""qemu: Linux Machines as QEMU virtual machines (KVM where it can run the guest kernel, otherwise TCG).

::

    from vz_drivers.qemu import QemuDriver
    driver = QemuDriver(state_dir="/var/lib/vz/qemu", accelerator="auto")

``cleanup_state(state_dir)`` removes every Machine and volume a state directory owns (tests, uninstall). The
driver code is imported on first use, so importing this package stays cheap. See docs/drivers/qemu.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vz_drivers.qemu._driver import QemuDriver

__all__ = ["DRIVER_NAME", "QemuDriver", "cleanup_state"]

DRIVER_NAME = "qemu"


async def cleanup_state(state_dir: str, **options: Any) -> None:
    """Delete every Machine recorded under ``state_dir`` (its VM included) and every volume."""
    from vz_drivers.qemu._driver import QemuDriver

    driver = QemuDriver(state_dir=state_dir, **options)
    await driver.remove_everything()


def __getattr__(name: str) -> Any:
    if name == "QemuDriver":
        from vz_drivers.qemu._driver import QemuDriver

        return QemuDriver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
