"""Validation of a RunImage request shared by agent-Machine drivers: everything that needs no image and no
backend, checked before anything is touched. A backend adds its own checks (profiles it enforces, storage,
capabilities) on top of ``CommonRequest``; ``Rules`` carries what differs between backends.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from vz_core import GpuRequirement, MountType, RunImageRequest
from vz_core.errors import InvalidArgumentError, UnsupportedError
from vz_core.rules import MAX_PIDS, MIN_PIDS, RESERVED_TARGETS, reserved_target
from vz_drivers._machine._book import MountRecord
from vz_drivers._machine._identity import check_user_syntax

__all__ = [
    "KNOWN_PROFILES",
    "RESERVED_TARGETS",
    "CommonRequest",
    "Rules",
    "check_target",
    "check_workspace_id",
    "validate_common",
]

KNOWN_PROFILES = ("developer", "hardened")
EGRESS = ("allow", "deny")
_VOLUME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
_ENV_KEY_RE = re.compile(r"^[^=\x00]+\Z")
_BIND_OPTIONS = frozenset({"ro", "rw", "bind", "rbind", "cached", "delegated", "consistent", "z", "Z"})
_TMPFS_BASIC = r"size=[0-9]+[kKmMgG%]?|mode=[0-7]{3,4}|noexec|exec|nosuid|nodev|ro|rw"


@dataclass(frozen=True)
class Rules:
    """What one backend accepts; the messages name it as ``display`` ("linux_native", "the qemu driver")."""

    display: str
    architecture: str
    """The GOARCH-style architecture of the Machines (``amd64``)."""
    cpus: int
    """CPUs the host can give one Machine."""
    memory_bytes: int
    min_memory_bytes: int
    min_memory_why: str
    """Why ``min_memory_bytes`` is the minimum, for the message ("32 MiB")."""
    profiles: tuple[str, ...] = ("developer",)
    platform_hint: str = ""
    userns_hint: str = ""
    reserved_why: str = "belongs to the Machine runtime"
    bind_dirs_only: bool = False
    max_mounts: int = 0
    """0 = no limit."""
    tmpfs_options: str = _TMPFS_BASIC
    """Regular expression alternatives of the accepted tmpfs options."""
    target_os: str = "linux"
    """The OS of the Machines (``linux``, ``darwin``): the request's platform must name it."""
    route_domains: bool = False
    """Whether a Machine can join an Environment's route domain (label ``vz.network``; the Extensions fact
    ``topology``). A backend that cannot refuses the label before anything is created."""
    pids_limits: bool = False
    """Whether the label ``vz.pids`` (the Machine's pids limit) is enforced (``Extensions.pids_limits``); a
    backend that cannot refuses the label before anything is created."""
    max_pids: int = MAX_PIDS
    """The most ``vz.pids`` may ask for on this host (``vz_core.rules.max_pids``)."""


@dataclass(frozen=True)
class CommonRequest:
    """The request's backend-independent settings after validation and normalization."""

    labels: dict[str, str]
    profile: str
    egress: str
    cpus: int
    memory_bytes: int
    storage_bytes: int
    mounts: tuple[MountRecord, ...]
    pids: int = 0
    """The label ``vz.pids``; 0 = none given (the backend's default applies)."""


def check_workspace_id(workspace_id: str) -> None:
    if not workspace_id:
        raise InvalidArgumentError("workspace_id must not be empty", details={"field": "workspace_id"})
    if "\x00" in workspace_id:
        raise InvalidArgumentError("workspace_id must not contain NUL characters", details={"field": "workspace_id"})


def _bad(message: str, field: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, details={"field": field})


