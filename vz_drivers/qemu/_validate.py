"""Validation of a RunImage request: everything that can be checked before the image is resolved, and nothing
is touched until it passed."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from vz_core import GpuRequirement, MountType, RunImageRequest
from vz_core.errors import InvalidArgumentError, UnsupportedError
from vz_drivers.qemu._state import MountRecord

__all__ = [
    "MAX_DISK_BYTES",
    "MAX_MOUNTS",
    "MIN_MEMORY_BYTES",
    "HostLimits",
    "ValidRequest",
    "check_workspace_id",
    "guest_path",
    "validate_request",
]

MIN_MEMORY_BYTES = 192 * 1024 * 1024
"""The kernel, the unpacked initramfs and the agent need about 128 MiB; below this a guest may not boot."""
MAX_DISK_BYTES = 16 * 1024**4
"""ext4 with 4 KiB blocks (the root disk) tops out at 16 TiB."""
MAX_MOUNTS = 24
"""Each share is a PCI device; q35's root bus has 32 slots and some are taken."""
PROFILES = ("developer",)
EGRESS = ("allow", "deny")
_VOLUME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_ENV_KEY_RE = re.compile(r"^[^=\x00]+$")
_USER_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}\$?$")
_RESERVED_TARGETS = ("/proc", "/sys", "/dev")
_BIND_OPTIONS = frozenset({"ro", "rw", "bind", "rbind", "cached", "delegated", "consistent", "z", "Z"})
_TMPFS_OPTION_RE = re.compile(
    r"^(size=[0-9]+[kKmMgG%]?|nr_inodes=[0-9]+[kKmMgG]?|mode=[0-7]{3,4}|noexec|exec|nosuid|suid|nodev|dev|ro|rw)$"
)
_SECURITY_OK = frozenset({"seccomp=unconfined", "apparmor=unconfined", "label=disable", "label:disable"})


@dataclass(frozen=True)
class HostLimits:
    """What this host can give one Machine."""

    cpus: int
    memory_bytes: int


@dataclass(frozen=True)
class ValidRequest:
    """The request's settings after validation and normalization (image-independent parts)."""

    labels: dict[str, str]
    egress: str
    cpus: int
    memory_bytes: int
    storage_bytes: int
    mounts: tuple[MountRecord, ...]


def check_workspace_id(workspace_id: str) -> None:
    if not workspace_id:
        raise InvalidArgumentError("workspace_id must not be empty", details={"field": "workspace_id"})
    if "\x00" in workspace_id:
        raise InvalidArgumentError("workspace_id must not contain NUL characters", details={"field": "workspace_id"})


def _bad(message: str, field: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, details={"field": field})


def check_user_syntax(user: str, *, field: str) -> None:
    """Reject malformed ``user[:group]`` strings."""
    if not user:
        return
    name, _, group = user.partition(":")
    if not name:
        raise _bad(f"{field} {user!r} has an empty user name; use 'name', 'uid', 'name:group' or 'uid:gid'", field)
    for part, what in ((name, "user"), (group, "group")):
        if part and not (part.isdigit() or _USER_RE.match(part)):
            raise _bad(f"{field} {user!r} is not a valid {what}; use letters, digits, '_', '.', '-' or a number", field)


def _check_target(target: str, field: str) -> str:
    if not target or not target.startswith("/"):
        raise _bad(f"{field} target {target!r} must be an absolute path inside the Machine", field)
    if "\x00" in target or any(part == ".." for part in target.split("/")):
        raise _bad(f"{field} target {target!r} must not contain '..' components or NUL characters", field)
    norm = posixpath.normpath(target)
    if norm == "/":
        raise _bad(f"{field} target must not be the root directory '/'", field)
    for reserved in _RESERVED_TARGETS:
        if norm == reserved or norm.startswith(reserved + "/"):
            raise _bad(f"{field} target {target!r} is reserved ({reserved} belongs to the Machine's kernel)", field)
    return norm


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


