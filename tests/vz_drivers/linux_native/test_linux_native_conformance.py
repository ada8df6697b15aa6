"""linux_native passes the whole conformance catalogue in-process and as its plugin (parity).

The driver's acceptance command, run exactly as CI runs it for every built-in driver.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from vz_conformance._gate import expected_count


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_parity_run_of_the_whole_catalogue_passes_the_gate(tmp_path: Path) -> None:
    report = tmp_path / "linux-native-parity.json"
    run = subprocess.run(
        ["vz-conformance", "run", "--driver", "linux_native", "--provider-mode", "parity", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=1700,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
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
    not_applicable = sorted({c["id"] for r in doc["runs"] for c in r["cases"] if c["outcome"] != "passed"})
    # linux_native declares storage limits absent (no quota here): that case alone may be a verified refusal.
    assert not_applicable in ([], ["storage.size"]), not_applicable
