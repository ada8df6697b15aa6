"""The conformance adapter of the qemu driver: how the suite builds Machines and which commands it runs.

Machines of the embedded default image (busybox; see ``_busybox``), booted as virtual machines. qemu's declaration
names it (``vz_conformance.adapters.qemu:ADAPTER``), so ``vz-conformance run --driver qemu`` uses it without
``--adapter``.
"""

from __future__ import annotations

from vz_conformance.adapters._busybox import BusyboxAdapter

__all__ = ["ADAPTER", "QemuAdapter"]


class QemuAdapter(BusyboxAdapter):
    """Defaults for Machines of the embedded default image, booted as virtual machines."""


ADAPTER = QemuAdapter()
