"""The SessionPool inside a real daemon process (``python -m vz_core.daemon``, started on demand): built-in
drivers run as pinned, verified plugins; a SIGKILLed daemon takes them along; the next daemon finds the
Machines of the last one (fake driver; every process is stopped or shown dead)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from vz_core.daemon import connect

FAKE_SCRIPT = Path(sys.executable).parent / "vz-driver-fake"


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def until(check: Any, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("VZ_HOME", str(home))
    monkeypatch.setenv("VZ_DAEMON_PLUGIN_IDLE", "0")
    root = tmp_path / "project"
    root.mkdir()
    machine: dict[str, Any] = {"name": "dev", "profile": "developer", "driver": "fake", "image": "img"}
    machine["workspace"] = {"projection": "none"}
    (root / "vz.json").write_text(json.dumps({"version": 1, "project_id": "sessions", "machines": [machine]}))
    return {"cwd": str(root), "environ": dict(os.environ), "definition_file": None}


def call(method: str, request: dict[str, Any]) -> dict[str, Any]:
    with connect(autostart=True) as conn:
        return conn.request(method, request)


def fake_row(status: dict[str, Any]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [row for row in status["plugins"] if row["name"] == "fake"]
    assert len(rows) == 1
    return rows[0]


def machine(status: dict[str, Any]) -> dict[str, Any]:
    (environment,) = status["environments"]
    (found,) = environment["machines"]
    assert isinstance(found, dict)
    return found


def test_a_daemon_runs_builtins_as_pinned_plugins_and_its_successor_finds_their_machines(
    project: dict[str, Any],
) -> None:
    daemons: list[int] = []
    try:
        up = call("Environments.Up", {"context": project, "environment": None, "recreate": False, "dry_run": False})
        assert up["environment"]["state"] == "running"
        status = call("System.Status", {})
        daemons.append(status["pid"])
        row = fake_row(status)
        assert row["state"] == "idle" and row["launches"] == 1 and row["crashes"] == 0
        digest = hashlib.sha256(FAKE_SCRIPT.read_bytes()).hexdigest()
        assert (row["script"], row["sha256"]) == (str(FAKE_SCRIPT), digest)
        plugin = psutil.Process(row["pid"])
        assert any(arg.startswith(("/proc/self/fd/", "/dev/fd/")) for arg in plugin.cmdline())  # the sealed copy
        supervisor = plugin.ppid()
        assert psutil.Process(supervisor).ppid() == status["pid"]  # daemon → supervisor → plugin
        caps = call("System.Capabilities", {"drivers": ["fake"]})
        assert caps["drivers"][0]["facts"]["driver_name"] == "fake"
        before = machine(call("Environments.Get", {"context": project, "environment": None}))
        assert before["health"]["source"] == "driver" and before["find"]["status"] == "running"
        assert fake_row(call("System.Status", {}))["launches"] == 1  # the warm plugin answered every call

        os.kill(status["pid"], signal.SIGKILL)
        until(lambda: gone(status["pid"]) and gone(row["pid"]) and gone(supervisor))

        got = call("Environments.Get", {"context": project, "environment": None})  # a new daemon starts
        second = call("System.Status", {})
        daemons.append(second["pid"])
        assert second["pid"] != status["pid"]
        after = machine(got)
        assert after["health"] == {**before["health"], "checked_at": after["health"]["checked_at"]}
        assert after["find"] == before["find"]  # the same Machine, found by the new daemon's plugin
        assert fake_row(second)["launches"] == 1
        deleted = call("Environments.Delete", {"context": project, "environment": None, "keep_volumes": False})
        assert [m["state"] for m in deleted["machines"]] == ["deleted"]
        plugin_pid = fake_row(call("System.Status", {}))["pid"]
        call("System.Shutdown", {})
        until(lambda: gone(second["pid"]) and (plugin_pid is None or gone(plugin_pid)))
    finally:
        for pid in daemons:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
