"""The qemu driver passes the whole conformance catalogue in-process and as its plugin (parity), under TCG here.

This is the driver's acceptance command, run exactly as CI runs it for every built-in driver. It boots about a
hundred VMs, so it is the longest test of the driver (about 10 minutes on 2 cores under TCG).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from vz_conformance._gate import expected_count

ADAPTER = "vz_conformance.adapters.qemu:ADAPTER"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_parity_run_of_the_whole_catalogue_passes_the_gate(tmp_path: Path) -> None:
    report = tmp_path / "qemu-parity.json"
    run = subprocess.run(
        [
            "vz-conformance",
            "run",
            "--driver",
            "qemu",
            "--adapter",
            ADAPTER,
            "--provider-mode",
            "parity",
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=3300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-6000:]
    count = expected_count("parity")
    gate = subprocess.run(
        ["vz-conformance", "verify-report", str(report), "--provider-mode", "parity", "--expect-count", str(count)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gate.returncode == 0, gate.stdout + gate.stderr
    doc = json.loads(report.read_text())
    outcomes = {case["outcome"] for run_ in doc["runs"] for case in run_["cases"]}
    assert outcomes == {"passed"}, "the qemu driver declares every capability: no case may be not-applicable"
