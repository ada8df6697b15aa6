"""The VM helper process: refuses to run off macOS; its agent relay joins host clients to guest streams."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vz_drivers.macos_vm._helper import AgentRelay


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal on hosts without the framework")
def test_the_helper_runs_on_macos_only(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "vz_drivers.macos_vm._helper",
        "run",
        "--plan",
        str(tmp_path / "p"),
        "--control",
        str(tmp_path / "c"),
        "--agent",
        str(tmp_path / "a"),
        "--log",
        str(tmp_path / "log"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "macOS only" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_the_relay_joins_each_client_to_a_new_guest_stream(tmp_path: Path) -> None:
    guests: list[socket.socket] = []

    def connect_guest() -> socket.socket:
        host_end, guest_end = socket.socketpair()
        guests.append(guest_end)
        return host_end

    relay = AgentRelay(tmp_path / "agent.sock", connect_guest)
    relay.serve_in_thread()
    try:
        assert (tmp_path / "agent.sock").stat().st_mode & 0o777 == 0o600
        for n in range(2):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(str(tmp_path / "agent.sock"))
                client.sendall(b"hello %d" % n)
                client.shutdown(socket.SHUT_WR)
                guest = _wait_for(guests, n)
                assert _read_all(guest) == b"hello %d" % n
                guest.sendall(b"answer %d" % n)
                guest.shutdown(socket.SHUT_WR)
                assert _read_all(client) == b"answer %d" % n
                guest.close()
        assert len(guests) == 2
    finally:
        relay.close()
    assert not (tmp_path / "agent.sock").exists()


def test_a_guest_that_does_not_answer_closes_the_client(tmp_path: Path) -> None:
    def refuse() -> socket.socket:
        raise OSError("the guest agent is not listening yet")

    relay = AgentRelay(tmp_path / "agent.sock", refuse)
    relay.serve_in_thread()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(tmp_path / "agent.sock"))
            client.settimeout(10)
            assert client.recv(10) == b""
    finally:
        relay.close()


def _wait_for(items: list[socket.socket], index: int) -> socket.socket:
    ready = threading.Event()
    for _ in range(200):
        if len(items) > index:
            return items[index]
        ready.wait(0.02)
    raise AssertionError("the relay never connected to the guest")


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


_DETACH = """
import sys, time
from pathlib import Path
from vz_drivers.macos_vm._helper import _daemonize, _signal_ready

status = _daemonize(Path(sys.argv[1]))
if status is not None:
    sys.exit(status)
print("child says hello", flush=True)  # goes to the log, not to the launcher's stdout
if sys.argv[2] == "ok":
    _signal_ready(b"ready")
else:
    _signal_ready(b"error: the VM configuration is invalid")
    sys.exit(1)
time.sleep(3)  # long enough for the test to look at it
"""


@pytest.mark.parametrize("outcome", ["ok", "fail"])
def test_the_helper_detaches_and_reports_its_pid_once_ready(tmp_path: Path, outcome: str) -> None:
    import psutil

    log = tmp_path / "helper.log"
    done = subprocess.run(
        [sys.executable, "-c", _DETACH, str(log), outcome], capture_output=True, text=True, timeout=60, check=False
    )
    if outcome == "ok":
        assert done.returncode == 0, done.stderr
        pid = int(done.stdout.strip())
        child = psutil.Process(pid)
        assert os.getsid(pid) == pid  # its own session: it outlives the plugin that launched it
        assert child.ppid() != os.getpid()
        child.wait(timeout=30)
    else:
        assert done.returncode == 1
        assert done.stdout == ""
        assert "error: the VM configuration is invalid" in done.stderr
    _wait_for_text(log, "child says hello")


def _wait_for_text(path: Path, text: str) -> None:
    pause = threading.Event()
    for _ in range(500):
        if path.exists() and text in path.read_text():
            return
        pause.wait(0.02)
    raise AssertionError(f"{path} never said {text!r}")
