"""Concurrent and interrupted `vz up`: one waits, state never corrupts, a killed run is explained and converged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from vzcli import Vz, add_test_driver, fake_machine, write_project

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
def blocking_vz(tmp_path: Path) -> Vz:
    vz = Vz(tmp_path / "home")
    add_test_driver(vz, "blocking", cwd=tmp_path, options={"once": str(tmp_path / "blocked-once")})
    return vz


@pytest.fixture
def blocking_project(tmp_path: Path) -> Path:
    return write_project(
        tmp_path / "proj",
        fake_machine("web", driver="blocking"),
        fake_machine("db", driver="blocking"),
        default_machine="web",
    )


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Wait until ``path`` exists (the blocking driver writes it when it starts holding RunImage)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"vz exited {proc.returncode} before the driver blocked: {err}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_up_whose_daemon_is_killed_is_explained_then_converged(
    tmp_path: Path, blocking_vz: Vz, blocking_project: Path
) -> None:
    """The process running the operation (the daemon) dies: the client says so, the next commands converge."""
    vz = blocking_vz
    proc = vz.popen("up", cwd=blocking_project, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(tmp_path / "blocked-once", proc)
        daemon = vz.daemon_pid()
        os.kill(daemon, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode not in (0, -signal.SIGKILL), err.decode()
    message = err.decode()
    assert "Traceback" not in message and "vz up: error: " in message and "daemon" in message, message
    assert len(message.strip().splitlines()[-1]) < 300
    env = vz.status(blocking_project)["environments"][0]  # a new daemon starts on demand
    (interrupted,) = env["interrupted_operations"]
    assert interrupted["kind"] == "up" and interrupted["step"] == "create web"
    assert interrupted["pid"] == daemon
    assert "was interrupted during 'create web'" in interrupted["explanation"]
    assert [m["recorded_state"] for m in env["machines"]] == ["creating"]
    assert "was interrupted during 'create web'" in vz.ok("status", cwd=blocking_project)
    refused = vz.fails(125, "exec", "--", "true", cwd=blocking_project)
    assert "is not ready" in refused and "run `vz up --environment default`" in refused
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


def test_a_killed_client_cancels_its_up(tmp_path: Path, blocking_vz: Vz, blocking_project: Path) -> None:
    """SIGKILL of `vz up` closes its connection: the daemon cancels the operation as Ctrl-C would."""
    vz = blocking_vz
    proc = vz.popen("up", cwd=blocking_project, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(tmp_path / "blocked-once", proc)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(20) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.communicate()
    deadline = time.monotonic() + 30
    while (env := vz.status(blocking_project)["environments"][0])["last_operation"]["status"] == "running":
        assert time.monotonic() < deadline, env["last_operation"]
        time.sleep(0.1)
    assert env["last_operation"]["status"] == "interrupted" and env["interrupted_operations"] == []
    vz.ok("up", cwd=blocking_project)
    assert [m["state"] for m in vz.status(blocking_project)["environments"][0]["machines"]] == ["running", "running"]
    vz.ok("delete", cwd=blocking_project)


def test_ctrl_c_interrupts_up_cleanly(tmp_path: Path, blocking_vz: Vz, blocking_project: Path) -> None:
    vz = blocking_vz
    proc = vz.popen("up", "--json", cwd=blocking_project, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(tmp_path / "blocked-once", proc)
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
