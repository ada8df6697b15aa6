"""End to end in a real terminal: `vz exec -it` driven through tmux (send-keys, capture-pane).

A tmux server on a private socket (``tmux -L <unique>``) runs a plain ``sh`` in a pane; the test types into
it as a user would: `vz exec -it -- sh` opens an interactive shell in the Machine, and the checks read the
pane. Covered: the prompt, ``stty size`` before and after ``tmux resize-window``, busybox ``vi`` opening,
editing and saving a file, ``sleep 100`` then Ctrl-C back to the prompt, Ctrl-D ending the shell with exit
status 0, and the pane's own terminal settings (``stty -a``) identical before and after, also when vz is
killed (SIGTERM, SIGHUP) or the session's command is killed from outside. The tmux server is
killed at the end and the test checks that nothing of it is left.

Drivers: every test runs on the fake (a pseudo-terminal on the host) and on linux_native (busybox ``sh`` in
the Machine), except the one that kills the command from the host, which needs host-visible processes; the
interactive-shell test also runs in a qemu Machine. One Machine per driver serves the whole module.
``VZ_E2E_DRIVER`` set keeps only that driver (another installed driver whose extensions declare terminals
runs every test that is not fake-only).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ONLY = os.environ.get("VZ_E2E_DRIVER")
KNOWN = ("fake", "linux_native", "qemu")
IMAGE = os.environ.get("VZ_E2E_IMAGE", "vz:default")
HOST_PROMPT = "host-pane$ "

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (Debian package tmux)"),
]


def _drivers(*candidates: str) -> list[str]:
    """The drivers a test runs on: ``candidates``, narrowed to ``VZ_E2E_DRIVER`` when that is set."""
    if ONLY is None:
        return list(candidates)
    return [ONLY] if ONLY in candidates or ONLY not in KNOWN else []


def _on(*candidates: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("project", _drivers(*candidates), indirect=True)


def _vz() -> str:
    beside = Path(sys.executable).parent / "vz"
    return str(beside) if beside.exists() else (shutil.which("vz") or "vz")


class Tmux:
    """One private tmux server with one pane running ``sh``; ``close()`` kills the server."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.name = f"vz-pty-{secrets.token_hex(6)}"
        self.workdir = workdir
        self.env = env
        self.tmux(
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "100",
            "-y",
            "30",
            "-c",
            str(workdir),
            "env",
            "-i",
            *[f"{k}={v}" for k, v in env.items()],
            "sh",
        )
        self.send_line(f"PS1={shlex.quote(HOST_PROMPT)}")
        self.wait_for(r"host-pane\$\s*$")

    def tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.name, *args], capture_output=True, text=True, timeout=30, check=False)
        if out.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)} failed: {out.stderr}")
        return out.stdout

    def send_line(self, text: str) -> None:
        self.tmux("send-keys", "-t", "t", "-l", text)
        self.tmux("send-keys", "-t", "t", "Enter")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t", "-S", "-200")

    def settle(self, within: float = 20.0) -> None:
        """Wait until the host shell shows a bare prompt on its last line, so that the next line is not typed
        ahead (echoed before the prompt, with the command's output then after the prompt on one line)."""
        deadline = time.monotonic() + within
        while True:
            lines = [line.rstrip() for line in self.screen().splitlines() if line.strip()]
            if lines and lines[-1] == HOST_PROMPT.rstrip():
                return
            if time.monotonic() > deadline:
                raise AssertionError("the host shell never came back to its prompt; it shows:\n" + "\n".join(lines))
            time.sleep(0.05)

    def wait_for(self, pattern: str, within: float = 20.0) -> re.Match[str]:
        deadline = time.monotonic() + within
        while True:
            text = self.screen()
            found = re.search(pattern, text, re.MULTILINE)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"pane never showed {pattern!r}; it shows:\n{text}")
            time.sleep(0.1)

    def server_pids(self) -> list[int]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if cmdline and "tmux" in os.path.basename(cmdline[0]) and self.name in cmdline:
                found.append(proc.pid)
        return found

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.name, "kill-server"], capture_output=True, timeout=30, check=False)
        deadline = time.monotonic() + 5
        while self.server_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        socket = Path(f"/tmp/tmux-{os.getuid()}") / self.name
        socket.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def project(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, str]]]:
    """One Machine of driver ``request.param`` for the module (deleted at the end); the tests share it."""
    driver = request.param
    tmp_path = tmp_path_factory.mktemp(f"pty-{driver}")
    home = tmp_path / "home"
    work = tmp_path / "proj"
    work.mkdir()
    machine = {"name": "web", "profile": "developer", "driver": driver, "image": IMAGE}
    machine["workspace"] = {"projection": "none"}
    (work / "vz.json").write_text(json.dumps({"version": 1, "project_id": "pty-e2e", "machines": [machine]}))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "VZ_HOME": str(home),
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        # A prebuilt guest agent or another source tree under test, when the run gives one.
        **{k: os.environ[k] for k in ("PYTHONPATH", "VZ_AGENT_BINARY") if k in os.environ},
    }
    up = subprocess.run([_vz(), "up"], cwd=work, env=env, capture_output=True, timeout=600, check=False)
    assert up.returncode == 0, up.stderr.decode()
    try:
        yield work, env
    finally:
        gone = subprocess.run([_vz(), "delete"], cwd=work, env=env, capture_output=True, timeout=600, check=False)
        # The module's home outlives each test's tmp_path: its daemon (started by the first command) is stopped here.
        stopped = subprocess.run(
            [_vz(), "daemon", "stop"], cwd=work, env=env, capture_output=True, timeout=60, check=False
        )
        assert gone.returncode == 0, gone.stderr.decode()
        assert stopped.returncode == 0, stopped.stderr.decode()


