"""Concurrent and interrupted `vz up`: one waits, state never corrupts, a killed run is explained and converged."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from vzcli import PLUGINS, Vz, fake_machine, write_project

from vz_core.env._locks import FileLock


def _readline_until(stream: object, needle: bytes) -> list[bytes]:
    seen: list[bytes] = []
    while True:
        line = stream.readline()  # type: ignore[attr-defined]
        assert line, f"stream ended before {needle!r}; got {seen}"
        seen.append(line)
        if needle in line:
            return seen


def test_up_waits_for_an_operation_holding_the_environment(vz: Vz, running: Path) -> None:
    env_id = vz.status(running)["environments"][0]["id"]
    lock = FileLock(vz.home / "locks" / f"{env_id}.lock")
    assert lock.try_acquire("vz stop (pid 424242)")
    proc = vz.popen("up", cwd=running, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        seen = _readline_until(proc.stderr, b"waiting for another operation")
        assert b"vz stop (pid 424242)" in seen[-1]
        assert proc.poll() is None
        lock.release()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and b"is running" in out
    finally:
        lock.release()
        proc.kill()
        proc.communicate()


def test_concurrent_ups_converge_to_one_environment(vz: Vz, project: Path) -> None:
    procs = [vz.popen("up", cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    results = [(p.wait(60), *p.communicate()) for p in procs]
    assert [r[0] for r in results] == [0, 0, 0], [r[2].decode() for r in results]
    report = vz.status(project, "--all")
    (env,) = report["environments"]
    assert [m["state"] for m in env["machines"]] == ["running", "running"]
    ops = json.loads(vz.ok("status", "--json", cwd=project))["environments"][0]["last_operation"]
    assert ops["status"] == "succeeded"


@pytest.fixture
def blocking_project(tmp_path: Path) -> Path:
    once = tmp_path / "blocked-once"
    options = {"once": str(once)}
    return write_project(
        tmp_path / "proj",
        fake_machine("web", driver="blocking", driver_options=options),
        fake_machine("db", driver="blocking", driver_options=options),
        default_machine="web",
    )


def test_killed_up_is_explained_then_converged(tmp_path: Path, blocking_project: Path) -> None:
    vz = Vz(tmp_path / "home", {"PYTHONPATH": str(PLUGINS)})
    proc = vz.popen("up", cwd=blocking_project, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        _readline_until(proc.stderr, b"vz-test-blocking: holding RunImage")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(20) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.communicate()
    env = vz.status(blocking_project)["environments"][0]
    (interrupted,) = env["interrupted_operations"]
    assert interrupted["kind"] == "up" and interrupted["step"] == "create web"
    assert "was interrupted during 'create web'" in interrupted["explanation"]
    assert [m["recorded_state"] for m in env["machines"]] == ["creating"]
    assert "was interrupted during 'create web'" in vz.ok("status", cwd=blocking_project)
    err = vz.fails(2, "exec", "--", "true", cwd=blocking_project)
    assert "is not ready" in err and "run `vz up --environment default`" in err
    proc2 = vz.run("up", cwd=blocking_project)
    assert proc2.returncode == 0, proc2.stderr.decode()
    assert b"was interrupted during 'create web'; this command converges" in proc2.stderr
    assert b"keep web: running (record said creating: adopting it)" in proc2.stderr
    assert b"create db: new machine" in proc2.stderr
    env = vz.status(blocking_project)["environments"][0]
    assert env["interrupted_operations"] == []
    assert [(m["name"], m["state"], m["recorded_state"]) for m in env["machines"]] == [
        ("web", "running", "running"),
        ("db", "running", "running"),
    ]
    vz.ok("exec", "--", "true", cwd=blocking_project)
    vz.ok("delete", cwd=blocking_project)


def test_ctrl_c_interrupts_up_cleanly(tmp_path: Path, blocking_project: Path) -> None:
    vz = Vz(tmp_path / "home", {"PYTHONPATH": str(PLUGINS)})
    proc = vz.popen("up", "--json", cwd=blocking_project, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        _readline_until(proc.stderr, b"vz-test-blocking: holding RunImage")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130
    assert b"vz up: interrupted; run it again to converge" in err and b"Traceback" not in err
    failed = [json.loads(line) for line in out.splitlines() if b'"failed"' in line]
    assert [(e["event"], e["action"], e["machine"]) for e in failed] == [("step", "create", "web")]
    env = vz.status(blocking_project)["environments"][0]
    assert env["interrupted_operations"] == []  # recorded as interrupted by the process itself
    assert env["last_operation"]["status"] == "interrupted"
    vz.ok("up", cwd=blocking_project)
    assert [m["state"] for m in vz.status(blocking_project)["environments"][0]["machines"]] == ["running", "running"]
    vz.ok("delete", cwd=blocking_project)
