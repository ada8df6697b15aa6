"""Facts about this host that decide what the driver can do: CPUs, memory, cgroups, overlayfs, tools."""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from vz_core.rules import host_task_limit

__all__ = ["HostFacts", "host_facts", "read_meminfo"]

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def read_meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """``/proc/meminfo`` as a dict of kB values (keys without the colon)."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0])
    return out


def _cgroup_mode() -> str:
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return "v2"
    if (root / "unified").is_dir() and (root / "unified" / "cgroup.controllers").exists():
        return "hybrid"
    if (root / "memory").is_dir():
        return "v1"
    return "none"


def _overlay_supported() -> bool:
    try:
        return any(line.split()[-1] == "overlay" for line in Path("/proc/filesystems").read_text().splitlines())
    except OSError:
        return False


@dataclass(frozen=True)
class HostFacts:
    """What this host offers Machines."""

    architecture: str
    cpus: tuple[int, ...]
    """CPU numbers this process may run on (a Machine's cpuset is chosen among them)."""
    memory_bytes: int
    cgroup_mode: str
    """"v1", "hybrid" (v1 controllers plus a v2 mount) or "v2"."""
    overlayfs: bool
    nft: str
    """Path of ``nft`` or empty."""
    ip: str
    """Path of ``ip`` (iproute2) or empty."""
    nsenter: str
    is_root: bool
    swap_limit: bool = True
    """The memory controller can limit swap (cgroup v2, or v1 with swap accounting)."""
    task_limit: int | None = None
    """How many tasks the host can have at once (``vz_core.rules.host_task_limit``; None if unknown)."""


def host_facts() -> HostFacts:
    """Collect the facts (cheap: a few small /proc and /sys reads)."""
    machine = platform.machine().lower()
    return HostFacts(
        architecture=_ARCH.get(machine, machine),
        cpus=tuple(sorted(os.sched_getaffinity(0))),
        memory_bytes=read_meminfo().get("MemTotal", 0) * 1024,
        cgroup_mode=_cgroup_mode(),
        overlayfs=_overlay_supported(),
        nft=shutil.which("nft") or "",
        ip=shutil.which("ip") or "",
        nsenter=shutil.which("nsenter") or "",
        is_root=os.geteuid() == 0,
        swap_limit=_swap_limit(),
        task_limit=host_task_limit(),
    )


def _swap_limit() -> bool:
    if _cgroup_mode() == "v2":
        return True
    return Path("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()
