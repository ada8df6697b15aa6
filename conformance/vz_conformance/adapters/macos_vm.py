"""The conformance adapter of macos_vm: macOS guests, whose userland is BSD (no /proc, BSD ``stat`` and ``ps``).

macos_vm's declaration names it (``vz_conformance.adapters.macos_vm:ADAPTER``). Machines need at least the base
image's minimum (often 2 CPUs and 4 GiB) and memory in whole MiB; their disk is a clone of the base, so a storage
size is refused (the suite records that refusal). The image comes from ``--image`` or defaults to the stable base.
"""

from __future__ import annotations

from collections.abc import Sequence

from vz_conformance import Adapter

__all__ = ["ADAPTER", "MacosVmAdapter"]


class MacosVmAdapter(Adapter):
    """Defaults for Machines of a macOS base image."""

    image = "macos:stable"
    local_dir = "/var/tmp"
    exec_workdir = "/tmp"
    exec_user = "nobody"
    identity_users = ("daemon", "nobody")
    mount_target_prefix = "/Users/Shared/vz-conformance"
    resource_request = (4, 8 * 1024 * 1024 * 1024)

    def find_processes(self, pids: Sequence[int], marker: str) -> tuple[str, ...]:
        # No /proc: ps gives each live pid's start time (one token: lstart with "_" for spaces) and the command
        # lines to search for the marker (split in two so this command does not match itself).
        head, tail = marker[: len(marker) // 2], marker[len(marker) // 2 :]
        script = (
            'for p in $1; do s=$(ps -o lstart= -p "$p" 2>/dev/null | tr -s " " _); '
            '[ -n "$s" ] && echo "$p $s"; done; '
            'm="$2$3"; ps -axo pid=,command= | while read -r pid cmd; do '
            'case "$cmd" in *"$m"*) echo "marker $pid";; esac; done; true'
        )
        return ("sh", "-c", script, "sh", " ".join(str(p) for p in pids), head, tail)

    def owner_of(self, path: str) -> tuple[str, ...]:
        return ("stat", "-f", "%Su", path)

    def cpu_count(self) -> tuple[str, ...]:
        return ("sysctl", "-n", "hw.ncpu")

    def mem_total_kib(self) -> tuple[str, ...]:
        return ("sh", "-c", "echo $(( $(sysctl -n hw.memsize) / 1024 ))")


ADAPTER = MacosVmAdapter()
