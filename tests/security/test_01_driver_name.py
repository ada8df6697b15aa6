"""#18 item 1: a vz.json cannot make vz execute a binary, nor choose host paths, binaries or networks.

A Machine's ``driver`` used to be joined into a path under the driver-manifests directory: an absolute path or
``../`` loaded any JSON file as an external-driver record and vz launched the binary it named, even for
``vz up --dry-run``. Driver names now have one grammar and records are found only among the drivers the user
added. Options that choose binaries, host paths or host networks are refused from vz.json (before anything is
created) and come only from the user's host configuration.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vz_core.trust import host_platform


def _vz() -> str:
    beside = Path(sys.executable).parent / "vz"
    found = str(beside) if beside.exists() else shutil.which("vz")
    assert found, "the vz console script is not installed (pip install -e .)"
    return found


def _run(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_") and k != "PYTEST_CURRENT_TEST"}
    env["VZ_HOME"] = str(home)
    return subprocess.run(
        [_vz(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False, input=""
    )


def _project(root: Path, machine: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    data = {"version": 1, "project_id": "demo", "machines": [machine]}
    (root / "vz.json").write_text(json.dumps(data))
    return root


def _machine(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "web",
        "profile": "developer",
        "driver": "fake",
        "image": "vz:default",
        "workspace": {"projection": "none"},
    }
    base.update(overrides)
    return base


def _environments(home: Path) -> int:
    """How many Environments the state database records (0 when there is no database)."""
    db = home / "state.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "environments" not in tables:
            return 0
        count: int = conn.execute("SELECT COUNT(*) FROM environments").fetchone()[0]
        return count


def _plant(project: Path) -> tuple[Path, Path]:
    """What a hostile checkout carries: a script that would leave a marker, and an external-driver record
    (the format vz keeps under driver-manifests/) naming it with its real checksum. Returns (record, marker)."""
    marker = project / "EXECUTED"
    script = project / "tools" / "evil.sh"
    script.parent.mkdir(parents=True)
    script.write_text(f"#!/bin/sh\necho ran > {marker}\nexit 1\n")
    script.chmod(0o755)
    manifest = {
        "manifest_version": 1,
        "name": "evil",
        "version": "1",
        "api_version": "1.3",
        "binaries": {host_platform(): {"path": str(script), "sha256": hashlib.sha256(script.read_bytes()).hexdigest()}},
    }
    record = project / "tools" / "record.json"
    record.write_text(
        json.dumps(
            {
                "manifest": manifest,
                "driver_dir": str(script.parent),
                "manifest_path": str(record),
                "added_at": "2026-01-01T00:00:00+00:00",
            }
        )
    )
    return record, marker


def _driver_values(home: Path, record: Path) -> list[str]:
    without_suffix = str(record.with_suffix(""))
    manifests = home / "driver-manifests"
    relative = os.path.relpath(without_suffix, manifests)
    return [
        without_suffix,  # absolute path: joined to the manifests directory, it used to replace it
        relative,  # ../ out of the manifests directory
        "evil/../" + relative,
        "fake\n",  # a name followed by a newline ("$" in a regex lets it through)
        "Fake",
    ]


@pytest.mark.parametrize("which", range(5), ids=["absolute", "dotdot", "inner-dotdot", "newline", "uppercase"])
@pytest.mark.parametrize("command", [("up", "--dry-run"), ("up",)], ids=["dry-run", "up"])
def test_a_driver_value_that_is_not_a_name_is_refused_and_nothing_runs(
    tmp_path: Path, which: int, command: tuple[str, ...]
) -> None:
    home = tmp_path / "home"
    project = tmp_path / "checkout"
    project.mkdir()
    record, marker = _plant(project)
    (home / "driver-manifests").mkdir(parents=True)
    driver = _driver_values(home, record)[which]
    _project(project, _machine(driver=driver))
    out = _run(home, project, *command)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert "driver" in out.stderr
    assert not marker.exists(), "vz executed the binary a project file named"
    assert _environments(home) == 0


def test_a_record_planted_in_the_manifest_store_without_vz_driver_add_is_not_a_driver(tmp_path: Path) -> None:
    """A record file whose manifest names another driver, and a symlink into the store, are not used."""
    home = tmp_path / "home"
    project = tmp_path / "checkout"
    project.mkdir()
    record, marker = _plant(project)
    manifests = home / "driver-manifests"
    manifests.mkdir(parents=True)
    (manifests / "linked.json").symlink_to(record)  # a symlink into the store
    (manifests / "renamed.json").write_text(record.read_text())  # its manifest says "evil", not "renamed"
    for name in ("linked", "renamed"):
        _project(project, _machine(driver=name))
        out = _run(home, project, "up", "--dry-run")
        assert out.returncode != 0, out.stdout + out.stderr
        assert "Traceback" not in out.stderr, out.stderr
        assert not marker.exists(), f"vz executed the binary of a planted record ({name})"


# `vz up` for real only with the fake driver: the refusal does not depend on the driver, and a regression must not
# leave containers or VMs behind on the test host. The other drivers are checked with --dry-run.
@pytest.mark.parametrize(
    ("driver", "options", "command"),
    [
        pytest.param("fake", {"state_dir": "OUTSIDE"}, ("up",), id="up-fake-state_dir"),
        pytest.param("fake", {"state_dir": "OUTSIDE"}, ("up", "--dry-run"), id="dry-run-fake-state_dir"),
        pytest.param("linux_native", {"state_dir": "OUTSIDE"}, ("up", "--dry-run"), id="linux_native-state_dir"),
        pytest.param("linux_native", {"subnet": "127.0.0.0/8"}, ("up", "--dry-run"), id="linux_native-subnet"),
        pytest.param("linux_native", {"runc": "OUTSIDE/runc"}, ("up", "--dry-run"), id="linux_native-runc"),
        pytest.param("linux_native", {"image_dir": "OUTSIDE"}, ("up", "--dry-run"), id="linux_native-image_dir"),
        pytest.param("qemu", {"qemu": "OUTSIDE/qemu"}, ("up", "--dry-run"), id="qemu-binary"),
    ],
)
def test_host_options_in_vz_json_are_refused_before_anything_changes(
    tmp_path: Path, driver: str, options: dict[str, str], command: tuple[str, ...]
) -> None:
    home = tmp_path / "home"
    outside = tmp_path / "outside"
    project = tmp_path / "checkout"
    resolved = {k: v.replace("OUTSIDE", str(outside)) for k, v in options.items()}
    _project(project, _machine(driver=driver, driver_options=resolved))
    out = _run(home, project, *command)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    (key,) = options
    assert f"driver_options.{key}" in out.stderr, out.stderr
    assert f"vz driver configure {driver} {key}=" in out.stderr, out.stderr
    assert not outside.exists(), "a project file chose a host path"
    # The daemon makes drivers/ (0700, empty) when it starts; a driver built there would have its own directory.
    drivers = home / "drivers"
    assert not drivers.exists() or not any(drivers.iterdir()), "a driver was built before the refusal"
    assert _environments(home) == 0
