"""#14 item 5 through the real `vz` console script on linux_native (root): `workspace.projection: snapshot` is a
point-in-time copy taken when the Machine is created (later host edits are invisible, Machine edits never reach
the host); a driver without snapshots is refused before anything is created, naming the driver."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def agent_binary() -> str:
    """The guest agent built once (vz's own cache) and given to every ``vz`` run as ``VZ_AGENT_BINARY``: a test's
    fresh VZ_HOME would otherwise build it again, which is not what these tests are about."""
    from vz_drivers.agent import ensure_agent_binary

    return str(ensure_agent_binary())


def vz(
    home: Path, *args: str, cwd: Path, code: int | None = 0, agent: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    beside = Path(sys.executable).parent / "vz"
    exe = str(beside) if beside.exists() else (shutil.which("vz") or "vz")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_")}
    env["VZ_HOME"] = str(home)
    if agent is not None:
        env["VZ_AGENT_BINARY"] = agent
    proc = subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, timeout=300, check=False)
    if code is not None:
        assert proc.returncode == code, f"vz {' '.join(args)} → {proc.returncode}: {proc.stderr.decode()}"
    return proc


def project(root: Path, driver: str) -> Path:
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("before\n")
    machine = {
        "name": "web",
        "profile": "developer",
        "driver": driver,
        "image": "vz:default",
        "workspace": {"projection": "snapshot", "target": "/workspace"},
    }
    (root / "vz.json").write_text(json.dumps({"version": 1, "project_id": "snap", "machines": [machine]}))
    return root


@pytest.mark.root
def test_snapshot_is_a_point_in_time_copy(tmp_path: Path, agent_binary: str) -> None:
    if os.geteuid() != 0:
        pytest.fail("linux_native needs root (namespaces, cgroups, runc)")
    home = tmp_path / "home"
    wt = project(tmp_path / "wt", "linux_native")

    def run(*args: str, code: int | None = 0) -> subprocess.CompletedProcess[bytes]:
        return vz(home, *args, cwd=wt, code=code, agent=agent_binary)

    try:
        run("up")
        (wt / "notes.txt").write_text("after\n")  # a host edit after creation: invisible inside
        assert run("exec", "--", "cat", "/workspace/notes.txt").stdout == b"before\n"
        run("exec", "--", "sh", "-c", "echo machine > /workspace/notes.txt; echo new > /workspace/made")
        assert (wt / "notes.txt").read_text() == "after\n" and not (wt / "made").exists()
        assert run("exec", "--", "cat", "/workspace/made").stdout == b"new\n"
    finally:
        run("delete", code=None)


def test_a_driver_without_snapshots_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    home = tmp_path / "home"
    wt = project(tmp_path / "wt", "fake")
    err = vz(home, "up", cwd=wt, code=2).stderr.decode()
    assert "workspace.projection: driver 'fake' does not support 'snapshot'" in err
    status = json.loads(vz(home, "status", "--all", "--json", cwd=wt).stdout)
    assert status["environments"] == []
