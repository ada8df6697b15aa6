"""The qemu driver's part of RunImage validation (root disk size, security options, mount points inside the
image); the shared part (mounts, users, resources, labels) is ``vz_drivers._machine.validate_common``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vz_core import RunImageRequest
from vz_core.errors import InvalidArgumentError, UnsupportedError
from vz_drivers._machine import CommonRequest, Rules, validate_common

__all__ = [
    "MAX_DISK_BYTES",
    "MAX_MOUNTS",
    "MIN_MEMORY_BYTES",
    "HostLimits",
    "guest_path",
    "rules_for",
    "validate_request",
]

MIN_MEMORY_BYTES = 192 * 1024 * 1024
"""The kernel, the unpacked initramfs and the agent need about 128 MiB; below this a guest may not boot."""
MAX_DISK_BYTES = 16 * 1024**4
"""ext4 with 4 KiB blocks (the root disk) tops out at 16 TiB."""
MAX_MOUNTS = 24
"""Each share is a PCI device; q35's root bus has 32 slots and some are taken."""
_TMPFS_OPTIONS = (
    r"size=[0-9]+[kKmMgG%]?|nr_inodes=[0-9]+[kKmMgG]?|mode=[0-7]{3,4}|noexec|exec|nosuid|suid|nodev|dev|ro|rw"
)
_SECURITY_OK = frozenset({"seccomp=unconfined", "apparmor=unconfined", "label=disable", "label:disable"})


@dataclass(frozen=True)
class HostLimits:
    """What this host can give one Machine."""

    cpus: int
    memory_bytes: int


def rules_for(limits: HostLimits) -> Rules:
    return Rules(
        display="the qemu driver",
        architecture="amd64",
        cpus=limits.cpus,
        memory_bytes=limits.memory_bytes,
        min_memory_bytes=MIN_MEMORY_BYTES,
        route_domains=True,
        min_memory_why="192 MiB a virtual machine needs",
        profiles=("developer",),
        platform_hint=" (qemu-system-x86_64)",
        userns_hint=": a Machine is a whole virtual machine",
        reserved_why="belongs to the Machine's kernel",
        bind_dirs_only=True,
        max_mounts=MAX_MOUNTS,
        tmpfs_options=_TMPFS_OPTIONS,
    )


def guest_path(rootfs: Path, target: str) -> str:
    """``target`` with symlinks resolved as they would be inside ``rootfs`` (never leaving it).

    Mount points are created by the guest init under ``/mnt/root``; resolving the image's symlinks here keeps a
    link such as ``/var/run -> /run`` pointing inside the Machine rather than into the initramfs.
    """
    parts = [p for p in target.split("/") if p and p != "."]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = rootfs.joinpath(*resolved, part)
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise InvalidArgumentError(f"mount target {target!r} goes through a symlink loop in the image")
            link = os.readlink(candidate)
            if link.startswith("/"):
                resolved = []
            parts = [p for p in link.split("/") if p and p != "."] + parts
            continue
        resolved.append(part)
    return "/" + "/".join(resolved)


def validate_request(request: RunImageRequest, limits: HostLimits) -> CommonRequest:
    """Check everything that needs no image; raise InvalidArgumentError/UnsupportedError naming the field."""
    valid = validate_common(request, rules_for(limits))
    for opt in request.security_opt:
        if opt.strip() not in _SECURITY_OK:
            raise UnsupportedError(
                f"security_opt {opt!r} is not supported by the qemu driver (a Machine is a virtual machine; "
                "accepted: seccomp=unconfined, apparmor=unconfined, label=disable)",
                details={"field": "security_opt"},
            )
    if valid.storage_bytes > MAX_DISK_BYTES:
        raise InvalidArgumentError(
            f"host_requirements.storage_bytes={valid.storage_bytes} is more than a root disk can hold "
            f"({MAX_DISK_BYTES} bytes)",
            details={"field": "host_requirements.storage_bytes"},
        )
    return valid
