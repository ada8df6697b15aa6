"""Helpers of the qemu driver tests (the shared ones are in ``machine_testlib``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import psutil

from vz_drivers.qemu import QemuDriver


def qemu_processes(state_dir: Path) -> list[psutil.Process]:
    """Live QEMU processes started for Machines under ``state_dir``."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            cmdline = proc.cmdline()
            # QEMU renames its process after the Machine (-name ...,process=vz-...): match the executable.
            is_qemu = bool(cmdline) and Path(cmdline[0]).name.startswith("qemu-system")
            if is_qemu and proc.status() != psutil.STATUS_ZOMBIE and any(str(state_dir) in a for a in cmdline):
                found.append(proc)
    return found


def make_driver(state_dir: Path, image_dir: Path, agent_binary: str) -> QemuDriver:
    return QemuDriver(state_dir=state_dir, image_dir=image_dir, agent_binary=agent_binary, stop_timeout=5)


@dataclass(frozen=True)
class Booted:
    """The module's shared Machine: its id, where its state lives, and its host-side directories."""

    workspace_id: str
    state_dir: Path
    image_dir: Path
    agent_binary: str
    workspace: Path
    read_only: Path
    boot_seconds: float

    def driver(self) -> QemuDriver:
        return make_driver(self.state_dir, self.image_dir, self.agent_binary)
