"""Helpers shared by the qemu driver tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from vz_core import Driver, ExecExit, ExecOutput, ExecSpec
from vz_drivers.qemu import QemuDriver


@dataclass
class Result:
    stdout: bytes = b""
    stderr: bytes = b""
    exit: ExecExit | None = None
    frames: list[int] = field(default_factory=list)


async def chunks(data: bytes | Iterable[bytes] = b"") -> AsyncIterator[bytes]:
    parts = [data] if isinstance(data, bytes) else list(data)
    for part in parts:
        if part:
            yield part


async def run(driver: Driver, workspace_id: str, *argv: str, stdin: bytes = b"", **spec: object) -> Result:
    """Exec ``argv`` and collect everything."""
    result = Result()
    events = driver.exec(ExecSpec(workspace_id=workspace_id, argv=argv, **spec), chunks(stdin))  # type: ignore[arg-type]
    async for event in events:
        if isinstance(event, ExecOutput):
            result.frames.append(len(event.data))
            if event.stream == "stdout":
                result.stdout += event.data
            else:
                result.stderr += event.data
        else:
            assert result.exit is None, "a second exit event"
            result.exit = event
    assert result.exit is not None, "the exec ended without an exit event"
    return result


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
