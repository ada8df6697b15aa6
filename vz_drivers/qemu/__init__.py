"""qemu: Linux Machines as QEMU virtual machines (KVM where it can run the guest kernel, otherwise TCG).

::

    from vz_drivers.qemu import QemuDriver
    driver = QemuDriver(state_dir="/var/lib/vz/qemu", accelerator="auto")

``cleanup_state(state_dir)`` removes every Machine (its VM included) and volume a state directory owns (tests,
uninstall). The driver code is imported on first use, so importing this package stays cheap. See
docs/drivers/qemu.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vz_drivers._lazy import lazy_exports

if TYPE_CHECKING:
    from vz_drivers.qemu._driver import QemuDriver

__all__ = ["DRIVER_NAME", "QemuDriver", "cleanup_state"]

DRIVER_NAME = "qemu"

__getattr__, cleanup_state = lazy_exports(__name__, "vz_drivers.qemu._driver", ("QemuDriver",))
