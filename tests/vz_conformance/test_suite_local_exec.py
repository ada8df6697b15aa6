"""The exec.local_* cases fail for a driver whose ``exec_local`` breaks the contract, each for its own rule.

Each broken driver is the reference fake with one ``exec_local`` mistake; the test runs the exec.local_* cases
in-process and compares the failed set (and the first failure text) with what that mistake must break.
``exec.local_frames`` goes through a ``RemoteDriver(local_exec=False)``: the driver's own ``exec_local`` is never
called, so it passes whatever that method does.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from vz_conformance._providers import InProcessProvider
from vz_conformance._runner import run_suite
from vz_conformance.adapters import FakeAdapter
from vz_conformance.fake import FakeDriver

from vz_core import ExecExit, ExecOutput, ExecSpec
from vz_core.errors import InvalidArgumentError

LOCAL = "exec.local_*"


async def _no_input() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - an empty async generator


class _Broken(FakeDriver):
    def __init__(self, mistake: str, state_dir: Path) -> None:
        super().__init__(state_dir=state_dir)
        self.mistake = mistake

    async def exec_local(self, machine_id: str, spec: ExecSpec, stdio: tuple[int, int, int]) -> ExecExit:
        tty = any(os.isatty(fd) for fd in stdio)
        if self.mistake in ("accepts-terminal", "refuses-after-running") and tty:  # writes into the terminal
            exit_ = ExecExit(-1)
            async for event in self.exec(replace(spec, workspace_id=machine_id), _no_input()):
                if isinstance(event, ExecOutput):
                    os.write(stdio[1] if event.stream == "stdout" else stdio[2], event.data)
                elif isinstance(event, ExecExit):
                    exit_ = event
            if self.mistake == "refuses-after-running":
                raise InvalidArgumentError("exec_local: stdout is a terminal (refused too late)")
            return exit_
        if self.mistake == "absent-is-success":
            details = await self.find(machine_id)
            if details is None or details.state.status != "running":
                return ExecExit(0)
        if self.mistake == "only-exec-local-broken":
            raise RuntimeError("exec_local is broken; exec works")
        exit_ = await super().exec_local(machine_id, spec, stdio)
        if self.mistake == "sets-nonblocking":
            os.set_blocking(stdio[1], False)
        if self.mistake == "drops-signal":
            exit_ = ExecExit(exit_.exit_code, "")
        return exit_


def _failed(mistake: str, tmp_path: Path) -> dict[str, str]:
    provider = InProcessProvider(factory=lambda: _Broken(mistake, tmp_path / "state"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    report = asyncio.run(run_suite([provider], FakeAdapter(), case_filter=[LOCAL], scratch=scratch))
    run = report.runs[0]
    assert len(run.cases) == 9 and run.cleanup_problems == []
    return {c.id: (c.failure or "").splitlines()[0] for c in run.cases if c.outcome == "failed"}


@pytest.mark.parametrize(
    ("mistake", "fails", "text"),
    [
        ("accepts-terminal", {"exec.local_terminal_refused"}, "an error of category INVALID_ARGUMENT; got success"),
        (
            "refuses-after-running",
            {"exec.local_terminal_refused"},
            "nothing written to the terminal (refused before anything runs)",
        ),
        (
            "absent-is-success",
            {"exec.local_missing_not_found", "exec.local_stopped_refused"},
            "an error of category",
        ),
        (
            "sets-nonblocking",
            {
                "exec.local_pipe_to_pipe",
                "exec.local_file_to_file",
                "exec.local_exit_code",
                "exec.local_signal_exit",
                "exec.local_cancelled",  # its follow-up command
            },
            "file status flags of the caller's descriptors unchanged",
        ),
        ("drops-signal", {"exec.local_signal_exit"}, "ExecExit(exit_code=143, signal='SIGTERM')"),
        (
            "only-exec-local-broken",
            {
                "exec.local_pipe_to_pipe",
                "exec.local_file_to_file",
                "exec.local_exit_code",
                "exec.local_signal_exit",
                "exec.local_cancelled",
                "exec.local_terminal_refused",
                "exec.local_missing_not_found",
                "exec.local_stopped_refused",
            },
            "exec_local: expected",
        ),
    ],
)
def test_a_broken_exec_local_fails_exactly_its_cases(mistake: str, fails: set[str], text: str, tmp_path: Path) -> None:
    failed = _failed(mistake, tmp_path)
    assert set(failed) == fails, failed
    assert all(t.startswith("exec_local: expected") for t in failed.values()), failed
    assert any(text in t for t in failed.values()), failed


def test_the_reference_fake_passes_every_local_case(tmp_path: Path) -> None:
    assert _failed("none", tmp_path) == {}
