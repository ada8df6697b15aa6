"""Faults of the vz daemon, with real daemon processes, real plugins and the real `vz` console script.

Each case kills or starves something at a known point and then checks the four things the daemon promises:
a clear message (one line, no traceback, naming what failed), no lost Machine (same ids, found by the next
daemon), no leaked process (the killed daemon's plugins and the commands they ran are gone; after the test
nothing of its home runs) and the next command converging.

The fake driver (Machines are host directories, commands run on the host) serves the cases where the backend
does not matter; test_faults_linux_native.py repeats the exec cases with runc Machines.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from vzcli import Vz, add_test_driver, fake_machine, write_project

pytestmark = pytest.mark.slow


# --- helpers (also used by test_faults_linux_native.py) -----------------------------------------------------


def processes_of(home: Path, also: str | None = None) -> dict[int, str]:
    """pid → command line of every live process whose VZ_HOME is ``home`` or whose command line names ``also``."""
    want = os.fsencode(os.path.realpath(home))
    found: dict[int, str] = {}
    for proc in psutil.process_iter(["pid"]):
        pid = proc.info["pid"]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (OSError, psutil.Error):
            continue
        home_env = env.get(b"VZ_HOME")
        if (home_env is not None and os.path.realpath(home_env) == want) or (also and also in cmdline):
            found[pid] = cmdline
    return found


def tree(pid: int) -> set[int]:
    """``pid`` and all its live descendants."""
    try:
        root = psutil.Process(pid)
        return {pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.Error:
        return set()


def wait_gone(pids: set[int], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        alive = {p for p in pids if _alive(p)}
        if not alive:
            return
        if time.monotonic() > deadline:
            listing = {p: " ".join(_cmdline(p)) for p in alive}
            raise AssertionError(f"{what}: still running after {timeout:.0f} s: {listing}")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        alive: bool = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        return alive
    except psutil.Error:
        return False


def _cmdline(pid: int) -> list[str]:
    try:
        cmdline: list[str] = psutil.Process(pid).cmdline()
        return cmdline
    except psutil.Error:
        return []


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"vz exited {proc.returncode} before {path.name} appeared: {err}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text().strip()


def machines(vz: Vz, project: Path) -> dict[str, tuple[str, str]]:
    """name → (Machine id, live state) of the project's default Environment."""
    (env,) = vz.status(project)["environments"]
    return {m["name"]: (m["id"], m["state"]) for m in env["machines"]}


def clear_error(err: bytes, command: str, *needles: str) -> str:
    """The stderr of a failed command: no traceback, its last line `vz <command>: error: ...` naming ``needles``."""
    text = err.decode(errors="replace")
    assert "Traceback" not in text, text
    last = text.strip().splitlines()[-1]
    assert last.startswith(f"vz {command}: error: "), text
    assert len(last) < 400, last
    for needle in needles:
        assert needle.lower() in last.lower(), (needle, last)
    return last


