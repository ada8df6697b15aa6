"""linux_native's part of RunImage validation (profiles, capabilities, privileges, CPU placement); the shared
part (mounts, users, resources, labels) is ``vz_drivers._machine.validate_common``."""

from __future__ import annotations

from dataclasses import dataclass

from vz_core import RunImageRequest
from vz_core.errors import InvalidArgumentError, UnsupportedError
from vz_core.rules import max_pids
from vz_drivers._machine import CommonRequest, Rules, validate_common
from vz_drivers.linux_native._host import HostFacts
from vz_drivers.linux_native._spec import normalize_capability

__all__ = ["MIN_MEMORY_BYTES", "ValidRequest", "rules_for", "validate_request"]

MIN_MEMORY_BYTES = 32 * 1024 * 1024
_SECURITY_OK = frozenset({"seccomp=unconfined", "apparmor=unconfined", "label=disable", "label:disable"})


def rules_for(facts: HostFacts) -> Rules:
    return Rules(
        display="linux_native",
        architecture=facts.architecture,
        cpus=len(facts.cpus),
        memory_bytes=facts.memory_bytes,
        min_memory_bytes=MIN_MEMORY_BYTES,
        route_domains=True,
        pids_limits=True,
        max_pids=max_pids(facts.task_limit),
        min_memory_why="32 MiB",
        profiles=("developer", "hardened"),
        platform_hint=" on this host (use the qemu driver for other targets)",
    )


@dataclass(frozen=True)
class ValidRequest:
    """The request's settings after validation and normalization (no image-dependent parts)."""

    common: CommonRequest
    cpuset: str
    cap_add: tuple[str, ...]
    privileged: bool
    no_new_privileges: bool
    seccomp: bool


def _bad(message: str, field: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, details={"field": field})


def _cpuset(cpus: int, host: tuple[int, ...], key: str) -> str:
    # Spread Machines over the host's CPUs: start at an offset derived from the Machine key.
    offset = int(key[:8], 16) % len(host)
    chosen = sorted((host[offset:] + host[:offset])[:cpus])
    return ",".join(str(c) for c in chosen)


_HOST_REACHING = {
    "CAP_SYS_MODULE": "loads code into the host's kernel",
    "CAP_DAC_READ_SEARCH": "opens any host file by handle (open_by_handle_at)",
    "CAP_SYS_RAWIO": "reaches host memory and devices (iopl, /dev/mem)",
    "CAP_SYS_BOOT": "reboots the host or loads a new kernel (kexec)",
    "CAP_SYS_TIME": "sets the host's clock",
    "CAP_BPF": "loads BPF programs into the host's kernel",
    "CAP_PERFMON": "observes every process of the host (perf_event_open)",
    "CAP_SYSLOG": "reads the host kernel's log and addresses",
    "CAP_MAC_ADMIN": "changes the host's mandatory access control policy",
    "CAP_MAC_OVERRIDE": "overrides the host's mandatory access control",
    "CAP_AUDIT_CONTROL": "changes the host's audit rules",
    "CAP_AUDIT_READ": "reads the host's audit log",
    "CAP_WAKE_ALARM": "sets host wake alarms",
    "CAP_BLOCK_SUSPEND": "keeps the host from suspending",
}
"""Capabilities that act on the host itself, whatever namespaces the Machine has: refused (a hostile vz.json
must not reach the host through ``cap_add``; Docker allows them on request, vz does not)."""


def validate_request(request: RunImageRequest, facts: HostFacts, key: str) -> ValidRequest:
    """Check everything that needs no image; raise InvalidArgumentError/UnsupportedError naming the field."""
    common = validate_common(request, rules_for(facts))
    if common.storage_bytes:
        raise UnsupportedError(
            "host_requirements.storage_bytes cannot be enforced by linux_native (no per-Machine filesystem quota: a "
            "Machine can fill the disk that holds its state directory); leave it 0 or use the qemu driver",
            details={"field": "host_requirements.storage_bytes"},
        )
    if request.privileged:
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
        if norm in _HOST_REACHING:
            raise UnsupportedError(
                f"cap_add {cap!r} is not supported by linux_native ({norm} {_HOST_REACHING[norm]}: a Machine's root "
                "is the host's root in the host's kernel); use the qemu driver for a Machine that needs it",
                details={"field": "cap_add"},
            )
        if norm == "CAP_SYS_PTRACE":
            raise UnsupportedError(
                f"cap_add {cap!r} is not supported by linux_native (CAP_SYS_PTRACE would let the Machine's root read "
                "and replace its guest agent); debuggers trace processes of their own user without it: give them "
                'security_opt ["seccomp=unconfined"] (developer profile)',
                details={"field": "cap_add"},
            )
        caps.append(norm)
    hardened = common.profile == "hardened"
    no_new_privs = hardened
    seccomp = True
    for opt in request.security_opt:
        low = opt.strip()
        if low in ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true"):
            no_new_privs = True
        elif low in ("no-new-privileges:false", "no-new-privileges=false"):
            if hardened:
                raise _bad("the hardened profile always sets no-new-privileges", "security_opt")
        elif low in ("seccomp=unconfined", "seccomp:unconfined"):
            if hardened:
                raise _bad("the hardened profile always applies its seccomp filter", "security_opt")
            seccomp = False
        elif low not in _SECURITY_OK:
            raise UnsupportedError(
                f"security_opt {opt!r} is not supported by linux_native (supported: no-new-privileges, "
                "seccomp=unconfined, apparmor=unconfined, label=disable)",
                details={"field": "security_opt"},
            )
    return ValidRequest(
        common=common,
        cpuset=_cpuset(common.cpus, facts.cpus, key) if common.cpus else "",
        cap_add=tuple(caps),
        privileged=False,
        no_new_privileges=no_new_privs,
        seccomp=seccomp,
    )
