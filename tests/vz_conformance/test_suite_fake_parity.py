"""The reference fake driver passes the whole catalogue in-process and as its plugin, and the parity gate holds.

This is the suite's own acceptance command, run exactly as CI runs it for every built-in driver.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from suite_testlib import fake_providers
from vz_conformance._gate import expected_count, verify
from vz_conformance._report import load_report
from vz_conformance._runner import run_suite
from vz_conformance.adapters import FakeAdapter


@pytest.mark.slow
def test_cli_parity_run_passes_the_gate(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    run = subprocess.run(
        ["vz-conformance", "run", "--driver", "fake", "--provider-mode", "parity", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    gate = subprocess.run(
        [
            "vz-conformance",
            "verify-report",
            str(report),
            "--provider-mode",
            "parity",
            "--expect-count",
            str(expected_count("parity")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gate.returncode == 0, gate.stdout
    assert "PASS: parity report verified (105 cases)" in gate.stdout
    loaded = load_report(report)
    assert [r.provider_mode for r in loaded.runs] == ["in-process", "external"]
    assert loaded.runs[0].info == loaded.runs[1].info


@pytest.mark.slow
def test_library_parity_run_every_case_passes_or_is_a_verified_refusal(tmp_path: Path) -> None:
    in_process, external = fake_providers(tmp_path / "state")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    report = asyncio.run(run_suite([in_process, external], FakeAdapter(), scratch=scratch))
    problems = {
        f"{run.provider_mode} {c.id}": c.failure for run in report.runs for c in run.cases if c.outcome == "failed"
    }
    assert problems == {}
    result = verify([report], mode="parity", expect_count=expected_count("parity"))
    assert result.passed, result.problems
    not_applicable = {c.id: c.capability for c in report.runs[1].cases if c.outcome == "not-applicable"}
    # The fake declares no mount types, no egress, no resource or storage limits: exactly those cases.
    assert not_applicable == {
        "mounts.bind_read_write": "capabilities.mount_types.bind",
        "mounts.bind_read_only": "capabilities.mount_types.bind",
        "mounts.volume_persists": "capabilities.mount_types.volume",
        "mounts.tmpfs_reset": "capabilities.mount_types.tmpfs",
        "storage.workspace_survives": "capabilities.mount_types.bind",
        "storage.size": "extensions.storage_limits",
        "resources.visible": "extensions.resource_limits",
        "resources.impossible_refused": "extensions.resource_limits",
        "identity.workspace_owner": "capabilities.mount_types.bind",
        "egress.default_reaches": "extensions.egress_policies.deny",
        "egress.deny_refuses": "extensions.egress_policies.deny",
        "egress.deny_holds": "extensions.egress_policies.deny",
    }