def finish(vz: Vz, project: Path, also: str | None = None) -> None:
    """Delete the project's Environment, stop the daemon and check nothing of this home is left running."""
    vz.run("delete", cwd=project, timeout=120)
    vz.run("daemon", "stop", cwd=project, timeout=60)
    deadline = time.monotonic() + 20
    while (left := processes_of(vz.home, also)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == {}, f"processes left behind: {left}"


@contextlib.contextmanager
def popen(vz: Vz, *args: str, cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = vz.popen(*args, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


# --- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture
def vz(tmp_path: Path) -> Vz:
    return Vz(tmp_path / "home")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "proj", fake_machine("web"), fake_machine("db"), default_machine="web")


# --- daemon SIGKILL ------------------------------------------------------------------------------------------


def test_daemon_sigkill_during_up(tmp_path: Path) -> None:
    """`vz up` blocked in the driver's RunImage; the daemon is SIGKILLed: the client says the daemon died, the
    next command explains the interrupted operation, `vz up` converges and adopts the Machine it had created."""
    vz = Vz(tmp_path / "home")
    marker = tmp_path / "blocked-once"
    add_test_driver(vz, "blocking", cwd=tmp_path, options={"once": str(marker)})
    project = write_project(
        tmp_path / "proj",
        fake_machine("web", driver="blocking"),
        fake_machine("db", driver="blocking"),
        default_machine="web",
    )
    with popen(vz, "up", cwd=project) as proc:
        wait_for_file(marker, proc)
        daemon = vz.daemon_pid()
        old = tree(daemon)
        assert len(old) >= 2, "the daemon runs the blocking driver as a plugin process"
        os.kill(daemon, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode not in (0, -signal.SIGKILL)
    clear_error(err, "up", "daemon", f"pid {daemon}")
    wait_gone(old, "the SIGKILLed daemon's plugins")

    (env,) = vz.status(project)["environments"]  # a new daemon, started on demand
    assert vz.daemon_pid() != daemon
    (interrupted,) = env["interrupted_operations"]
    assert interrupted["kind"] == "up" and interrupted["pid"] == daemon
    assert "was interrupted during 'create web'" in interrupted["explanation"]
    (web,) = env["machines"]
    assert web["name"] == "web" and web["recorded_state"] == "creating"

    again = vz.run("up", cwd=project, timeout=120)
    assert again.returncode == 0, again.stderr.decode()
    assert b"was interrupted during 'create web'; this command converges" in again.stderr
    assert b"adopting it" in again.stderr
    now = machines(vz, project)
    assert now["web"] == (web["id"], "running"), "the Machine created before the kill was adopted, not remade"
    assert now["db"][1] == "running"
    assert vz.status(project)["environments"][0]["interrupted_operations"] == []
    assert vz.ok("exec", "--", "echo", "converged", cwd=project) == "converged\n"
    finish(vz, project)


def test_daemon_sigkill_during_exec(vz: Vz, project: Path, tmp_path: Path) -> None:
    """The daemon dies while `vz exec` runs a command: the client fails naming the daemon, the command does not
    outlive its plugin, the Machine is still there and the next exec works."""
    vz.ok("up", cwd=project)
    before = machines(vz, project)
    marker = tmp_path / "started"
    tag = "3011"
    with popen(vz, "exec", "--", "sh", "-c", f"echo $$ > {marker}; exec sleep {tag}", cwd=project) as proc:
        command = int(wait_for_file(marker, proc))
        daemon = vz.daemon_pid()
        old = tree(daemon)
        assert command in old, "the fake driver runs the command under its plugin"
        os.kill(daemon, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode not in (0, -signal.SIGKILL)
    clear_error(err, "exec", "daemon", f"pid {daemon}", "closed the connection")
    wait_gone(old, "the SIGKILLed daemon's plugins and the command they ran")
    assert machines(vz, project) == before
    assert vz.daemon_pid() != daemon
    assert vz.ok("exec", "--", "echo", "next", cwd=project) == "next\n"
    finish(vz, project, also=f"sleep {tag}")


def test_daemon_sigkill_between_commands(vz: Vz, project: Path) -> None:
    """Nothing runs when the daemon is SIGKILLed: its plugins go, the next command starts a new daemon over the
    stale pid file and socket, and that daemon finds every Machine (live health from the driver)."""
    vz.ok("up", cwd=project)
    before = machines(vz, project)
    daemon = vz.daemon_pid()
    old = tree(daemon)
    os.kill(daemon, signal.SIGKILL)
    wait_gone(old, "the SIGKILLed daemon and its plugins")
    assert (vz.home / "daemon" / "daemon.json").exists(), "the stale pid file is what the next command meets"

    proc = vz.run("status", "--json", cwd=project)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode()
    (env,) = json.loads(proc.stdout)["environments"]
    assert vz.daemon_pid() != daemon
    assert {m["name"]: (m["id"], m["state"]) for m in env["machines"]} == before
    assert {m["health"]["source"] for m in env["machines"]} == {"driver"}
    assert env["interrupted_operations"] == []
    assert vz.ok("exec", "--machine", "db", "--", "echo", "found", cwd=project) == "found\n"
    up = vz.run("up", cwd=project)
    assert up.returncode == 0 and b"keep web" in up.stderr and b"keep db" in up.stderr, up.stderr.decode()
    assert machines(vz, project) == before
    finish(vz, project)


# --- plugin crash --------------------------------------------------------------------------------------------


def _plugin(home: Path, name: str) -> dict[str, Any]:
    from vz_core.api import Client

    with Client(home=home, autostart=False) as client:
        (row,) = [p for p in client.daemon_status()["plugins"] if p["name"] == name]
    return dict(row)


def test_plugin_crash_during_exec(vz: Vz, project: Path, tmp_path: Path) -> None:
    """SIGKILL of the driver's plugin process while it runs a command: the client's error names the driver, the
    daemon lives on, the next call launches the plugin again and finds the Machine."""
    vz.ok("up", cwd=project)
    before = machines(vz, project)
    daemon = vz.daemon_pid()
    marker = tmp_path / "started"
    tag = "3013"
    with popen(vz, "exec", "--", "sh", "-c", f"echo $$ > {marker}; exec sleep {tag}", cwd=project) as proc:
        command = int(wait_for_file(marker, proc))
        plugin = _plugin(vz.home, "fake")
        assert plugin["state"] == "warm" and plugin["in_flight"] == 1
        old = tree(plugin["pid"])
        assert command in old
        os.kill(plugin["pid"], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode not in (0, -signal.SIGKILL)
    clear_error(err, "exec", "driver 'fake'", "plugin process died", "SIGKILL")
    wait_gone(old, "the killed plugin's command")
    assert vz.daemon_pid() == daemon and _alive(daemon)

    assert vz.ok("exec", "--", "echo", "relaunched", cwd=project) == "relaunched\n"
    after = _plugin(vz.home, "fake")
    assert after["pid"] != plugin["pid"] and after["crashes"] == plugin["crashes"] + 1
    assert after["launches"] == plugin["launches"] + 1
    assert machines(vz, project) == before
    finish(vz, project, also=f"sleep {tag}")


# --- racing autostarts ---------------------------------------------------------------------------------------


def _daemons(home: Path) -> set[int]:
    return {pid for pid, cmd in processes_of(home).items() if "vz_core.daemon" in cmd or cmd.endswith(" daemon run")}


def test_two_clis_racing_to_start_the_daemon(vz: Vz, tmp_path: Path) -> None:
    """Two `vz up` of two projects started at the same instant with no daemon running, three times (the third
    over the stale pid file and socket of a SIGKILLed daemon): each time exactly one daemon serves both, both
    succeed, and every Machine is there."""
    projects = [write_project(tmp_path / f"p{i}", fake_machine("web"), project_id=f"race-{i}") for i in range(2)]
    first: list[tuple[str, str]] = []
    for round_ in range(3):
        assert _daemons(vz.home) == set()
        start = threading.Barrier(2)
        results: list[subprocess.CompletedProcess[bytes] | None] = [None, None]

        def run(i: int, start: threading.Barrier = start, results: list[Any] = results) -> None:
            start.wait()
            results[i] = vz.run("up", cwd=projects[i], timeout=120)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for result in results:
            assert result is not None and result.returncode == 0, result and result.stderr.decode()
            assert b"Traceback" not in result.stderr
        running = _daemons(vz.home)
        assert running == {vz.daemon_pid()}, f"round {round_}: daemons {running}"
        now = [machines(vz, p)["web"] for p in projects]
        assert [state for _, state in now] == ["running", "running"]
        first = first or now
        assert now == first, "the same Machines every round (none lost or remade)"
        if round_ == 1:
            # The last round races over a stale pid file and socket: the daemon was SIGKILLed.
            (pid,) = running
            old = tree(pid)
            os.kill(pid, signal.SIGKILL)
            wait_gone(old, "the SIGKILLed daemon and its plugins")
            assert (vz.home / "daemon" / "daemon.json").exists()
        else:
            vz.ok("daemon", "stop", cwd=projects[0])
            wait_gone(running, "the stopped daemon")
    assert len({machine_id for machine_id, _ in first}) == 2
    for p in projects[1:]:
        vz.run("delete", cwd=p)
    finish(vz, projects[0])


# --- full disk -----------------------------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted at tmp_path/fs (the state dir's parent), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.fail("the full-disk test mounts a tmpfs: it needs root")
    where = tmp_path / "fs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        for pid in _daemons(where / "home"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_gone(_daemons(where / "home"), "the daemon on the small filesystem")
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(fs: Path) -> Path:
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    assert os.statvfs(fs).f_bavail == 0
    return filler


@pytest.mark.parametrize(
    "daemon_running",
    [True, False],
    ids=["daemon-running", "daemon-starting"],
)
def test_full_disk_under_the_state_dir(small_fs: Path, tmp_path: Path, daemon_running: bool) -> None:
    """No space left where VZ_HOME lives: `vz stop` fails naming the state dir and "no space" (with the daemon
    running, and with one started on the full disk), nothing recorded is lost, and once space is freed the
    same command converges."""
    vz = Vz(small_fs / "home")
    project = write_project(tmp_path / "proj", fake_machine("web"), fake_machine("db"), default_machine="web")
    vz.ok("up", cwd=project)
    before = machines(vz, project)
    if not daemon_running:
        vz.ok("daemon", "stop", cwd=project)
    filler = _fill(small_fs)
    try:
        failed = vz.run("stop", cwd=project, timeout=120)
        # 2: the store refused the write; 69: the daemon could not start on the full filesystem.
        assert failed.returncode in (2, 69), failed.stderr.decode()
        message = clear_error(failed.stderr, "stop", str(vz.home), "no space")
        if daemon_running:
            # Reading and running commands need no space: the daemon serves them.
            assert machines(vz, project) == before, "a failed write lost or changed a Machine"
            assert vz.ok("exec", "--", "echo", "still", cwd=project) == "still\n"
        else:
            # No daemon can start (it writes its pid file and log): every command says so, the same way.
            status = vz.run("status", cwd=project)
            assert status.returncode == 69
            clear_error(status.stderr, "status", str(vz.home), "no space")
    finally:
        filler.unlink()
    assert machines(vz, project) == before, "the failed command lost or changed a Machine"
    out = vz.run("stop", cwd=project, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    assert {state for _, state in machines(vz, project).values()} == {"stopped"}
    vz.ok("up", cwd=project)
    assert machines(vz, project) == before
    finish(vz, project)
    # Last, so that everything above is checked in both variants: the message says what to do.
    assert "free space" in message.lower(), message


# --- the typed client ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["local", "grpc"])
def test_api_client_sees_a_daemon_sigkill_during_an_exec(
    vz: Vz, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """A program on vz_core.api streaming an exec's output when the daemon dies: ApiError (unavailable, naming
    the daemon), then a new Client autostarts a daemon that finds the Machines and runs the next exec."""
    from vz_core.api import ApiError, Client, default_context

    for key in [k for k in os.environ if k.startswith("VZ_")]:
        monkeypatch.delenv(key)  # the same daemon-affecting settings as the CLI's (vzcli drops VZ_*)
    vz.ok("up", cwd=project)
    before = machines(vz, project)
    context = default_context(cwd=project, environ=vz.env())
    marker = tmp_path / "started"
    with Client(home=vz.home, transport=transport, context=context) as client:
        call = client.open_exec(["sh", "-c", f"echo $$ > {marker}; echo ready; exec sleep 3023"])
        try:
            assert call.receive() == ("output", 1, b"ready\n")
            daemon = vz.daemon_pid()
            old = tree(daemon)
            os.kill(daemon, signal.SIGKILL)
            with pytest.raises(ApiError) as failed:
                while True:
                    call.receive()
        finally:
            call.close()
    error = failed.value
    assert error.kind in ("unavailable", "backend_failure") and error.exit_code != 0, error.to_wire()
    assert "daemon" in error.message and "Traceback" not in error.message, error.message
    wait_gone(old, "the SIGKILLed daemon's plugins and the command they ran")
    with Client(home=vz.home, transport=transport, context=context) as client:
        found = {m["name"]: (m["id"], m["state"]) for m in client.machines()}
        assert found == before
        assert client.exec(["echo", "again"]).stdout == b"again\n"
        assert client.daemon_status()["pid"] != daemon
    finish(vz, project, also="sleep 3023")
