"""#26 item 7, the small ones.

(a) The local wire: malformed frames (a 4 GiB length, a zero length, an unknown kind, bad UTF-8, JSON nested
100,000 deep) sent to a real daemon over its real socket, as the first message, as the call and in the middle
of a call, are each answered with the error docs/daemon.md promises ("Malformed input ends that connection with
an error naming what was wrong; the daemon carries on"), then the connection closes; the daemon still answers.

(c) `vz exec -- /$SECRET` (and in test_r3_03_secret_selectors.py for linux_native, whose guest agent writes the
"no such file" line): the Machine's own message naming the command is masked.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_core" / "cli"))
from vzcli import Vz, fake_machine, write_project

from vz_core.daemon import PROTOCOL, Channel, DaemonPaths
from vz_core.wire._frames import encode_json

DEEP = 100_000
MALFORMED = {
    "4 GiB length": (b"\xff\xff\xff\xff" + b"J", "declared length 4294967295; the local wire allows 1 to"),
    "zero length": (b"\x00\x00\x00\x00", "declared length 0; the local wire allows 1 to"),
    "unknown kind": (b"\x00\x00\x00\x03X{}", "unknown message kind 'X'"),
    "bad UTF-8": (b"\x00\x00\x00\x04J\xff{}", "is not valid UTF-8"),
    "100k-deep JSON": (
        (1 + 2 * DEEP + 6).to_bytes(4, "big") + b'J{"a":' + b"[" * DEEP + b"]" * DEEP + b"}",
        "nests arrays or objects too deeply",
    ),
}


@pytest.fixture
def daemon(tmp_path: Path) -> tuple[Vz, DaemonPaths, int]:
    vz = Vz(tmp_path / "home")
    vz.ok("daemon", "start", cwd=tmp_path)
    paths = DaemonPaths(str(vz.home))
    return vz, paths, vz.daemon_pid()


def _connect(paths: DaemonPaths) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)  # a bound on a broken daemon, not a measurement
    sock.connect(paths.socket)
    return sock


def _hello(sock: socket.socket) -> None:
    sock.sendall(encode_json({"hello": {"protocol": PROTOCOL, "version": "test", "fingerprint": "", "pid": 1}}))
    got = Channel(sock).receive()
    assert got is not None and "hello" in got[0], got


def _answer(sock: socket.socket) -> dict[str, object]:
    """The daemon's last message before it closes the connection: the error object."""
    channel = Channel(sock)
    last = None
    while True:
        got = channel.receive()
        if got is None:
            break
        last = got[0]
        if isinstance(last, dict) and ("error" in last or "result" in last):
            assert channel.receive() is None  # then the connection ends
            break
    assert isinstance(last, dict) and isinstance(last.get("error"), dict), last
    error: dict[str, object] = last["error"]
    return error


def _still_answers(paths: DaemonPaths, pid: int) -> None:
    sock = _connect(paths)
    try:
        _hello(sock)
        sock.sendall(encode_json({"call": {"method": "System.Status", "request": {}}}))
        channel = Channel(sock)
        while (got := channel.receive()) is not None and "result" not in got[0]:
            pass
        assert got is not None and got[0]["result"]["pid"] == pid, got
    finally:
        sock.close()


@pytest.mark.parametrize("where", ["first message", "as the call", "during a call"])
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_frames_are_answered_with_an_error_naming_them(
    daemon: tuple[Vz, DaemonPaths, int], case: str, where: str
) -> None:
    vz, paths, pid = daemon
    frame, expected = MALFORMED[case]
    sock = _connect(paths)
    try:
        if where != "first message":
            _hello(sock)
        if where == "during a call":  # a call that runs until the client stops it
            sock.sendall(encode_json({"call": {"method": "System.Events", "request": {"follow": True}}}))
        sock.sendall(frame)
        error = _answer(sock)
    finally:
        sock.close()
    assert expected in str(error["message"]), error
    assert error["kind"] == "backend_failure" and error["code"] == "INTERNAL"
    _still_answers(paths, pid)
    log = (vz.home / "daemon" / "daemon.log").read_text()
    assert "Traceback" not in log, log


def test_exec_of_a_command_named_by_a_secret_masks_the_machines_message(tmp_path: Path) -> None:
    canary = "canary-" + secrets.token_hex(12)
    vz = Vz(tmp_path / "home")
    proj = write_project(tmp_path / "p", fake_machine("web", environment={"TOKEN": {"from_env": "RT_SECRET_TOKEN"}}))
    env = {"RT_SECRET_TOKEN": canary}
    try:
        vz.ok("up", cwd=proj, env=env)
        for command in (f"/{canary}", f"/x{canary}y"):
            proc = vz.run("exec", "--", command, cwd=proj, env=env)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 127, out
            assert canary.encode() not in out
            assert b"/***" in out or b"/x***y" in out, out
        # Ordinary output is the command's own and is not touched.
        proc = vz.run("exec", "--", "sh", "-c", 'printf %s "$TOKEN" >&2', cwd=proj, env=env)
        assert proc.returncode == 0 and proc.stderr == canary.encode()
    finally:
        vz.run("delete", cwd=proj, env=env)
    assert json.dumps(os.listdir(vz.home))  # the home exists (the daemon ran)


@pytest.fixture(scope="module")
def agent_binary() -> str:
    from vz_drivers.agent import ensure_agent_binary

    return str(ensure_agent_binary())


@pytest.mark.root
@pytest.mark.slow
def test_wget_in_the_default_image_reports_a_refused_connection(tmp_path: Path, agent_binary: str) -> None:
    """(b) Debian 12's busybox (1.35, the only one its packages offer) is built without wget's -T, and parsing
    -T writes through a null pointer: `wget -T N` segfaults whatever the server does (docs/images.md says so).
    What the image offers instead works against a refused port on the Machine's loopback: wget says why and
    exits 1, and `timeout N wget` bounds it."""
    if os.geteuid() != 0:
        pytest.fail("needs root (linux_native: namespaces, cgroups, runc)")
    vz = Vz(tmp_path / "home", {"VZ_AGENT_BINARY": agent_binary})
    proj = write_project(tmp_path / "p", fake_machine("web", driver="linux_native"))
    try:
        vz.ok("up", cwd=proj)
        for command in ("wget -O- http://127.0.0.1:1/", "timeout 3 wget -O- http://127.0.0.1:1/"):
            proc = vz.run("exec", "--", "sh", "-c", command, cwd=proj)
            err = proc.stderr.decode()
            assert proc.returncode == 1, (command, proc.returncode, err)
            assert "can't connect to remote host (127.0.0.1): Connection refused" in err, err
    finally:
        vz.run("delete", cwd=proj)
