"""Real daemon processes: on-demand start, the files it keeps, no TCP, stale files, racing starts, version
checks (replace an idle daemon, refuse to replace a busy one, refuse an older client), idle exit, signals,
VZ_DAEMON_AUTOSTART=0 and `vz daemon ...`. Every test stops the daemons it started."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from vz_core.daemon import (
    DaemonError,
    DaemonPaths,
    connect,
    daemon_paths,
    fingerprint,
    live_daemon,
    read_pid_file,
    stop_daemon,
    version,
)

# A daemon process with a test handler ("Test.Hold" stays in flight until a file exists) and an optional
# version, so that the client's version logic meets a daemon of another vz.
HELPER = textwrap.dedent(
    """
    import asyncio, os, sys
    from vz_core.daemon import run_daemon

    async def handler(call):
        if call.method == "Test.Hold":
            while not os.path.exists(call.request["release"]):
                await asyncio.sleep(0.02)
            return {"held": True}
        return {"echo": call.request}

    sys.exit(run_daemon(handler=handler, ready_fd=int(sys.argv[1]), daemon_version=sys.argv[2] or None))
    """
)


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_DAEMON")}
    env["VZ_HOME"] = str(home)
    env.update(extra)
    return env


def _daemon_pids(home: Path) -> list[int]:
    """Every process running a vz daemon for ``home`` (by command line and VZ_HOME)."""
    pids = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = proc.info["cmdline"] or []
            environ = proc.info["environ"] or {}
        except psutil.Error:
            continue
        if any("vz_core.daemon" in part for part in cmdline) and environ.get("VZ_HOME") == str(home):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    pids.append(proc.pid)
            except psutil.Error:
                continue
    return pids


def _gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    yield home
    stop_daemon(home, environ=_env(home))
    assert _daemon_pids(home) == [], "a daemon of this test is still running"


class Helper:
    """A daemon process with the test handler, started by the test (so it is the test's child)."""

    def __init__(self, home: Path, daemon_version: str = "", **env: str) -> None:
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HELPER, str(write_fd), daemon_version],
            env=_env(home, **env),
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as ready:
            line = ready.readline()
        if not line.startswith(b"ready"):
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"the helper daemon did not start: {line!r} {err.decode()}")
        self.pid = self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def helpers() -> Iterator[list[Helper]]:
    started: list[Helper] = []
    yield started
    for helper in started:
        helper.stop()


def test_connect_starts_a_detached_daemon_with_private_files(home: Path) -> None:
    env = _env(home)
    conn = connect(environ=env)
    with conn:
        pid = conn.pid
        assert conn.hello["version"] == version() and conn.hello["fingerprint"] == fingerprint(env)
    paths = daemon_paths(environ=env)
    proc = psutil.Process(pid)
    assert proc.ppid() != os.getpid()  # not our child: reparented when its launcher exited
    assert os.getsid(pid) != os.getsid(0)  # its own session
    assert proc.cwd() == "/"
    log = os.path.realpath(paths.log_file)
    assert os.readlink(f"/proc/{pid}/fd/1") == log and os.readlink(f"/proc/{pid}/fd/2") == log
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    record = read_pid_file(paths)
    assert record is not None
    assert set(record) == {"pid", "version", "fingerprint", "socket", "started", "proc_start"}
    assert (record["pid"], record["socket"], record["version"]) == (pid, paths.socket, version())
    assert live_daemon(paths) == record
    for path, mode in [(paths.directory, 0o700), (paths.socket, 0o600), (paths.pid_file, 0o600)]:
        assert os.stat(path).st_mode & 0o777 == mode, path
    assert os.stat(paths.log_file).st_mode & 0o777 == 0o600
    assert "listening on" in Path(paths.log_file).read_text()
    with connect(environ=env) as again:  # a second command reuses it
        assert again.pid == pid
    assert _daemon_pids(home) == [pid]


def test_no_tcp_listener(home: Path) -> None:
    env = _env(home)
    with connect(environ=env) as conn:
        pid = conn.pid
    proc = psutil.Process(pid)
    assert proc.net_connections(kind="inet") == []

    def sockets() -> set[str]:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except FileNotFoundError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
        return inodes

    def table(name: str, column: int) -> set[str]:
        rows = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        return {row.split()[column] for row in rows if len(row.split()) > column}

    for _ in range(100):  # a connection that just closed may still be going away: settle first
        before = sockets()
        unix = table("unix", 6)
        netlink = table("netlink", 9)  # e.g. a resolver or interface query of a library: not a listener
        inet = set().union(*(table(name, 9) for name in ("tcp", "tcp6", "udp", "udp6")))
        inodes = before & sockets()  # held across both reads: not one going away
        if inodes <= unix | netlink:
            break
        time.sleep(0.05)
    assert inodes, "the daemon holds no socket at all?"
    assert not inodes & inet, "the daemon has a TCP or UDP socket"
    assert inodes <= unix | netlink, f"sockets of no known family: {sorted(inodes - unix - netlink)}"


