"""`vz exec`: streams, exit codes, signals, Machine selection, through the real console script."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from vzcli import Vz


def test_stdin_and_stdout_are_binary_exact(vz: Vz, running: Path) -> None:
    payload = bytes(range(256)) * 4096 + b"\x00\xff\r\n"
    proc = vz.run("exec", "--", "cat", cwd=running, input=payload)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == payload


def test_stdout_and_stderr_stay_separate(vz: Vz, running: Path) -> None:
    proc = vz.run("exec", "--", "sh", "-c", "echo out; echo err >&2; echo out2", cwd=running)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"out\nout2\n", b"err\n")


def test_arguments_arrive_verbatim(vz: Vz, running: Path) -> None:
    args = ["a b", "'q'", "$HOME;$(echo no)", "", "ünï"]
    proc = vz.run("exec", "--", "printf", "[%s]", *args, cwd=running)
    assert proc.stdout.decode() == "".join(f"[{a}]" for a in args)


@pytest.mark.parametrize(("script", "code"), [("exit 0", 0), ("exit 7", 7), ("exit 255", 255), ("kill -TERM $$", 143)])
def test_exit_code_is_propagated(vz: Vz, running: Path, script: str, code: int) -> None:
    assert vz.run("exec", "--", "sh", "-c", script, cwd=running).returncode == code


def test_command_not_found_is_127(vz: Vz, running: Path) -> None:
    proc = vz.run("exec", "--", "no-such-command-here", cwd=running)
    assert proc.returncode == 127 and b"not found" in proc.stderr


def test_options_may_precede_the_command_without_double_dash(vz: Vz, running: Path) -> None:
    proc = vz.run("exec", "--machine", "db", "sh", "-c", "echo $VZ_MACHINE_ID", cwd=running)
    status = vz.status(running)
    db = next(m for m in status["environments"][0]["machines"] if m["name"] == "db")
    assert proc.stdout.decode().strip() == db["id"]


def test_machine_selection_default_flag_env_var(vz: Vz, running: Path) -> None:
    machines = {m["name"]: m["id"] for m in vz.status(running)["environments"][0]["machines"]}
    probe = ("sh", "-c", "echo $VZ_MACHINE_ID")
    assert vz.ok("exec", "--", *probe, cwd=running).strip() == machines["web"]  # default_machine
    assert vz.ok("exec", "--machine", "db", "--", *probe, cwd=running).strip() == machines["db"]
    assert vz.ok("exec", "--machine", machines["db"], "--", *probe, cwd=running).strip() == machines["db"]
    by_env = vz.ok("exec", "--", *probe, cwd=running, env={"VZ_MACHINE_ID": machines["db"]})
    assert by_env.strip() == machines["db"]
    err = vz.fails(125, "exec", "--", "true", cwd=running, env={"VZ_MACHINE_ID": "mch_000000000000"})
    assert "VZ_MACHINE_ID=mch_000000000000 names no Machine of Environment default" in err
    assert "--machine cache: Environment default" in vz.fails(
        125, "exec", "--machine", "cache", "--", "true", cwd=running
    )


def _pipe_max_size() -> int:
    return int(Path("/proc/sys/fs/pipe-max-size").read_text())


@pytest.mark.parametrize("pass_pipes", [False, True], ids=["default", "pass-pipes"])
def test_passed_pipes_are_enlarged_to_pipe_max_size(vz: Vz, running: Path, pass_pipes: bool) -> None:
    """The caller's pipes grow to pipe-max-size before they are handed over (B4): stdin always, stdout only with
    --pass-pipes (by default an output pipe is copied, so that vz exec ends with the command's main process)."""
    import fcntl

    stdin_r, stdin_w = os.pipe()
    flags = ["--pass-pipes"] if pass_pipes else []
    proc = vz.popen(
        "exec", *flags, "--", "sh", "-c", "cat; echo end", cwd=running, stdin=stdin_r, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        os.write(stdin_w, b"in\n")
        os.close(stdin_w)
        assert proc.stdout.read() == b"in\nend\n"
        assert proc.wait(30) == 0
        assert fcntl.fcntl(stdin_r, fcntl.F_GETPIPE_SZ) == _pipe_max_size()
        stdout_size = fcntl.fcntl(proc.stdout.fileno(), fcntl.F_GETPIPE_SZ)
        assert (stdout_size == _pipe_max_size()) == pass_pipes or _pipe_max_size() == stdout_size == 65536
    finally:
        os.close(stdin_r)
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_enlarge_pipe_grows_never_shrinks_and_ignores_what_is_not_a_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    from vz_core.cli import _exec

    limit = _pipe_max_size()
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
        assert _exec.enlarge_pipe(r) == limit  # either end of the pipe
        assert fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) == limit
        smaller = tmp_path / "pipe-max-size"  # the limit lowered below what the pipe has: it stays as it is
        smaller.write_text("65536\n")
        monkeypatch.setattr(_exec, "_PIPE_MAX_SIZE", str(smaller))
        assert _exec.enlarge_pipe(w) == limit
        assert fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) == limit
    finally:
        os.close(r)
        os.close(w)
    with open(tmp_path / "file", "wb") as f:
        assert _exec.enlarge_pipe(f.fileno()) is None


