"""Can this host run macOS Machines? Apple silicon, macOS 13 or newer, and PyObjC's Virtualization bindings.

Everything here is read without creating anything: ``platform`` facts and whether the ``Virtualization``
module can be found. The answer on any other host is ``UNSUPPORTED`` with the reason, never a stand-in.
"""

from __future__ import annotations

import importlib.util
import platform
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MIN_MACOS", "SAVE_RESTORE_MACOS", "MacHost", "read_host"]

MIN_MACOS = (13, 0)
"""VZMacOSRestoreImage, VZMacOSInstaller and VZMacPlatformConfiguration appeared in macOS 12, but every boot
mounts the configuration share (virtio-fs tag ``vzcfg``) in the guest, and macOS guests have virtio-fs
(``mount_virtiofs``) only from macOS 13 on (Apple: "Sharing files between a host Mac and a guest VM" /
``VZVirtioFileSystemDeviceConfiguration``, macOS guests 13+); the host runs the same macOS or newer than the
guests it installs from its restore images, so the host minimum is macOS 13."""
SAVE_RESTORE_MACOS = (14, 0)
"""saveMachineStateTo/restoreMachineStateFrom appeared in macOS 14."""
BINDINGS = "pyobjc-framework-Virtualization"


@dataclass(frozen=True)
class MacHost:
    """The facts that decide support; ``unsupported`` is empty when macOS Machines can run here."""

    system: str
    machine: str
    macos: tuple[int, ...]
    bindings: bool

    @property
    def unsupported(self) -> str:
        if self.system != "Darwin":
            return (
                f"macOS Machines need macOS on Apple silicon (Virtualization.framework); this host runs "
                f"{self.system or 'an unknown OS'} on {self.machine or 'an unknown CPU'}"
            )
        if self.machine != "arm64":
            return f"macOS Machines need Apple silicon (arm64); this Mac has a {self.machine} CPU"
        if self.macos < MIN_MACOS:
            shown = ".".join(map(str, self.macos)) or "unknown"
            return (
                f"macOS Machines need macOS 13 or newer on the host (the guests' boot uses a virtio-fs share, which "
                f"macOS guests support from macOS 13 on); this host runs macOS {shown}"
            )
        return ""

    @property
    def missing_bindings(self) -> str:
        if self.bindings:
            return ""
        return f"the Python package {BINDINGS} is not installed (`pip install {BINDINGS}`)"

    @property
    def save_restore(self) -> bool:
        """Whether VM state can be saved and restored (macOS 14+)."""
        return not self.unsupported and self.macos >= SAVE_RESTORE_MACOS

    @property
    def target_architecture(self) -> str:
        return "arm64"


def _version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def read_host(
    system: Callable[[], str] = platform.system,
    machine: Callable[[], str] = platform.machine,
    mac_ver: Callable[[], str] = lambda: platform.mac_ver()[0],
) -> MacHost:
    """This host's facts (the callables are parameters so the decision is testable with other answers)."""
    name = system()
    found = name == "Darwin" and importlib.util.find_spec("Virtualization") is not None
    return MacHost(system=name, machine=machine().lower(), macos=_version(mac_ver()), bindings=found)