def test_stale_pid_file_and_socket_are_replaced(home: Path) -> None:
    env = _env(home)
    paths = daemon_paths(environ=env)
    os.makedirs(paths.directory, mode=0o700)
    bystander = subprocess.Popen(["sleep", "60"])  # a live process that is not a daemon
    try:
        record = {"pid": bystander.pid, "version": version(), "fingerprint": fingerprint(env)}
        Path(paths.pid_file).write_text(json.dumps({**record, "socket": paths.socket, "proc_start": 1}))
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(paths.socket)  # a socket file nobody listens on
        stale.close()
        assert live_daemon(paths) is None  # wrong start time and command line: not a daemon
        assert stop_daemon(home, environ=env) is None  # and it is never signalled
        assert bystander.poll() is None
        with connect(environ=env) as conn:
            pid = conn.pid
        assert pid != bystander.pid and bystander.poll() is None
        new = read_pid_file(paths)
        assert new is not None and new["pid"] == pid and live_daemon(paths) == new
    finally:
        bystander.kill()
        bystander.wait()


def test_stale_pid_of_a_dead_process_and_damaged_pid_file(home: Path) -> None:
    env = _env(home)
    paths = daemon_paths(environ=env)
    os.makedirs(paths.directory, mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    Path(paths.pid_file).write_text(json.dumps({"pid": dead.pid, "proc_start": 5}))
    assert live_daemon(paths) is None
    Path(paths.pid_file).write_text("{not json")
    assert read_pid_file(paths) is None
    with connect(environ=env) as conn:
        assert read_pid_file(paths) == {**(read_pid_file(paths) or {}), "pid": conn.pid}


def test_racing_connects_start_exactly_one_daemon(home: Path) -> None:
    env = _env(home)
    code = "from vz_core.daemon import connect; c = connect(); print(c.pid); c.close()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err.decode() for _, err in outputs]
    pids = {int(out) for out, _ in outputs}
    assert len(pids) == 1
    assert _daemon_pids(home) == list(pids)


def test_idle_daemon_with_other_settings_is_replaced(home: Path) -> None:
    old_env = _env(home, VZ_DAEMON_IDLE_TIMEOUT="600")
    with connect(environ=old_env) as conn:
        old = conn.pid
    new_env = _env(home, VZ_DAEMON_IDLE_TIMEOUT="700")  # a daemon-affecting variable: another fingerprint
    with connect(environ=new_env) as conn:
        assert conn.pid != old and conn.hello["fingerprint"] == fingerprint(new_env)
    assert _gone(old)
    assert _daemon_pids(home) == [conn.pid]
    assert "System.Shutdown from pid" in Path(daemon_paths(environ=new_env).log_file).read_text()


def test_older_idle_daemon_is_replaced(home: Path, helpers: list[Helper]) -> None:
    helper = Helper(home, "0.0.1")
    helpers.append(helper)
    env = _env(home)
    with connect(environ=env) as conn:
        assert conn.pid != helper.pid and conn.hello["version"] == version()
    assert helper.proc.wait(15) == 0


def test_older_busy_daemon_is_not_replaced(home: Path, helpers: list[Helper], tmp_path: Path) -> None:
    helper = Helper(home, "0.0.1")
    helpers.append(helper)
    env = _env(home)
    release = tmp_path / "release"
    with pytest.raises(DaemonError, match=r"replace it with `vz daemon stop` and `vz daemon start`"):
        connect(environ={**env, "VZ_DAEMON_AUTOSTART": "0"})  # idle, but this command may not start one
    assert helper.proc.poll() is None
    # Keep an operation in flight on the old daemon (a raw client: ours would replace it first).
    from vz_core.wire._frames import Channel

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(daemon_paths(environ=env).socket)
    channel = Channel(sock)
    channel.send({"hello": {"protocol": 1, "version": "0.0.1", "fingerprint": "x", "pid": os.getpid()}})
    assert channel.receive() is not None
    channel.send({"call": {"method": "Test.Hold", "request": {"release": str(release)}}})
    time.sleep(0.3)
    with pytest.raises(DaemonError) as exc:
        connect(environ=env)
    message = str(exc.value)
    assert f"(pid {helper.pid}) runs vz 0.0.1, older than this vz {version()}" in message
    assert "operations in flight" in message and "`vz daemon stop`" in message
    assert (exc.value.kind, exc.value.exit_code) == ("conflict", 4)
    assert helper.proc.poll() is None
    release.touch()
    assert channel.receive() == ({"result": {"held": True}}, [])
    channel.close()


def test_newer_daemon_is_left_alone(home: Path, helpers: list[Helper]) -> None:
    helper = Helper(home, "99.0")
    helpers.append(helper)
    with pytest.raises(DaemonError) as exc:
        connect(environ=_env(home))
    assert f"runs vz 99.0, newer than this vz {version()}" in str(exc.value)
    assert "`vz daemon stop`" in str(exc.value) and exc.value.exit_code == 2
    assert helper.proc.poll() is None


def test_autostart_off_fails_fast_naming_the_command(home: Path) -> None:
    env = _env(home, VZ_DAEMON_AUTOSTART="0")
    started = time.monotonic()
    with pytest.raises(DaemonError) as exc:
        connect(environ=env)
    assert time.monotonic() - started < 1.0
    socket = daemon_paths(environ=env).socket
    assert str(exc.value).startswith(f"no vz daemon runs for {home} (nothing listens on {socket}); start it with")
    assert (exc.value.code, exc.value.kind, exc.value.exit_code) == ("UNAVAILABLE", "unavailable", 69)
    assert not os.path.exists(daemon_paths(environ=env).pid_file)
    assert _daemon_pids(home) == []


def test_idle_exit_removes_socket_and_pid_file(home: Path) -> None:
    env = _env(home, VZ_DAEMON_IDLE_TIMEOUT="0.5")
    with connect(environ=env) as conn:
        pid = conn.pid
    paths = daemon_paths(environ=env)
    assert _gone(pid, 15)
    assert not os.path.exists(paths.socket) and not os.path.exists(paths.pid_file)
    assert "idle for 0.5 s with no operation in flight" in Path(paths.log_file).read_text()


def test_sigterm_is_a_graceful_stop(home: Path) -> None:
    env = _env(home)
    with connect(environ=env) as conn:
        pid = conn.pid
    os.kill(pid, signal.SIGTERM)
    assert _gone(pid)
    paths = daemon_paths(environ=env)
    assert not os.path.exists(paths.socket) and not os.path.exists(paths.pid_file)
    assert "shutting down: signal SIGTERM" in Path(paths.log_file).read_text()


def test_sigkilled_daemon_is_replaced_by_the_next_command(home: Path) -> None:
    env = _env(home)
    with connect(environ=env) as conn:
        pid = conn.pid
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    paths = daemon_paths(environ=env)
    assert os.path.exists(paths.socket) and os.path.exists(paths.pid_file)  # left behind
    with connect(environ=env) as conn:
        assert conn.pid != pid
    assert read_pid_file(paths) is not None and live_daemon(paths) is not None


def test_custom_socket_path(home: Path, tmp_path: Path) -> None:
    sock_dir = tmp_path / "run" / "vz"
    env = _env(home, VZ_DAEMON_SOCKET=str(sock_dir / "d.sock"))
    with connect(environ=env) as conn:
        assert conn.paths.socket == str(sock_dir / "d.sock")
    assert os.stat(sock_dir).st_mode & 0o777 == 0o700
    assert stat_is_socket(sock_dir / "d.sock")
    assert not os.path.exists(os.path.join(str(home), "daemon", "vz.sock"))
    os.chmod(sock_dir, 0o777)
    try:
        with pytest.raises(DaemonError, match="others may write to it"):
            connect(environ=env)
    finally:
        os.chmod(sock_dir, 0o700)
    with pytest.raises(DaemonError, match="is not an absolute path"):
        connect(environ=_env(home, VZ_DAEMON_SOCKET="rel/d.sock"))
    stop_daemon(home, environ=env)


def stat_is_socket(path: Path) -> bool:
    import stat

    return stat.S_ISSOCK(os.stat(path).st_mode)


def _vz(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from vz_core.cli._daemon_cmd import run_daemon_command as r; sys.exit(r(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=_env(home, **env), capture_output=True, text=True, timeout=120
    )


def test_daemon_command(home: Path) -> None:
    not_running = _vz(home, "status")
    assert (not_running.returncode, not_running.stdout) == (3, f"no vz daemon runs for {home}\n")
    started = _vz(home, "start")
    assert started.returncode == 0 and started.stdout.startswith("vz daemon started pid "), started.stderr
    pid = int(started.stdout.split()[4])
    again = _vz(home, "start", "--json")
    assert json.loads(again.stdout) == {
        "pid": pid,
        "version": version(),
        "socket": str(home / "daemon" / "vz.sock"),
        "started": False,
    }
    status = _vz(home, "status", "--json")
    doc: dict[str, Any] = json.loads(status.stdout)
    assert doc["running"] is True and doc["pid"] == pid and doc["version"] == version() and "operations" in doc
    plain = _vz(home, "status")
    assert f"vz daemon pid {pid}" in plain.stdout and "socket" in plain.stdout
    logs = _vz(home, "logs", "-n", "5")
    assert f"(pid {pid}) listening on" in logs.stdout
    stopped = _vz(home, "stop")
    assert stopped.stdout == f"stopped the vz daemon (pid {pid})\n"
    assert _gone(pid)
    assert _vz(home, "stop").stdout == f"no vz daemon runs for {home}\n"
    bad = _vz(home, "frobnicate")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    off = _vz(home, "status", VZ_DAEMON_AUTOSTART="0")
    assert off.returncode == 3


def test_daemon_paths_under_a_foreign_or_symlinked_dir(tmp_path: Path) -> None:
    from vz_core.wire._paths import ensure_private_dir

    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(DaemonError, match="is a symbolic link"):
        ensure_private_dir(str(link))
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    with pytest.raises(DaemonError, match="owned by uid 65534"):
        ensure_private_dir(str(foreign))
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(DaemonError, match=r"others may write to it \(mode 0777\)"):
        ensure_private_dir(str(open_dir))
    readable = tmp_path / "readable"
    readable.mkdir()
    os.chmod(readable, 0o755)
    ensure_private_dir(str(readable))  # ours, only readable by others: fixed
    assert os.stat(readable).st_mode & 0o777 == 0o700
    fresh = tmp_path / "a" / "b" / "daemon"
    ensure_private_dir(str(fresh))
    assert os.stat(fresh).st_mode & 0o777 == 0o700
    plain = tmp_path / "file"
    plain.write_text("")
    with pytest.raises(DaemonError, match="is not a directory"):
        ensure_private_dir(str(plain))
    assert DaemonPaths(str(tmp_path)).socket == str(tmp_path / "daemon" / "vz.sock")


def test_daemon_exits_when_its_socket_is_removed(home: Path) -> None:
    env = _env(home)
    with connect(environ=env) as conn:
        pid = conn.pid
    paths = daemon_paths(environ=env)
    os.unlink(paths.socket)  # e.g. its state directory was deleted
    assert _gone(pid, 20)
    assert "was removed or replaced" in Path(paths.log_file).read_text()
    assert not os.path.exists(paths.pid_file)


def test_grpc_front_starts_on_the_first_http2_connection(home: Path) -> None:
    env = _env(home)
    with connect(environ=env) as conn:
        pid = conn.pid
    paths = daemon_paths(environ=env)
    assert not os.path.exists(paths.grpc_socket)  # a daemon only the local wire used has not started it
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(paths.socket)
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # + SETTINGS
        frame = b""
        while len(frame) < 9:
            chunk = s.recv(9 - len(frame))
            assert chunk, "the daemon closed the HTTP/2 connection"
            frame += chunk
    assert frame[3] == 0x04  # the server's first frame is its SETTINGS: a real HTTP/2 server answered
    assert os.path.exists(paths.grpc_socket)
    assert "gRPC front started" in Path(paths.log_file).read_text()
    assert stop_daemon(home, environ=env) == pid
    assert not os.path.exists(paths.grpc_socket)


def test_vz_daemon_run_in_the_foreground(home: Path) -> None:
    import shutil

    vz = shutil.which("vz", path=os.path.dirname(sys.executable))
    assert vz is not None
    env = _env(home)
    proc = subprocess.Popen([vz, "daemon", "run"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        paths = daemon_paths(environ=env)
        deadline = time.monotonic() + 60
        record = None
        while record is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            record = live_daemon(paths)  # `vz daemon run` counts as a daemon's command line
        assert record is not None and record["pid"] == proc.pid
        with connect(environ={**env, "VZ_DAEMON_AUTOSTART": "0"}) as conn:
            assert conn.pid == proc.pid
        second = _vz(home, "run")  # one daemon per home
        assert second.returncode == 4 and "a vz daemon already runs for" in second.stderr
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        assert proc.stderr is not None
        assert "shutting down: signal SIGINT" in proc.stderr.read().decode()  # the log is echoed on stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_racing_newer_clients_replace_an_idle_old_daemon_once(home: Path, helpers: list[Helper]) -> None:
    helper = Helper(home, "0.0.1")
    helpers.append(helper)
    env = _env(home)
    code = "from vz_core.daemon import connect; c = connect(); print(c.pid, c.hello['version']); c.close()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err.decode() for _, err in outputs]
    answers = {out.decode().strip() for out, _ in outputs}
    assert len(answers) == 1
    pid, answered_version = answers.pop().split()
    assert answered_version == version() and int(pid) != helper.pid
    assert helper.proc.wait(15) == 0
    assert _daemon_pids(home) == [int(pid)]
