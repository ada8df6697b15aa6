"""linux_native conformance through the daemon: the external run of the exec, malformed and crash labels against
the daemon's own linux_native plugin (``vz-conformance run --through-daemon``) passes the gate for those labels.

Real runc Machines (root). The driver's host configuration in a private ``VZ_HOME`` gives the daemon's session its
state, image and agent paths; the plugin the crash case kills is the one the daemon counts and relaunches.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from vz_core.daemon import connect, stop_daemon
from vz_core.drivers import HostConfig

pytestmark = pytest.mark.root

SUBNET = "10.233.0.0/16"
LABELS = ("exec", "malformed", "crash")


@pytest.fixture
async def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("the linux_native tests need root (namespaces, cgroups, overlay mounts)")
    for tool in ("runc", "ip", "nft", "nsenter"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: apt-get install runc iproute2 nftables util-linux")
    from vz_drivers._agent import ensure_agent_binary

    agent_binary = str(ensure_agent_binary())
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("VZ_HOME", str(path))
    monkeypatch.setenv("VZ_DAEMON_PLUGIN_IDLE", "0")
    monkeypatch.delenv("VZ_DAEMON_SOCKET", raising=False)
    monkeypatch.delenv("VZ_DAEMON_AUTOSTART", raising=False)
    state, images = tmp_path / "state", tmp_path / "images"
    options = {"state_dir": str(state), "image_dir": str(images), "agent_binary": agent_binary, "subnet": SUBNET}
    HostConfig().save({"linux_native": {**options, "stop_timeout": 5}})
    try:
        yield path
    finally:
        stop_daemon(path)
        from vz_drivers.linux_native import cleanup_state

        await cleanup_state(str(state), image_dir=str(images), agent_binary=agent_binary, subnet=SUBNET)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_exec_malformed_and_crash_labels_pass_through_the_daemons_plugin(home: Path, tmp_path: Path) -> None:
    report = tmp_path / "linux_native-daemon.json"
    labels = [arg for label in LABELS for arg in ("--label", label)]
    command = ["vz-conformance", "run", "--driver", "linux_native", "--provider-mode", "external", "--through-daemon"]
    run = subprocess.run(
        [*command, *labels, "--report", str(report)], capture_output=True, text=True, timeout=850, check=False
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-6000:]
    count = subprocess.run(
        ["vz-conformance", "list", "--count", *labels], capture_output=True, text=True, check=True
    ).stdout.strip()
    verify = ["vz-conformance", "verify-report", str(report), "--provider-mode", "external", *labels]
    gate = subprocess.run([*verify, "--expect-count", count], capture_output=True, text=True, timeout=60, check=False)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    doc = json.loads(report.read_text())
    (external,) = doc["runs"]
    with connect(autostart=False) as conn:
        status: dict[str, Any] = conn.request("System.Status", {})
    (row,) = [r for r in status["plugins"] if r["name"] == "linux_native"]
    assert external["driver"]["plugin_path"] == row["script"] and external["driver"]["sha256"] == row["sha256"]
    # crash.mid_exec SIGKILLed the plugin under test: the daemon counted it as its plugin's crash and relaunched it.
    assert row["crashes"] == 1 and row["launches"] == 2, row
    assert status["pid"] in [p.pid for p in psutil.Process(row["pid"]).parents()]
    assert os.getpid() not in [p.pid for p in psutil.Process(row["pid"]).parents()]
