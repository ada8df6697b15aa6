"""The macos_vm driver: macOS Machines on Apple silicon through Virtualization.framework (PyObjC).

Status: DEV. Written against Virtualization.framework's documented API and tested here (Linux) as far as a
host without the framework allows: the VM configuration plan, the base-pin policy, the clone and VM-state
logic against a stand-in object model, the launchd provisioning; not verified on a Mac. On any other host
Info answers and Preflight fails with ``UnsupportedError`` naming the reason; RunImage fails the same way
before anything is created. A macOS Machine never advertises Docker and never gets a Linux sidecar.
``cleanup_state(state_dir)`` removes every Machine and volume a state directory owns (tests, uninstall). The
driver code is imported on first use, so importing this package (and its registration) stays cheap.
See docs/drivers/macos_vm.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vz_drivers._lazy import lazy_exports

if TYPE_CHECKING:
    from vz_drivers.macos_vm._backend import STATUS, MacosVmDriver

__all__ = ["STATUS", "MacosVmDriver", "cleanup_state"]

__getattr__, cleanup_state = lazy_exports(__name__, "vz_drivers.macos_vm._backend", ("MacosVmDriver", "STATUS"))
