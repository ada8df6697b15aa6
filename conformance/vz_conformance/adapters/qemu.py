"""The conformance adapter of the qemu driver: how the suite builds Machines and which commands it runs.

The embedded default image is busybox (Debian's busybox-static): no ``printenv`` and no ``getconf``, users root,
``dev`` and ``nobody``. qemu's declaration names it (``vz_conformance.adapters.qemu:ADAPTER``), so
``vz-conformance run --driver qemu`` uses it without ``--adapter``.
"""

from __future__ import annotations

from vz_conformance import Adapter

__all__ = ["ADAPTER", "QemuAdapter"]


class QemuAdapter(Adapter):
    """Defaults for Machines of the embedded default image, booted as virtual machines."""

    identity_users = ("dev", "nobody")

    def print_env(self, name: str) -> tuple[str, ...]:
        # printenv semantics with shell builtins: the value and a newline, exit 1 when unset.
        script = 'eval "[ -n \\"\\${$1+set}\\" ]" || exit 1; eval "printf \'%s\\n\' \\"\\${$1}\\""'
        return ("sh", "-c", script, "sh", name)

    def cpu_count(self) -> tuple[str, ...]:
        # busybox nproc: the CPUs the guest kernel has online.
        return ("nproc",)


ADAPTER = QemuAdapter()
