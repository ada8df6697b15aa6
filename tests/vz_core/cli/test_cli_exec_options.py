"""`vz exec`'s docker-style options through the real console script and daemon: -e, --env-file, -u, -w, -d."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from vzcli import Vz

SHOW = ("sh", "-c", 'printf "%s|%s|%s" "${A-unset}" "${B-unset}" "${C-unset}"')


def test_env_sets_passes_and_skips(vz: Vz, running: Path) -> None:
    assert vz.ok("exec", "-e", "A=1", "--env", "B=x=y", "--", *SHOW, cwd=running) == "1|x=y|unset"
    # KEY alone: this process's value, and nothing at all when it has none (docker's -e KEY).
    assert (
        vz.ok("exec", "-e", "A", "-e", "B", "--", *SHOW, cwd=running, env={"A": "from-here"}) == "from-here|unset|unset"
    )
    assert vz.ok("exec", "--env=C=", "--", *SHOW, cwd=running) == "unset|unset|"


def test_env_file_is_read_as_docker_reads_it_and_e_wins(vz: Vz, running: Path, tmp_path: Path) -> None:
    first = tmp_path / "first.env"
    first.write_text('# a comment\n\n   A=1 2 "3" $HOME\nB\nC=from-file\n')
    second = tmp_path / "second.env"
    second.write_text("C=second\n")
    out = vz.ok(
        "exec",
        "--env-file",
        str(first),
        "--env-file",
        str(second),
        "-e",
        "A=cli",
        "--",
        *SHOW,
        cwd=running,
        env={"B": "passed"},
    )
    assert out == "cli|passed|second"
    out = vz.ok("exec", "--env-file", str(first), "--", *SHOW, cwd=running)
    assert out == '1 2 "3" $HOME|unset|from-file'


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("-e", "BAD KEY=value-never-shown"), "-e BAD KEY: variable 'BAD KEY' contains whitespace"),
        (("-e", "=value-never-shown"), "a setting has no variable name"),
        (("--env-file", "/nonexistent/vz-test.env"), "--env-file /nonexistent/vz-test.env: cannot read it"),
        (("-u", "a b"), "--user 'a b': 'a b' is not a valid user name or number"),
        (("-u", "web:"), "write USER or USER:GROUP"),
        (("-d", "-it"), "--detach runs the command in the background with no terminal and no input"),
    ],
)
def test_bad_options_exit_2_before_anything_runs(vz: Vz, running: Path, args: tuple[str, ...], fragment: str) -> None:
    err = vz.fails(125, "exec", *args, "--", "sh", "-c", "echo ran", cwd=running)
    assert fragment in err and "value-never-shown" not in err


def test_bad_env_file_line_is_named(vz: Vz, running: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.env"
    bad.write_text("OK=1\nNOT OK=secret-value\n")
    err = vz.fails(125, "exec", "--env-file", str(bad), "--", "true", cwd=running)
    assert f"--env-file {bad} line 2: variable 'NOT OK' contains whitespace" in err and "secret-value" not in err


def test_user_and_group(vz: Vz, running: Path) -> None:
    assert vz.ok("exec", "-u", "nobody", "--", "id", "-u", cwd=running).strip() == "65534"
    assert vz.ok("exec", "--user", "65534:0", "--", "sh", "-c", "echo $(id -u):$(id -g)", cwd=running).strip() == (
        "65534:0"
    )
    assert vz.ok("exec", "--", "id", "-u", cwd=running).strip() == str(os.getuid())
    assert "user 'no-such-user-vz' does not exist" in vz.fails(
        125, "exec", "-u", "no-such-user-vz", "--", "true", cwd=running
    )


def test_w_is_workdir(vz: Vz, running: Path, tmp_path: Path) -> None:
    assert vz.ok("exec", "-w", str(tmp_path), "--", "pwd", cwd=running).strip() == str(tmp_path)
    assert vz.ok("exec", "--workdir", str(tmp_path), "--", "pwd", cwd=running).strip() == str(tmp_path)


def _wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_detach_returns_while_the_command_runs_and_leaves_the_callers_pipes(
    vz: Vz, running: Path, tmp_path: Path
) -> None:
    go, out = tmp_path / "go", tmp_path / "out"
    script = f'echo started > {out}.started; while [ ! -e {go} ]; do sleep 0.05; done; echo "$A" > {out}'
    # capture_output waits for the end of the pipes: a vz (or a command) still holding them would hang here.
    proc = vz.run("exec", "-d", "-e", "A=detached", "--", "sh", "-c", script, cwd=running, timeout=30)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
    _wait_for(Path(f"{out}.started"))
    assert not out.exists()  # it waits for `go`: vz exec -d returned while it ran
    go.touch()
    _wait_for(out)
    assert out.read_text() == "detached\n"


def test_detach_refuses_an_unknown_or_stopped_machine(vz: Vz, running: Path) -> None:
    assert "--machine nope" in vz.fails(125, "exec", "-d", "--machine", "nope", "--", "true", cwd=running)
    vz.ok("stop", cwd=running)
    err = vz.fails(125, "exec", "--detach", "--", "true", cwd=running)
    assert "machine web is not running" in err and "vz up" in err


def test_new_options_are_in_exec_help(vz: Vz, tmp_path: Path) -> None:
    out = vz.ok("help", "exec", cwd=tmp_path)
    for flag in ("-e KEY[=VALUE], --env KEY[=VALUE]", "--env-file PATH", "-u USER[:GROUP]", "-w DIR", "-d, --detach"):
        assert flag in out, flag


def test_exit_codes_tell_vz_from_the_command(vz: Vz, running: Path, tmp_path: Path) -> None:
    """docker exec's convention: 125 vz itself failed, 126 cannot invoke, 127 not found; else the command's."""
    assert vz.run("exec", "--", "sh", "-c", "exit 3", cwd=running).returncode == 3  # the command's own 3
    assert "has no Machine with that name" in vz.fails(125, "exec", "--machine", "nope", "--", "true", cwd=running)
    assert "unrecognized arguments" in vz.fails(125, "exec", "--bogus", "--", "true", cwd=running)
    assert vz.run("exec", "--", "no-such-command-vz", cwd=running).returncode == 127
    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    script.chmod(0o644)
    assert vz.run("exec", "--", str(script), cwd=running).returncode == 126
    # --json of the other commands keeps the error's own exit_code
    proc = vz.run("status", "--json", "--machine", "nope", cwd=running)
    assert proc.returncode == 3 and json.loads(proc.stdout.splitlines()[-1])["error"]["exit_code"] == 3


def test_a_positional_machine_gets_a_hint(vz: Vz, running: Path) -> None:
    proc = vz.run("exec", "db", "--", "echo", "a b", cwd=running)
    assert proc.returncode == 127
    assert b"vz exec: db is a Machine: did you mean `vz exec --machine db -- echo 'a b'`?" in proc.stderr
    proc = vz.run("exec", "no-machine-vz", "--", "true", cwd=running)
    assert proc.returncode == 127 and b"is a Machine" not in proc.stderr