def check_target(target: str, field: str, *, reserved_why: str = "belongs to the Machine runtime") -> str:
    """The normalized absolute mount target; refuse relative, ``..``, NUL, ``/`` and reserved targets."""
    if not target or not target.startswith("/"):
        raise _bad(f"{field} target {target!r} must be an absolute path inside the Machine", field)
    if "\x00" in target or any(part == ".." for part in target.split("/")):
        raise _bad(f"{field} target {target!r} must not contain '..' components or NUL characters", field)
    # posixpath.normpath keeps a leading "//" (POSIX leaves it implementation-defined); Linux does not.
    norm = "/" + posixpath.normpath(target).lstrip("/")
    if norm == "/":
        raise _bad(f"{field} target must not be the root directory '/'", field)
    reserved = reserved_target(norm)
    if reserved is not None:
        raise _bad(f"{field} target {target!r} is reserved ({reserved} {reserved_why})", field)
    return norm


def _check_platform(request: RunImageRequest, rules: Rules) -> None:
    if not request.platform:
        return
    parts = request.platform.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise _bad(f"platform {request.platform!r} must look like '{rules.target_os}/amd64'", "platform")
    if parts[0] != rules.target_os or parts[1] != rules.architecture:
        raise UnsupportedError(
            f"platform {request.platform!r} cannot run here: {rules.display} runs "
            f"{rules.target_os}/{rules.architecture} "
            f"Machines{rules.platform_hint}",
            details={"field": "platform"},
        )


def _check_resources(request: RunImageRequest, rules: Rules) -> tuple[int, int, int]:
    hr = request.host_requirements
    cpus = hr.cpus if hr else 0
    memory = hr.memory_bytes if hr else 0
    storage = hr.storage_bytes if hr else 0
    if cpus < 0:
        raise _bad(f"host_requirements.cpus={cpus} must not be negative", "host_requirements.cpus")
    if cpus > rules.cpus:
        raise _bad(
            f"host_requirements.cpus={cpus} is more than this host offers ({rules.cpus} CPUs); ask for at most "
            f"{rules.cpus}",
            "host_requirements.cpus",
        )
    if memory and memory < rules.min_memory_bytes:
        raise _bad(
            f"host_requirements.memory_bytes={memory} is below the minimum of {rules.min_memory_bytes} bytes "
            f"({rules.min_memory_why})",
            "host_requirements.memory_bytes",
        )
    if memory > rules.memory_bytes:
        raise _bad(
            f"host_requirements.memory_bytes={memory} is more than this host has ({rules.memory_bytes} bytes)",
            "host_requirements.memory_bytes",
        )
    if hr and hr.gpu == GpuRequirement.REQUIRED:
        raise UnsupportedError(
            f"GPUs are not passed to {rules.display} Machines", details={"field": "host_requirements.gpu"}
        )
    return cpus, memory, storage


def _check_pids(labels: dict[str, str], rules: Rules) -> int:
    if "vz.pids" not in labels:
        return 0
    value = labels["vz.pids"]
    if not rules.pids_limits:
        raise UnsupportedError(
            f"label vz.pids is not supported by {rules.display}: it does not enforce a pids limit; remove it",
            details={"field": "labels", "label": "vz.pids"},
        )
    most = max(MIN_PIDS, rules.max_pids)
    if not (value.isascii() and value.isdigit()) or not MIN_PIDS <= int(value) <= most:
        raise InvalidArgumentError(
            f"label vz.pids={value!r} must be a whole number from {MIN_PIDS} to {most} (half of this host's "
            "kernel.pid_max)",
            details={"field": "labels", "label": "vz.pids"},
        )
    return int(value)


def _bind(mount_source: str, target: str, ro: bool, options: tuple[str, ...], field: str, rules: Rules) -> MountRecord:
    for opt in options:
        if opt not in _BIND_OPTIONS:
            raise _bad(f"{field} bind option {opt!r} is not supported", field)
    if not mount_source or not os.path.isabs(mount_source):
        raise _bad(f"{field} source {mount_source!r} must be an absolute host path", field)
    if "\x00" in mount_source:
        raise _bad(f"{field} source must not contain NUL characters", field)
    source = Path(mount_source)
    if rules.bind_dirs_only and source.exists() and not source.is_dir():
        raise _bad(f"{field} source {mount_source!r} is not a directory ({rules.display} shares directories)", field)
    if not source.exists():
        raise _bad(f"{field} source {mount_source!r} does not exist on the host; create it first", field)
    return MountRecord("bind", mount_source, target, ro, str(source.resolve()), ())


