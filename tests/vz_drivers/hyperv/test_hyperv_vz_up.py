"""`vz up` with a hyperv Machine on a host that is not Windows: it fails before any mutation, saying why.

The ``vz.drivers`` entry point pyproject.toml will declare is stood up here as a distribution on PYTHONPATH
(``entry_points.txt`` in a ``.dist-info`` directory), so the real console script finds the real declaration.
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

pytestmark = pytest.mark.skipif(platform.system() == "Windows", reason="describes a host that is not Windows")


def _vz(home: Path, site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    beside = Path(sys.executable).parent / "vz"
    exe = str(beside) if beside.exists() else (shutil.which("vz") or "vz")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_")}
    env["VZ_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_vz_up_fails_before_mutation_with_the_reason(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist = site / "vz_hyperv_entry_point-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vz-hyperv-entry-point\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[vz.drivers]\nhyperv = vz_drivers.hyperv.registration\n")
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    machine = {"name": "win", "profile": "developer", "driver": "hyperv", "image": "vz:default"}
    (work / "vz.json").write_text(
        json.dumps({"version": 1, "project_id": "hyperv-demo", "machines": [machine], "default_machine": "win"})
    )

    listed = _vz(home, site, work, "driver", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert '"hyperv"' in listed.stdout

    up = _vz(home, site, work, "up")
    assert up.returncode != 0
    assert "Traceback" not in up.stderr
    assert "Hyper-V, which exists only on Windows" in up.stderr and "this host is Linux" in up.stderr, up.stderr
    assert not (home / "state" / "drivers" / "hyperv").exists() and not any(home.rglob("disk.vhdx"))

    status = _vz(home, site, work, "status", "--json")
    assert "Traceback" not in status.stderr
    assert "has no Environment yet" in status.stdout
