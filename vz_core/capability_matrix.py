"""The capability matrix: which driver runs which target on which host, and how far along it is.

Statuses: ACTIVE (implemented and verified by the conformance suite on that host), DEV (implemented, not yet
passing the whole catalogue there, or not verifiable on the hosts we test on), PLANNED (not implemented).
``vz status`` and ``docs/capability-matrix.md`` print this table; a test keeps the doc in sync.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from typing import Literal

__all__ = ["MATRIX", "Entry", "Status", "current_host_os", "lookup", "render_markdown"]

Status = Literal["ACTIVE", "DEV", "PLANNED"]


@dataclass(frozen=True)
class Entry:
    driver: str
    host_os: str
    target_os: str
    status: Status
    note: str = ""


MATRIX: tuple[Entry, ...] = (
    Entry("fake", "linux", "linux", "ACTIVE", "reference driver: directories + host processes, for tests"),
    Entry("linux_native", "linux", "linux", "ACTIVE", "runc + namespaces/cgroups, OCI images"),
    Entry("qemu", "linux", "linux", "ACTIVE", "QEMU + guest agent; KVM where usable, else TCG"),
    Entry("qemu", "darwin", "linux", "PLANNED", "QEMU with HVF"),
    Entry("qemu", "windows", "linux", "PLANNED", "QEMU with WHPX"),
    Entry("vfkit", "darwin", "linux", "PLANNED", "Virtualization.framework through vfkit"),
    Entry("hyperv", "windows", "windows", "PLANNED", "Hyper-V cmdlets, hvsocket agent"),
    Entry("hyperv", "windows", "linux", "PLANNED", "Hyper-V cmdlets, hvsocket agent"),
    Entry("macos_vm", "darwin", "darwin", "PLANNED", "Virtualization.framework macOS guests"),
)


def current_host_os() -> str:
    """This host's OS in matrix terms: "linux", "darwin" or "windows"."""
    return {"win32": "windows"}.get(sys.platform, sys.platform if sys.platform != "linux2" else "linux")


def lookup(driver: str, host_os: str | None = None, target_os: str = "linux") -> Entry | None:
    """The matrix entry for a driver/host/target triple, or ``None`` when the pair is not in the matrix."""
    host = host_os or current_host_os()
    for entry in MATRIX:
        if (entry.driver, entry.host_os, entry.target_os) == (driver, host, target_os):
            return entry
    return None


def render_markdown() -> str:
    """The matrix as the Markdown table used in docs/capability-matrix.md."""
    lines = [
        "| driver | host OS | target OS | status | backend |",
        "|---|---|---|---|---|",
    ]
    for e in MATRIX:
        lines.append(f"| {e.driver} | {e.host_os} | {e.target_os} | {e.status} | {e.note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - used to regenerate the doc table
    print(render_markdown(), end="")
    print(f"\nthis host: {current_host_os()}/{platform.machine()}", file=sys.stderr)
