"""The conformance adapter of linux_native: how the suite builds Machines and which commands it runs.

The embedded default image is busybox (Debian's busybox-static), which has no ``printenv`` and no ``getconf``;
everything else of the suite's default command set is there. Its users are root, ``dev`` and ``nobody``.
linux_native's declaration names it (``vz_conformance.adapters.linux_native:ADAPTER``), so
``vz-conformance run --driver linux_native`` uses it without ``--adapter``.
"""

from __future__ import annotations

from vz_conformance import Adapter

__all__ = ["ADAPTER", "LinuxNativeAdapter"]


class LinuxNativeAdapter(Adapter):
    """Defaults for Machines of the embedded default image."""

    identity_users = ("dev", "nobody")

    def print_env(self, name: str) -> tuple[str, ...]:
        # printenv semantics with shell builtins: the value and a newline, exit 1 when unset.
        script = 'eval "[ -n \\"\\${$1+set}\\" ]" || exit 1; eval "printf \'%s\\n\' \\"\\${$1}\\""'
        return ("sh", "-c", script, "sh", name)

    def cpu_count(self) -> tuple[str, ...]:
        # busybox nproc counts the CPUs the Machine may run on (its cpuset).
        return ("nproc",)


ADAPTER = LinuxNativeAdapter()
