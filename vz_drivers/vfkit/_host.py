"""What this host offers vfkit: macOS with Virtualization.framework, which CPU, Rosetta, nested virtualization.

Facts are read without starting anything (``platform``, ``sysctl``, one file test), so Info and Preflight stay
cheap and side-effect free. On any other OS the answer is "unsupported" with the reason; nothing is faked.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass

__all__ = ["NOT_MACOS", "HostSupport", "host_support"]

NOT_MACOS = "vfkit needs macOS on Apple silicon or Intel with Virtualization.framework; this host is {system}"
_ROSETTA_RUNTIME = "/Library/Apple/usr/libexec/oah/libRosettaRuntime"
_MIN_MACOS = (11, 0)
_ARCH = {"arm64": "arm64", "aarch64": "arm64", "x86_64": "amd64", "amd64": "amd64"}


@dataclass(frozen=True)
class HostSupport:
    """Whether vfkit can run Machines here and with which optional features."""

    system: str
    """``platform.system()``: "Darwin" on macOS."""
    macos_version: tuple[int, ...]
    architecture: str
    """"arm64" or "amd64" (of the host and so of the Linux guests)."""
    reason: str
    """Empty when supported; otherwise why not (one actionable sentence)."""
    rosetta: bool
    """Rosetta for Linux is installed (Apple silicon only): ``--device rosetta`` can run amd64 binaries."""
    nested: bool
    """Nested virtualization may be offered (macOS 15+ on an M3 or newer): vfkit ``--nested``."""
    cpu: str = ""

    @property
    def supported(self) -> bool:
        return not self.reason


def _sysctl(name: str) -> str:
    try:
        done = subprocess.run(["/usr/sbin/sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _apple_chip_generation(brand: str) -> int:
    # "Apple M3 Pro" -> 3; 0 when unknown.
    for word in brand.split():
        if len(word) >= 2 and word[0] == "M" and word[1:].isdigit():
            return int(word[1:])
    return 0


def host_support(system: str | None = None) -> HostSupport:
    """Read the facts of this host (``system`` overrides ``platform.system()`` for tests of the decision)."""
    system = system or platform.system()
    machine = platform.machine().lower()
    arch = _ARCH.get(machine, machine)
    if system != "Darwin":
        return HostSupport(
            system=system,
            macos_version=(),
            architecture=arch,
            reason=NOT_MACOS.format(system=system or "unknown"),
            rosetta=False,
            nested=False,
        )
    release = platform.mac_ver()[0]
    version = tuple(int(p) for p in release.split(".") if p.isdigit()) if release else ()
    reason = ""
    if version and version < _MIN_MACOS:
        reason = f"vfkit needs macOS 11 or newer (Virtualization.framework); this host runs macOS {release}"
    elif arch not in ("arm64", "amd64"):
        reason = f"vfkit runs on Apple silicon or Intel Macs; this host's CPU is {machine}"
    brand = _sysctl("machdep.cpu.brand_string")
    rosetta = arch == "arm64" and os.path.exists(_ROSETTA_RUNTIME)
    nested = arch == "arm64" and bool(version) and version >= (15,) and _apple_chip_generation(brand) >= 3
    return HostSupport(
        system=system,
        macos_version=version,
        architecture=arch,
        reason=reason,
        rosetta=rosetta,
        nested=nested,
        cpu=brand,
    )
