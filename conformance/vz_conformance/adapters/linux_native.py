"""The conformance adapter of linux_native: how the suite builds Machines and which commands it runs.

Machines of the embedded default image (busybox; see ``_busybox``). linux_native's declaration names it
(``vz_conformance.adapters.linux_native:ADAPTER``), so ``vz-conformance run --driver linux_native`` uses it
without ``--adapter``.
"""

from __future__ import annotations

from vz_conformance.adapters._busybox import BusyboxAdapter

__all__ = ["ADAPTER", "LinuxNativeAdapter"]


class LinuxNativeAdapter(BusyboxAdapter):
    """Defaults for runc Machines of the embedded default image."""


ADAPTER = LinuxNativeAdapter()
