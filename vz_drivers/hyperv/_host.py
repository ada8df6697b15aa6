"""Whether this host can run Hyper-V Machines, and whether this user may.

``host_support`` reads only ``platform`` and ``sys`` (cheap, no process started): Hyper-V exists on Windows
alone, and the host end of a Hyper-V socket (``socket.AF_HYPERV``) needs CPython 3.12 or newer on Windows.
``check_privileges`` judges the answer of the ``probe`` script: the Hyper-V module must be installed, and the
user must be a member of Hyper-V Administrators (S-1-5-32-578) or run elevated; creating and deleting a Machine
writes its Hyper-V socket service under HKLM, which needs an elevated process.
"""

from __future__ import annotations

import platform
import socket
import sys
from dataclasses import dataclass

from vz_core.errors import PermissionDeniedError, UnavailableError
from vz_drivers.hyperv._scripts import HostProbe

__all__ = ["NOT_WINDOWS", "HostSupport", "check_create_privileges", "check_privileges", "host_support"]

NOT_WINDOWS = (
    "the hyperv driver runs Machines through Hyper-V, which exists only on Windows (10/11 Pro, Enterprise, "
    "Education or Windows Server with the Hyper-V role); this host is {system}"
)
_ARCH = {"amd64": "amd64", "x86_64": "amd64", "arm64": "arm64", "aarch64": "arm64"}


@dataclass(frozen=True)
class HostSupport:
    system: str
    architecture: str
    reason: str
    """Empty when Machines can run here; otherwise one actionable sentence."""

    @property
    def supported(self) -> bool:
        return not self.reason


def host_support(system: str | None = None, *, python: tuple[int, int] | None = None) -> HostSupport:
    """The facts of this host (``system``/``python`` override the real ones for tests of the decision)."""
    system = system if system is not None else platform.system()
    python = python or (sys.version_info.major, sys.version_info.minor)
    machine = platform.machine().lower()
    arch = _ARCH.get(machine, machine)
    reason = ""
    if system != "Windows":
        reason = NOT_WINDOWS.format(system=system or "unknown")
    elif python < (3, 12) or (system == platform.system() and not hasattr(socket, "AF_HYPERV")):
        reason = (
            f"the hyperv driver reaches the guest agent over a Hyper-V socket (socket.AF_HYPERV), which needs "
            f"Python 3.12 or newer on Windows; this is Python {python[0]}.{python[1]}"
        )
    elif arch != "amd64":
        reason = f"the hyperv driver runs amd64 Linux Machines on amd64 Windows hosts; this host's CPU is {machine}"
    return HostSupport(system=system, architecture=arch, reason=reason)


def check_privileges(probe: HostProbe) -> None:
    """Raise unless the Hyper-V module is there and the user may manage VMs."""
    if not probe.module:
        raise UnavailableError(
            "the Hyper-V PowerShell module is not installed; enable Hyper-V (elevated PowerShell: "
            "`Enable-WindowsOptionalFeature -Online -FeatureName Microsoft-Hyper-V-All`, then reboot)",
            details={"driver": "hyperv"},
        )
    if not (probe.hyperv_administrator or probe.elevated):
        raise PermissionDeniedError(
            f"user {probe.user or '(unknown)'} may not manage Hyper-V virtual machines: add it to the local group "
            "'Hyper-V Administrators' (elevated: `Add-LocalGroupMember -SID S-1-5-32-578 -Member $env:USERNAME`, "
            "then sign out and in again) or run vz from an elevated prompt",
            details={"driver": "hyperv", "user": probe.user},
        )


def check_create_privileges(probe: HostProbe) -> None:
    """Creating and deleting Machines also writes HKLM (the Hyper-V socket service): elevated only."""
    check_privileges(probe)
    if not probe.elevated:
        raise PermissionDeniedError(
            f"creating or deleting a hyperv Machine registers its Hyper-V socket service under HKLM, which needs an "
            f"elevated process; user {probe.user or '(unknown)'} is a Hyper-V Administrator but this prompt is not "
            "elevated: run `vz up` / `vz delete` from an elevated prompt (start, stop and exec do not need it)",
            details={"driver": "hyperv", "user": probe.user},
        )