@pytest.fixture
def pane(project: tuple[Path, dict[str, str]]) -> Iterator[Tmux]:
    work, env = project
    tmux = Tmux(work, env)
    try:
        yield tmux
    finally:
        tmux.close()
        assert tmux.server_pids() == [], "the tmux server outlived kill-server"


@_on("fake", "linux_native", "qemu")
def test_interactive_shell_in_a_real_terminal(pane: Tmux, project: tuple[Path, dict[str, str]]) -> None:
    work, _ = project
    pane.send_line("stty -a > before.txt")
    pane.settle()
    pane.send_line(f"{shlex.quote(_vz())} exec -it -- sh; echo vz-exit=$?")
    # The Machine's shell: a prompt, and a real terminal of the pane's size.
    pane.wait_for(r"^(\S+ )?[$#]\s*$")
    pane.send_line("stty size; tty")
    pane.wait_for(r"^30 100$")
    pane.wait_for(r"^/dev/(pts/\d+|tty\w*)$")
    pane.tmux("resize-window", "-t", "t", "-x", "120", "-y", "40")
    time.sleep(0.3)
    pane.send_line("stty size")
    pane.wait_for(r"^40 120$")
    # A full-screen editor: open, insert a line, save and quit.
    pane.send_line("busybox vi /tmp/vz-pty-vi-$$.txt 2>/dev/null || vi /tmp/vz-pty-vi-$$.txt")
    pane.wait_for(r"^~", within=20)
    pane.keys("i")
    pane.tmux("send-keys", "-t", "t", "-l", "written in vi")
    pane.keys("Escape")
    time.sleep(0.5)  # an ESC followed at once by ':' would read as one escape sequence
    pane.tmux("send-keys", "-t", "t", "-l", ":wq")
    pane.keys("Enter")
    pane.send_line("cat /tmp/vz-pty-vi-$$.txt; rm -f /tmp/vz-pty-vi-$$.txt")
    pane.wait_for(r"^written in vi$")
    # Ctrl-C reaches the Machine's foreground process (sleep), not vz: the prompt comes back.
    pane.send_line("sleep 100")
    time.sleep(0.5)
    started = time.monotonic()
    pane.keys("C-c")
    pane.send_line("echo after-interrupt")
    pane.wait_for(r"^after-interrupt$", within=10)
    assert time.monotonic() - started < 10
    # Ctrl-D at the prompt ends the shell; vz exits 0 and the pane's terminal is as it was.
    pane.keys("C-d")
    pane.wait_for(r"^vz-exit=0$")
    pane.tmux("resize-window", "-t", "t", "-x", "100", "-y", "30")  # stty -a shows the size too
    time.sleep(0.3)
    pane.send_line("stty -a > after.txt; cmp before.txt after.txt && echo settings-same")
    pane.wait_for(r"^settings-same$")
    assert (work / "before.txt").read_text() == (work / "after.txt").read_text()