def _mounts(request: RunImageRequest, rules: Rules) -> tuple[MountRecord, ...]:
    all_mounts = request.all_mounts()
    if rules.max_mounts and len(all_mounts) > rules.max_mounts:
        raise _bad(f"{len(all_mounts)} mounts requested; {rules.display} takes at most {rules.max_mounts}", "mounts")
    tmpfs_re = re.compile(rf"^({rules.tmpfs_options})\Z")
    mounts: list[MountRecord] = []
    targets: set[str] = set()
    for index, mount in enumerate(all_mounts):
        field = "workspace_mount" if (request.workspace_mount is not None and index == 0) else f"mounts[{index}]"
        if mount.type not in (MountType.BIND, MountType.VOLUME, MountType.TMPFS):
            raise UnsupportedError(
                f"{field} has mount type {mount.type!r}, which {rules.display} does not support (bind, volume, tmpfs)",
                details={"field": field},
            )
        target = check_target(mount.target, field, reserved_why=rules.reserved_why)
        if target in targets:
            raise _bad(f"{field} target {target!r} is used by two mounts", field)
        targets.add(target)
        ro = mount.read_only or "ro" in mount.options
        if mount.type == MountType.BIND:
            mounts.append(_bind(mount.source, target, ro, tuple(mount.options), field, rules))
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
                if not tmpfs_re.match(opt):
                    raise _bad(f"{field} tmpfs option {opt!r} is not supported (size=, mode=, noexec, ...)", field)
            opts = tuple(o for o in mount.options if o not in ("ro", "rw"))
            mounts.append(MountRecord("tmpfs", "", target, ro, "", opts))
    return tuple(mounts)


def validate_common(request: RunImageRequest, rules: Rules) -> CommonRequest:
    """Check everything that needs no image; raise InvalidArgumentError/UnsupportedError naming the field."""
    check_workspace_id(request.workspace_id)
    if not request.image:
        raise _bad("image must not be empty; give an image reference such as 'vz:default'", "image")
    _check_platform(request, rules)
    if request.userns or request.uid_map or request.gid_map:
        raise UnsupportedError(
            f"user namespaces (userns, uid_map, gid_map) are not supported by {rules.display}{rules.userns_hint}; "
            "leave them empty",
            details={"field": "userns"},
        )
    labels = request.label_map()
    profile = labels.get("vz.profile", "developer")
    if profile not in rules.profiles:
        if profile in KNOWN_PROFILES:
            raise UnsupportedError(
                f"label vz.profile={profile!r} is not supported by {rules.display} (supported: "
                f"{', '.join(rules.profiles)})",
                details={"field": "labels"},
            )
        raise _bad(f"label vz.profile={profile!r} is unknown; use one of {', '.join(rules.profiles)}", "labels")
    if "vz.network" in labels and not rules.route_domains:
        raise UnsupportedError(
            f"label vz.network (joining an Environment's route domain) is not supported by {rules.display}: its "
            "Machines cannot take part in a version 2 topology; give this Machine no paths, exports or imports, or "
            "run it with linux_native or qemu",
            details={"field": "labels", "label": "vz.network"},
        )
    egress = labels.get("vz.egress", "allow")
    if egress not in EGRESS:
        raise _bad(f"label vz.egress={egress!r} is unknown; use one of {', '.join(EGRESS)}", "labels")
    for name, value in request.environment.items():
        if not _ENV_KEY_RE.match(name):
            raise _bad(f"environment variable name {name!r} must be non-empty without '=' or NUL", "environment")
        if "\x00" in value:
            raise _bad("environment values must not contain NUL characters", "environment")
    check_user_syntax(request.user, field="user")
    check_user_syntax(request.remote_user, field="remote_user")
    cpus, memory, storage = _check_resources(request, rules)
    pids = _check_pids(labels, rules)
    return CommonRequest(
        labels=labels,
        profile=profile,
        egress=egress,
        cpus=cpus,
        memory_bytes=memory,
        storage_bytes=storage,
        mounts=_mounts(request, rules),
        pids=pids,
    )
