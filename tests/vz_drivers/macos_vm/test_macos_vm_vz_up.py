"""`vz up` with a macos_vm Machine on a host that is not macOS: it fails before any mutation, saying why.

Through the real console script and the installed ``vz.drivers`` entry point (pyproject.toml).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(platform.system() == "Darwin", reason="describes a host that is not macOS")


def _vz(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    beside = Path(sys.executable).parent / "vz"
    exe = str(beside) if beside.exists() else (shutil.which("vz") or "vz")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_")}
    env["VZ_HOME"] = str(home)
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def _rows(text: str) -> list[dict[str, object]]:
    data = json.loads(text)
    rows = data.get("drivers", data) if isinstance(data, dict) else data
    return [r for r in rows if isinstance(r, dict)]


def test_vz_up_fails_before_mutation_with_the_reason(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    machine = {"name": "mac", "profile": "developer", "driver": "macos_vm", "target": {"os": "darwin"}}
    machine["image"] = "macos:stable"
    (work / "vz.json").write_text(
        json.dumps({"version": 1, "project_id": "macos-demo", "machines": [machine], "default_machine": "mac"})
    )

    listed = _vz(home, work, "driver", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert any(row.get("name") == "macos_vm" for row in _rows(listed.stdout))

    up = _vz(home, work, "up")
    assert up.returncode != 0
    assert "Traceback" not in up.stderr
    assert "macOS Machines need macOS on Apple silicon (Virtualization.framework); this host runs Linux" in up.stderr
    assert not (home / "state" / "drivers" / "macos_vm").exists() and not any(home.rglob("*.img"))

    # Not even the Environment was recorded: the driver refused during negotiation, before any mutation.
    status = _vz(home, work, "status", "--json")
    assert "Traceback" not in status.stderr
    assert "has no Environment yet" in status.stdout
