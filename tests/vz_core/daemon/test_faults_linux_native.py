"""Faults during an exec into a linux_native Machine (a runc container with the guest agent), through the real
daemon and the real `vz` console script: the command's descriptors were passed CLI → daemon → plugin → agent,
so the command's end must not depend on any of those copies noticing EOF.

Needs root (namespaces, cgroups, overlay mounts), like every linux_native test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_faults import clear_error, finish, machines, popen, processes_of, tree, wait_for_file, wait_gone
from vzcli import Vz

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def agent_binary() -> str:
    from vz_drivers.agent import ensure_agent_binary

    return str(ensure_agent_binary())


@pytest.fixture
def native(tmp_path: Path, agent_binary: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Vz, Path]]:
    if os.geteuid() != 0:
        pytest.fail("the linux_native fault tests need root (namespaces, cgroups, overlay mounts)")
    # This process's vz_core.api.Client must present the same daemon-affecting settings as the CLI's.
    monkeypatch.setenv("VZ_AGENT_BINARY", agent_binary)
    vz = Vz(tmp_path / "home", extra_env={"VZ_AGENT_BINARY": agent_binary})
    project = tmp_path / "proj"
    project.mkdir()
    shutil.copyfile(ROOT / "examples" / "default" / "vz.json", project / "vz.json")
    try:
        yield vz, project
    finally:
        vz.run("delete", cwd=project, timeout=120)
        vz.run("daemon", "stop", cwd=project, timeout=60)
        import asyncio

        from vz_drivers.linux_native import cleanup_state

        state = vz.home / "drivers" / "linux_native"
        if state.is_dir():
            asyncio.run(cleanup_state(str(state)))  # type: ignore[arg-type]


def _containers(home: Path) -> dict[str, tuple[int, str]]:
    root = home / "drivers" / "linux_native" / "runc"
    if not root.is_dir():
        return {}
    out = subprocess.run(["runc", "--root", str(root), "list", "-f", "json"], capture_output=True, check=True)
    return {c["id"]: (int(c["pid"]), c["status"]) for c in json.loads(out.stdout or b"null") or []}


def _plugin_pid(home: Path) -> int:
    from vz_core.api import Client

    with Client(home=home, autostart=False) as client:
        (row,) = [p for p in client.daemon_status()["plugins"] if p["name"] == "linux_native"]
    assert row["state"] == "warm" and row["in_flight"] == 1, row
    pid: int = row["pid"]
    return pid


@pytest.mark.parametrize("victim", ["daemon", "plugin"])
def test_sigkill_during_an_exec_into_a_linux_native_machine(native: tuple[Vz, Path], victim: str) -> None:
    vz, project = native
    vz.ok("up", cwd=project)
    before = machines(vz, project)
    containers = _containers(vz.home)
    assert [s for _, s in containers.values()] == ["running"]
    tag = "3017" if victim == "daemon" else "3019"
    marker = project / "started"  # the project is the Machine's read-write /workspace
    with popen(vz, "exec", "--", "sh", "-c", f"echo up > /workspace/started; exec sleep {tag}", cwd=project) as proc:
        wait_for_file(marker, proc)
        (command,) = [p for p, c in processes_of(vz.home, also=f"sleep {tag}").items() if c == f"sleep {tag}"]
        # The Machine's own processes (its init, the agent) are meant to survive: not counted as the victim's.
        machine = set().union(*(tree(pid) for pid, _ in containers.values())) - {command}
        daemon = vz.daemon_pid()
        if victim == "daemon":
            old = tree(daemon) - machine
            os.kill(daemon, signal.SIGKILL)
        else:
            plugin = _plugin_pid(vz.home)
            old = tree(plugin) - machine
            os.kill(plugin, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode not in (0, -signal.SIGKILL)
    if victim == "daemon":
        clear_error(err, "exec", "daemon", f"pid {daemon}", "closed the connection")
    else:
        clear_error(err, "exec", "driver 'linux_native'", "plugin process died")
    wait_gone(old, f"the killed {victim}'s processes")
    wait_gone({command}, "the command in the Machine whose exec lost its plugin")
    assert _containers(vz.home) == containers, "the Machine (its runc container and init) survived"
    assert machines(vz, project) == before
    assert (vz.daemon_pid() == daemon) is (victim == "plugin")
    assert vz.ok("exec", "--", "echo", "next", cwd=project) == "next\n"
    finish(vz, project, also=f"sleep {tag}")
    assert _containers(vz.home) == {}
