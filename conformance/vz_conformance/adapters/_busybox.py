"""The adapter base of Machines of vz's embedded default image: busybox (Debian's busybox-static).

It has no ``printenv`` and no ``getconf``; everything else of the suite's default command set is there. Its users
are root, ``dev`` and ``nobody``.
"""

from __future__ import annotations

from vz_conformance import Adapter

__all__ = ["BusyboxAdapter"]


class BusyboxAdapter(Adapter):
    """Defaults for Machines of the embedded default image."""

    identity_users = ("dev", "nobody")

    def print_env(self, name: str) -> tuple[str, ...]:
        # printenv semantics with shell builtins: the value and a newline, exit 1 when unset.
        script = 'eval "[ -n \\"\\${$1+set}\\" ]" || exit 1; eval "printf \'%s\\n\' \\"\\${$1}\\""'
        return ("sh", "-c", script, "sh", name)

    def cpu_count(self) -> tuple[str, ...]:
        # busybox nproc counts the CPUs the Machine may run on (its cpuset, or the guest kernel's online CPUs).
        return ("nproc",)
