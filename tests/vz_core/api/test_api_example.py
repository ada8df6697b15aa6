"""examples/api/lifecycle.py really runs: a daemon started on demand for a private VZ_HOME, the fake example
project, both transports; the daemon is shut down through the API afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from vz_core.api import Client

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "api" / "lifecycle.py"


@pytest.mark.timeout(240)
def test_the_api_example_runs_on_both_transports(tmp_path: Path) -> None:
    env = {**os.environ, "VZ_HOME": str(tmp_path / "home")}
    outputs = []
    pid = None
    try:
        for transport in ("local", "grpc"):
            done = subprocess.run(
                [sys.executable, str(EXAMPLE), "--transport", transport],
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            outputs.append(done.stdout)
            if pid is None:
                pid = Client(tmp_path / "home", autostart=False).daemon_status().pid
    finally:
        if (tmp_path / "home" / "daemon").exists():
            try:
                answer = Client(tmp_path / "home", autostart=False).shutdown()
                pid = pid or answer.get("pid")
            except Exception:
                pass
        deadline = time.monotonic() + 30
        while pid is not None and psutil.pid_exists(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert pid is not None and not psutil.pid_exists(pid), "the daemon did not exit after System.Shutdown"
    for out in outputs:
        assert "up: Environment default (env_" in out and "is running" in out
        assert "machine dev: running (health from driver)" in out
        assert "exec: exit 3, stdout b'got hello\\n', stderr b'oops\\n'" in out
        assert "delete: deleted, 1 Machine(s) removed" in out
        assert "operation.finished" in out
    # The second run's events start where the first run's ended: revisions survive across calls.
    assert "since revision 0:" in outputs[0] and "since revision 0:" not in outputs[1]


@pytest.mark.timeout(240)
def test_the_example_in_docs_api_md_runs(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    block = text.split("### Example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    env = {**os.environ, "VZ_HOME": str(tmp_path / "home")}
    try:
        done = subprocess.run(
            [sys.executable, "-c", block], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
        )
    finally:
        pid = None
        if (tmp_path / "home" / "daemon").exists():
            try:
                pid = Client(tmp_path / "home", autostart=False).shutdown().get("pid")
            except Exception:
                pass
        deadline = time.monotonic() + 30
        while pid is not None and psutil.pid_exists(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "0 b'got hello\\n'" in lines
    assert any(line.startswith("NOT_FOUND 3 ") for line in lines)
    assert any(line.startswith("dev running {") for line in lines)
