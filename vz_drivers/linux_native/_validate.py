"""Validation of a RunImage request: everything that can be checked without the image, before any mutation."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from vz_core import GpuRequirement, MountType, RunImageRequest
from vz_core.errors import InvalidArgumentError, UnsupportedError
from vz_drivers.linux_native._host import HostFacts
from vz_drivers.linux_native._identity import check_user_syntax
from vz_drivers.linux_native._spec import normalize_capability
from vz_drivers.linux_native._state import MountRecord

__all__ = ["MIN_MEMORY_BYTES", "ValidRequest", "check_workspace_id", "validate_request"]

MIN_MEMORY_BYTES = 32 * 1024 * 1024
PROFILES = ("developer", "hardened")
EGRESS = ("allow", "deny")
_VOLUME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_ENV_KEY_RE = re.compile(r"^[^=\x00]+$")
_RESERVED_TARGETS = ("/.vz", "/proc", "/sys", "/dev")
_BIND_OPTIONS = frozenset({"ro", "rw", "bind", "rbind", "cached", "delegated", "consistent", "z", "Z"})
_TMPFS_OPTION_RE = re.compile(r"^(size=[0-9]+[kKmMgG%]?|mode=[0-7]{3,4}|noexec|exec|nosuid|nodev|ro|rw)$")
_SECURITY_OK = frozenset({"seccomp=unconfined", "apparmor=unconfined", "label=disable", "label:disable"})


@dataclass(frozen=True)
class ValidRequest:
    """The request's settings after validation and normalization (no image-dependent parts)."""

    labels: dict[str, str]
    profile: str
    egress: str
    cpus: int
    cpuset: str
    memory_bytes: int
    mounts: tuple[MountRecord, ...]
    cap_add: tuple[str, ...]
    privileged: bool
    no_new_privileges: bool


def check_workspace_id(workspace_id: str) -> None:
    if not workspace_id:
        raise InvalidArgumentError("workspace_id must not be empty", details={"field": "workspace_id"})
    if "\x00" in workspace_id:
        raise InvalidArgumentError("workspace_id must not contain NUL characters", details={"field": "workspace_id"})


def _bad(message: str, field: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, details={"field": field})


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
            raise _bad(f"{field} target {target!r} is reserved ({reserved} belongs to the Machine runtime)", field)
    return norm


def _cpuset(cpus: int, host: tuple[int, ...], key: str) -> str:
    # Spread Machines over the host's CPUs: start at an offset derived from the Machine key.
    offset = int(key[:8], 16) % len(host)
    chosen = sorted((host[offset:] + host[:offset])[:cpus])
    return ",".join(str(c) for c in chosen)