def test_workdir_defaults_to_the_machine_and_can_be_set(vz: Vz, running: Path) -> None:
    out = vz.ok("exec", "--", "sh", "-c", 'test "$(pwd)" = "$VZ_MACHINE_ROOT" && echo same', cwd=running)
    assert out == "same\n"
    vz.ok("exec", "--", "mkdir", "sub", cwd=running)
    assert vz.ok("exec", "--workdir", "sub", "--", "sh", "-c", "basename $(pwd)", cwd=running) == "sub\n"


def _start_blocking(vz: Vz, cwd: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A `vz exec` running `sleep` in the Machine; returns it and the command's pid once it runs."""
    proc = vz.popen(
        "exec", "--", "sh", "-c", "echo $$; exec sleep 600", cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    return proc, pid


def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signals_cancel_the_command_and_exit_128_plus_n(vz: Vz, running: Path, sig: int, code: int) -> None:
    proc, pid = _start_blocking(vz, running)
    try:
        os.kill(proc.pid, sig)  # only vz: the driver must kill the command
        assert proc.wait(20) == code
        assert _gone(pid), f"the command (pid {pid}) outlived the cancelled exec"
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None
            stream.close()


def test_exec_on_a_stopped_machine_says_how_to_fix_it(vz: Vz, running: Path) -> None:
    vz.ok("stop", cwd=running)
    err = vz.fails(125, "exec", "--", "true", cwd=running)
    assert "machine web of Environment default" in err and "is not running; run `vz up --environment default`" in err
    vz.ok("up", cwd=running)
    vz.ok("exec", "--", "true", cwd=running)


def test_an_environment_id_works_without_a_definition(vz: Vz, running: Path, tmp_path: Path) -> None:
    env_id = vz.status(running)["environments"][0]["id"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = ("sh", "-c", "echo $VZ_ENVIRONMENT_ID")
    assert vz.ok("exec", "--environment", env_id, "--", *probe, cwd=elsewhere).strip() == env_id
    assert vz.ok("exec", "--", *probe, cwd=elsewhere, env={"VZ_ENVIRONMENT_ID": env_id}).strip() == env_id
    assert "no vz.json found" in vz.fails(125, "exec", "--environment", "default", "--", "true", cwd=elsewhere)


def test_a_terminal_is_copied_never_handed_to_the_machine(vz: Vz, running: Path) -> None:
    """stdin, stdout and stderr on a terminal (no -t): the bytes cross, the terminal's descriptor does not."""
    import pty

    master, slave = pty.openpty()
    try:
        probe = "for fd in 0 1 2; do [ -t $fd ] && echo fd$fd-is-a-tty; done; echo checked"
        script = probe + "; read x; echo got:$x; echo err >&2"
        proc = vz.popen("exec", "--", "sh", "-c", script, cwd=running, stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + 30
        while b"checked" not in seen:
            assert time.monotonic() < deadline, seen
            seen += os.read(master, 4096)
        os.write(master, b"typed line\n")
        while b"err" not in seen:
            assert time.monotonic() < deadline, seen
            seen += os.read(master, 4096)
        assert proc.wait(30) == 0
    finally:
        os.close(master)
    text = seen.decode(errors="replace")
    assert "is-a-tty" not in text, text  # no terminal descriptor reached the command
    assert "got:typed line" in text and "err" in text  # stdin copied in, stdout and stderr copied out


@pytest.mark.parametrize(
    "argv",
    [
        ["--", "true"],
        ["true"],
        ["--machine", "db", "sh", "-c", "echo $X"],
        ["--environment=env_000000000000", "--workdir", "sub", "--", "ls", "-l"],
        ["-f", "other.json", "-it", "--", "sh"],
        ["-t", "-i", "sh"],
        ["--tty", "--interactive", "--file=x.json", "--", "-weird-command"],
        ["-ti", "--", "--"],
    ],
)
def test_the_quick_exec_parser_agrees_with_argparse(argv: list[str]) -> None:
    """`vz exec` parses its common spellings without argparse (B7); the result is what argparse gives."""
    from vz_core.cli._main import _parser, _quick_exec_args

    quick = _quick_exec_args(argv)
    assert quick is not None
    if "--" in argv:
        cut = argv.index("--")
        full, command = _parser("exec").parse_args(argv[:cut]), argv[cut + 1 :]
    else:
        full = _parser("exec").parse_args(argv)
        command = full.argv
    for name in ("environment", "machine", "workdir", "interactive", "tty"):
        assert getattr(quick, name) == getattr(full, name), name
    assert quick.file == (None if full.file is None else str(full.file))
    assert quick.argv == command


@pytest.mark.parametrize("argv", [["--machine"], ["--machine", "--", "x"], ["--mach", "db", "x"], ["-h"], ["-x"]])
def test_anything_unusual_goes_to_argparse(argv: list[str]) -> None:
    from vz_core.cli._main import _quick_exec_args

    assert _quick_exec_args(argv) is None