@_on("fake", "linux_native")
def test_a_killed_vz_restores_the_terminal(pane: Tmux) -> None:
    """SIGTERM and SIGHUP to vz while the terminal is raw: vz exits 128+N and the settings are restored."""
    pane.send_line("stty -a > before.txt")
    pane.settle()
    pane.send_line(f"{shlex.quote(_vz())} exec -it -- sh -c 'echo pid-inside; sleep 100'; echo vz-exit=$?")
    pane.wait_for(r"^pid-inside")
    vz_pids = _vz_processes("pid-inside")
    assert len(vz_pids) == 1, vz_pids
    os.kill(vz_pids[0], 15)
    pane.wait_for(r"^vz-exit=143$")
    pane.send_line("stty -a > after-term.txt; cmp before.txt after-term.txt && echo settings-same-term")
    pane.wait_for(r"^settings-same-term$")
    pane.settle()
    pane.send_line(f"{shlex.quote(_vz())} exec -it -- sh -c 'echo pid-again; sleep 100'; echo vz-exit=$?")
    pane.wait_for(r"^pid-again")
    vz_pids = _vz_processes("pid-again")
    assert len(vz_pids) == 1, vz_pids
    os.kill(vz_pids[0], 1)
    pane.wait_for(r"^vz-exit=129$")
    pane.send_line("stty -a > after-hup.txt; cmp before.txt after-hup.txt && echo settings-same-hup")
    pane.wait_for(r"^settings-same-hup$")


@_on("fake")
def test_a_command_killed_from_outside_ends_the_session_and_restores_the_terminal(
    pane: Tmux, request: pytest.FixtureRequest
) -> None:
    """The session's command dies of SIGKILL (as when its Machine is torn down): vz exits 137, terminal restored.

    Fake only: the test finds the command by its command line among the host's processes, which is where the
    fake runs it; a linux_native or qemu Machine's processes are not the host's to find that way.
    """
    pane.send_line("stty -a > before.txt")
    pane.settle()
    pane.send_line(f"{shlex.quote(_vz())} exec -it -- sh -c 'echo kill-victim; sleep 100'; echo vz-exit=$?")
    pane.wait_for(r"^kill-victim")
    if request.node.callspec.params["project"] != "fake":
        pytest.skip("the command's processes are visible on the host only for the fake driver")
    victims = _host_processes("kill-victim")
    for pid in victims:
        os.kill(pid, 9)
    pane.wait_for(r"^vz-exit=137$")
    pane.send_line("stty -a > after.txt; cmp before.txt after.txt && echo settings-same")
    pane.wait_for(r"^settings-same$")
    deadline = time.monotonic() + 5
    while _host_processes("kill-victim") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _host_processes("kill-victim") == []


def _host_processes(word: str) -> list[int]:
    """Live host processes whose command line mentions ``word``, vz itself excepted."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE or "-it" in cmdline:
            continue
        if any(word in part for part in cmdline):
            found.append(proc.pid)
    return found


def _vz_processes(word: str) -> list[int]:
    """Pids of the `vz exec -it` processes whose command line mentions ``word``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "exec" in cmdline and "-it" in cmdline and any(word in part for part in cmdline):
            found.append(proc.pid)
    return found


@_on("fake", "linux_native")
def test_without_a_terminal_it_is_refused_like_docker(project: tuple[Path, dict[str, str]]) -> None:
    work, env = project
    out = subprocess.run(
        [_vz(), "exec", "-it", "--", "sh"], cwd=work, env=env, input=b"", capture_output=True, timeout=60, check=False
    )
    assert out.returncode == 125 and b"the input device is not a TTY" in out.stderr  # vz exec's own error
    out = subprocess.run(
        [_vz(), "exec", "-t", "--", "sh", "-c", "stty size; exit 3"],
        cwd=work,
        env=env,
        input=b"",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 3 and out.stdout.strip() == b"24 80"