def validate_request(request: RunImageRequest, facts: HostFacts, key: str) -> ValidRequest:
    """Check everything that needs no image; raise InvalidArgumentError/UnsupportedError naming the field."""
    check_workspace_id(request.workspace_id)
    if not request.image:
        raise _bad("image must not be empty; give an image reference such as 'vz:default'", "image")
    if request.platform:
        parts = request.platform.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise _bad(f"platform {request.platform!r} must look like 'linux/amd64'", "platform")
        if parts[0] != "linux" or parts[1] != facts.architecture:
            raise UnsupportedError(
                f"platform {request.platform!r} cannot run here: linux_native runs linux/{facts.architecture} "
                "Machines on this host (use the qemu driver for other targets)",
                details={"field": "platform"},
            )
    if request.userns or request.uid_map or request.gid_map:
        raise UnsupportedError(
            "user namespaces (userns, uid_map, gid_map) are not supported by linux_native; leave them empty",
            details={"field": "userns"},
        )
    labels = request.label_map()
    profile = labels.get("vz.profile", "developer")
    if profile not in PROFILES:
        raise _bad(f"label vz.profile={profile!r} is unknown; use one of {', '.join(PROFILES)}", "labels")
    egress = labels.get("vz.egress", "allow")
    if egress not in EGRESS:
        raise _bad(f"label vz.egress={egress!r} is unknown; use one of {', '.join(EGRESS)}", "labels")
    for name in request.environment:
        if not _ENV_KEY_RE.match(name):
            raise _bad(f"environment variable name {name!r} must be non-empty without '=' or NUL", "environment")
    check_user_syntax(request.user, field="user")
    check_user_syntax(request.remote_user, field="remote_user")

    hr = request.host_requirements
    cpus = hr.cpus if hr else 0
    memory = hr.memory_bytes if hr else 0
    if cpus < 0:
        raise _bad(f"host_requirements.cpus={cpus} must not be negative", "host_requirements.cpus")
    if cpus > len(facts.cpus):
        raise _bad(
            f"host_requirements.cpus={cpus} is more than this host offers ({len(facts.cpus)} CPUs); ask for at "
            f"most {len(facts.cpus)}",
            "host_requirements.cpus",
        )
    if memory and memory < MIN_MEMORY_BYTES:
        raise _bad(
            f"host_requirements.memory_bytes={memory} is below the minimum of {MIN_MEMORY_BYTES} bytes (32 MiB)",
            "host_requirements.memory_bytes",
        )
    if memory > facts.memory_bytes:
        raise _bad(
            f"host_requirements.memory_bytes={memory} is more than this host has ({facts.memory_bytes} bytes)",
            "host_requirements.memory_bytes",
        )
    if hr and hr.storage_bytes:
        raise UnsupportedError(
            "host_requirements.storage_bytes cannot be enforced by linux_native (no per-Machine filesystem quota); "
            "leave it 0 or use the qemu driver",
            details={"field": "host_requirements.storage_bytes"},
        )
    if hr and hr.gpu == GpuRequirement.REQUIRED:
        raise UnsupportedError(
            "GPUs are not passed to linux_native Machines", details={"field": "host_requirements.gpu"}
        )

    privileged = bool(request.privileged)
    if privileged:
        # The guest agent, as PID 1, unmounts and remounts filesystems when it stops; with CAP_SYS_ADMIN that
        # would reach the host's filesystems through the Machine's bind mounts. Refused until it can't.
        raise UnsupportedError(
            "privileged Machines are not supported by linux_native; add the specific capabilities you need with "
            "cap_add (CAP_SYS_ADMIN excluded)",
            details={"field": "privileged"},
        )
    caps: list[str] = []
    for cap in request.cap_add:
        norm = "ALL" if cap.strip().upper() == "ALL" else normalize_capability(cap)
        if norm is None:
            raise _bad(f"cap_add {cap!r} is not a Linux capability name (e.g. NET_ADMIN)", "cap_add")
        if norm in ("ALL", "CAP_SYS_ADMIN"):
            raise UnsupportedError(
                f"cap_add {cap!r} is not supported by linux_native (CAP_SYS_ADMIN would let the Machine's init "
                "remount host filesystems); add narrower capabilities",
                details={"field": "cap_add"},
            )
        caps.append(norm)
    no_new_privs = profile == "hardened"
    for opt in request.security_opt:
        low = opt.strip()
        if low in ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true"):
            no_new_privs = True
        elif low in ("no-new-privileges:false", "no-new-privileges=false"):
            if profile == "hardened":
                raise _bad("the hardened profile always sets no-new-privileges", "security_opt")
        elif low not in _SECURITY_OK:
            raise UnsupportedError(
                f"security_opt {opt!r} is not supported by linux_native (supported: no-new-privileges, "
                "seccomp=unconfined, apparmor=unconfined, label=disable)",
                details={"field": "security_opt"},
            )

    mounts: list[MountRecord] = []
    targets: set[str] = set()
    for index, mount in enumerate(request.all_mounts()):
        field = "workspace_mount" if (request.workspace_mount is not None and index == 0) else f"mounts[{index}]"
        if mount.type not in (MountType.BIND, MountType.VOLUME, MountType.TMPFS):
            raise UnsupportedError(
                f"{field} has mount type {mount.type!r}, which linux_native does not support (bind, volume, tmpfs)",
                details={"field": field},
            )
        target = _check_target(mount.target, field)
        if target in targets:
            raise _bad(f"{field} target {target!r} is used by two mounts", field)
        targets.add(target)
        if mount.type == MountType.BIND:
            for opt in mount.options:
                if opt not in _BIND_OPTIONS:
                    raise _bad(f"{field} bind option {opt!r} is not supported", field)
            if not mount.source or not os.path.isabs(mount.source):
                raise _bad(f"{field} source {mount.source!r} must be an absolute host path", field)
            if "\x00" in mount.source:
                raise _bad(f"{field} source must not contain NUL characters", field)
            source = Path(mount.source)
            if not source.exists():
                raise _bad(f"{field} source {mount.source!r} does not exist on the host; create it first", field)
            ro = mount.read_only or "ro" in mount.options
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
            ro = mount.read_only or "ro" in mount.options
            mounts.append(MountRecord("volume", mount.source, target, ro, "", ()))
        else:
            for opt in mount.options:
                if not _TMPFS_OPTION_RE.match(opt):
                    raise _bad(f"{field} tmpfs option {opt!r} is not supported (size=, mode=, noexec, ...)", field)
            opts = tuple(o for o in mount.options if o not in ("ro", "rw"))
            mounts.append(MountRecord("tmpfs", "", target, mount.read_only or "ro" in mount.options, "", opts))
    return ValidRequest(
        labels=labels,
        profile=profile,
        egress=egress,
        cpus=cpus,
        cpuset=_cpuset(cpus, facts.cpus, key) if cpus else "",
        memory_bytes=memory,
        mounts=tuple(mounts),
        cap_add=tuple(caps),
        privileged=privileged,
        no_new_privileges=no_new_privs,
    )