def validate_request(request: RunImageRequest, limits: HostLimits) -> ValidRequest:
    """Check everything that needs no image; raise InvalidArgumentError/UnsupportedError naming the field."""
    check_workspace_id(request.workspace_id)
    if not request.image:
        raise _bad("image must not be empty; give an image reference such as 'vz:default'", "image")
    if request.platform:
        parts = request.platform.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise _bad(f"platform {request.platform!r} must look like 'linux/amd64'", "platform")
        if parts[0] != "linux" or parts[1] != "amd64":
            raise UnsupportedError(
                f"platform {request.platform!r} cannot run here: the qemu driver runs linux/amd64 Machines "
                "(qemu-system-x86_64)",
                details={"field": "platform"},
            )
    if request.userns or request.uid_map or request.gid_map:
        raise UnsupportedError(
            "user namespaces (userns, uid_map, gid_map) are not supported by the qemu driver: a Machine is a whole "
            "virtual machine; leave them empty",
            details={"field": "userns"},
        )
    labels = request.label_map()
    profile = labels.get("vz.profile", "developer")
    if profile not in PROFILES:
        raise UnsupportedError(
            f"label vz.profile={profile!r} is not supported by the qemu driver (supported: {', '.join(PROFILES)})",
            details={"field": "labels"},
        )
    egress = labels.get("vz.egress", "allow")
    if egress not in EGRESS:
        raise _bad(f"label vz.egress={egress!r} is unknown; use one of {', '.join(EGRESS)}", "labels")
    for name in request.environment:
        if not _ENV_KEY_RE.match(name):
            raise _bad(f"environment variable name {name!r} must be non-empty without '=' or NUL", "environment")
    for value in request.environment.values():
        if "\x00" in value:
            raise _bad("environment values must not contain NUL characters", "environment")
    check_user_syntax(request.user, field="user")
    check_user_syntax(request.remote_user, field="remote_user")
    for opt in request.security_opt:
        if opt.strip() not in _SECURITY_OK:
            raise UnsupportedError(
                f"security_opt {opt!r} is not supported by the qemu driver (a Machine is a virtual machine; "
                "accepted: seccomp=unconfined, apparmor=unconfined, label=disable)",
                details={"field": "security_opt"},
            )

    hr = request.host_requirements
    cpus = hr.cpus if hr else 0
    memory = hr.memory_bytes if hr else 0
    storage = hr.storage_bytes if hr else 0
    if cpus < 0:
        raise _bad(f"host_requirements.cpus={cpus} must not be negative", "host_requirements.cpus")
    if cpus > limits.cpus:
        raise _bad(
            f"host_requirements.cpus={cpus} is more than this host offers ({limits.cpus} CPUs); ask for at most "
            f"{limits.cpus}",
            "host_requirements.cpus",
        )
    if memory and memory < MIN_MEMORY_BYTES:
        raise _bad(
            f"host_requirements.memory_bytes={memory} is below the minimum of {MIN_MEMORY_BYTES} bytes (192 MiB) a "
            "virtual machine needs",
            "host_requirements.memory_bytes",
        )
    if memory > limits.memory_bytes:
        raise _bad(
            f"host_requirements.memory_bytes={memory} is more than this host has ({limits.memory_bytes} bytes)",
            "host_requirements.memory_bytes",
        )
    if storage > MAX_DISK_BYTES:
        raise _bad(
            f"host_requirements.storage_bytes={storage} is more than a root disk can hold ({MAX_DISK_BYTES} bytes)",
            "host_requirements.storage_bytes",
        )
    if hr and hr.gpu == GpuRequirement.REQUIRED:
        raise UnsupportedError("GPUs are not passed to qemu Machines", details={"field": "host_requirements.gpu"})

    mounts: list[MountRecord] = []
    targets: set[str] = set()
    all_mounts = request.all_mounts()
    if len(all_mounts) > MAX_MOUNTS:
        raise _bad(f"{len(all_mounts)} mounts requested; a qemu Machine takes at most {MAX_MOUNTS}", "mounts")
    for index, mount in enumerate(all_mounts):
        field = "workspace_mount" if (request.workspace_mount is not None and index == 0) else f"mounts[{index}]"
        if mount.type not in (MountType.BIND, MountType.VOLUME, MountType.TMPFS):
            raise UnsupportedError(
                f"{field} has mount type {mount.type!r}, which the qemu driver does not support (bind, volume, tmpfs)",
                details={"field": field},
            )
        target = _check_target(mount.target, field)
        if target in targets:
            raise _bad(f"{field} target {target!r} is used by two mounts", field)
        targets.add(target)
        ro = mount.read_only or "ro" in mount.options
        if mount.type == MountType.BIND:
            for opt in mount.options:
                if opt not in _BIND_OPTIONS:
                    raise _bad(f"{field} bind option {opt!r} is not supported", field)
            if not mount.source or not os.path.isabs(mount.source) or "\x00" in mount.source:
                raise _bad(f"{field} source {mount.source!r} must be an absolute host path", field)
            source = Path(mount.source)
            if not source.is_dir():
                what = (
                    "is not a directory (the qemu driver shares directories)" if source.exists() else "does not exist"
                )
                raise _bad(f"{field} source {mount.source!r} {what} on the host", field)
            mounts.append(MountRecord("bind", mount.source, target, ro, str(source.resolve()), ()))
        elif mount.type == MountType.VOLUME:
            if not _VOLUME_RE.match(mount.source):
                raise _bad(
                    f"{field} volume name {mount.source!r} must be 1-128 of letters, digits, '_', '.', '-' "
                    "starting with a letter or digit",
                    field,
                )
            for opt in mount.options:
                if opt not in ("ro", "rw", "nocopy"):
                    raise _bad(f"{field} volume option {opt!r} is not supported", field)
            mounts.append(MountRecord("volume", mount.source, target, ro, "", ()))
        else:
            for opt in mount.options:
                if not _TMPFS_OPTION_RE.match(opt):
                    raise _bad(f"{field} tmpfs option {opt!r} is not supported (size=, mode=, noexec, ...)", field)
            opts = tuple(o for o in mount.options if o not in ("ro", "rw"))
            mounts.append(MountRecord("tmpfs", "", target, ro, "", opts))
    return ValidRequest(
        labels=labels, egress=egress, cpus=cpus, memory_bytes=memory, storage_bytes=storage, mounts=tuple(mounts)
    )
