"""The `vz` command line as a user meets it: help, version, usage errors and bad input, all without tracebacks."""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vzcli import Vz, fake_machine, write_project

from vz_core.wire import daemon_paths

HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), "amd64")


def test_bare_vz_prints_static_help_and_touches_nothing(vz: Vz, tmp_path: Path) -> None:
    out = vz.ok(cwd=tmp_path)
    assert out.startswith("vz: reproducible, parallel Developer Environments")
    for verb in ("up", "exec", "status", "stop", "delete", "driver", "version"):
        assert f"\n  {verb} " in out
    assert not vz.home.exists()
    assert vz.ok("--help", cwd=tmp_path) == out
    assert vz.ok("help", cwd=tmp_path) == out


def test_help_and_exec_paths_import_neither_pydantic_nor_rich(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from vz_core.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "heavy = sorted(m for m in ('pydantic', 'rich') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
    )
    for args in ([], ["--help"], ["exec", "--", "true"]):
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={"VZ_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
            check=False,
        )
        assert "HEAVY=\n" in proc.stderr, (args, proc.stderr)


def test_command_help(vz: Vz, tmp_path: Path) -> None:
    out = vz.ok("help", "up", cwd=tmp_path)
    assert "--recreate" in out and "--environment" in out and "--json" in out
    assert "--machine" in vz.ok("exec", "--help", cwd=tmp_path)


def test_version(vz: Vz, tmp_path: Path) -> None:
    out = vz.ok("version", cwd=tmp_path)
    assert out.startswith("vz ") and "Runtime Protocol 1.3" in out
    assert vz.ok("--version", cwd=tmp_path) == out


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(("frobnicate",), "unknown command 'frobnicate'", id="unknown-command"),
        pytest.param(("up", "--bogus"), "unrecognized arguments: --bogus", id="unknown-flag"),
        pytest.param(("exec",), "no command given", id="exec-without-command"),
        pytest.param(("exec", "--machine"), "expected one argument", id="flag-without-value"),
        pytest.param(("status", "--all", "--environment", "x"), "exclude each other", id="conflicting-flags"),
    ],
)
def test_usage_errors_exit_2(vz: Vz, project: Path, args: tuple[str, ...], fragment: str) -> None:
    assert fragment in vz.fails(125 if args[0] == "exec" else 2, *args, cwd=project)  # exec: docker's 125


@pytest.mark.parametrize("verb", ["up", "status", "stop", "delete", "exec"])
def test_no_definition_names_where_it_looked_and_changes_nothing(vz: Vz, tmp_path: Path, verb: str) -> None:
    empty = tmp_path / "empty" / "dir"
    empty.mkdir(parents=True)
    args = [verb, "--", "true"] if verb == "exec" else [verb]
    err = vz.fails(125 if verb == "exec" else 3, *args, cwd=empty)
    assert f"no vz.json found in {empty} or any parent directory" in err
    assert str(empty.parent) in err
    vz.assert_recorded_nothing()


def test_invalid_json_points_at_the_line(vz: Vz, tmp_path: Path) -> None:
    (tmp_path / "vz.json").write_text('{"version": 1,\n "project_id": "x",,\n}')
    err = vz.fails(2, "up", cwd=tmp_path)
    assert f"{tmp_path / 'vz.json'}:2:20: invalid JSON" in err
    vz.assert_recorded_nothing()


def test_schema_errors_list_json_paths(vz: Vz, tmp_path: Path) -> None:
    write_project(tmp_path, {"name": "web", "driver": "fake", "image": "vz:default", "workspace": {"projection": "rw"}})
    err = vz.fails(2, "up", cwd=tmp_path)
    assert "is not a valid project definition (2 problems)" in err
    assert "$.machines[0].profile: required field is missing (machine 'web')" in err
    assert "$.machines[0].workspace.projection: Input should be 'read-write'" in err
    vz.assert_recorded_nothing()
    # exec reads only the project id (fast), but a broken one gets the full report
    write_project(tmp_path, {"name": "web"}, project_id="Bad Id")
    err = vz.fails(125, "exec", "--", "true", cwd=tmp_path)
    assert "$.project_id: must be lowercase" in err and "$.machines[0].profile" in err


def test_unknown_driver(vz: Vz, tmp_path: Path) -> None:
    write_project(tmp_path, fake_machine("web", driver="warp-drive"))
    err = vz.fails(2, "up", cwd=tmp_path)
    assert "$.machines[0].driver: unknown driver 'warp-drive'; " in err
    assert "fake" in err and "vz driver add" in err
    assert not vz.home.exists() or json.loads(vz.ok("status", "--all", "--json", cwd=tmp_path))["environments"] == []


def test_unsupported_target_for_this_host(vz: Vz, tmp_path: Path) -> None:
    other = "arm64" if HOST_ARCH == "amd64" else "amd64"
    write_project(tmp_path, fake_machine("web", target={"os": "linux", "arch": other}))
    err = vz.fails(2, "up", cwd=tmp_path)
    assert f"$.machines[0].target.arch: driver 'fake' runs {HOST_ARCH} Machines on this host, not {other}" in err
    write_project(tmp_path, fake_machine("web", target={"os": "darwin"}))
    assert "cannot run darwin Machines" in vz.fails(2, "up", cwd=tmp_path)
    assert json.loads(vz.ok("status", "--all", "--json", cwd=tmp_path))["environments"] == []


def test_understood_backend_failure_exits_1_without_traceback(vz: Vz, tmp_path: Path) -> None:
    write_project(tmp_path, fake_machine("web", driver_options={"faults": "failing-preflight"}))
    assert "preflight failed on purpose" in vz.fails(1, "up", cwd=tmp_path)


def test_terminal_gets_rich_progress_and_pipes_get_plain_lines(vz: Vz, project: Path) -> None:
    import os
    import pty

    master, slave = pty.openpty()
    try:
        proc = vz.popen("up", cwd=project, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        chunks: list[bytes] = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has exited
                break
            if not chunk:
                break
            chunks.append(chunk)
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
    assert proc.returncode == 0
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    assert "✓ creating machine web" in screen and "✓ creating machine db" in screen
    assert "Environment default (env_" in out.decode()
    plain = vz.run("stop", cwd=project).stderr.decode()
    assert "stopping machine web ...\n" in plain and "✓" not in plain and "\x1b[" not in plain
    vz.ok("delete", cwd=project)


def test_secrets_are_masked_in_errors_and_never_stored(tmp_path: Path) -> None:
    from vzcli import add_test_driver

    vz = Vz(tmp_path / "home")
    add_test_driver(vz, "leaky", cwd=tmp_path)
    secret = "hunter2-very-secret-value"
    write_project(tmp_path / "p", fake_machine("web", driver="leaky", environment={"TOKEN": {"from_env": "APP_TOKEN"}}))
    err = vz.fails(1, "up", cwd=tmp_path / "p", env={"APP_TOKEN": secret})
    assert "backend rejected environment" in err and "'TOKEN': '***'" in err
    assert secret not in err
    status = vz.ok("status", "--json", cwd=tmp_path / "p")
    assert json.loads(status)["environments"][0]["last_operation"]["status"] == "failed"
    assert secret not in status
    assert all(secret.encode() not in p.read_bytes() for p in vz.home.rglob("state.db*"))


@pytest.mark.parametrize("args", [("status",), ("status", "--json"), ("exec", "--", "true"), ("up",)])
def test_no_daemon_and_no_autostart_fails_fast_with_one_line(vz: Vz, project: Path, args: tuple[str, ...]) -> None:
    proc = vz.run(*args, cwd=project, env={"VZ_DAEMON_AUTOSTART": "0"}, timeout=10)
    err = proc.stderr.decode()
    assert proc.returncode == (125 if args[0] == "exec" else 69) and "Traceback" not in err
    (line,) = err.splitlines()
    assert line == (
        f"vz {args[0]}: error: no vz daemon runs for {vz.home} (nothing listens on {daemon_paths(vz.home).socket}); "
        "start it with `vz daemon start` (VZ_DAEMON_AUTOSTART=0 keeps commands from starting one)"
    )
    if "--json" in args:
        (event,) = [json.loads(x) for x in proc.stdout.decode().splitlines()]
        assert event["error"]["kind"] == "unavailable" and event["error"]["exit_code"] == 69
    assert not vz.home.exists()  # nothing was started or created


def test_daemon_command_is_listed_and_wired(vz: Vz, tmp_path: Path) -> None:
    assert "\n  daemon " in vz.ok(cwd=tmp_path)
    assert "start" in vz.ok("help", "daemon", cwd=tmp_path)
    vz.ok("daemon", "start", cwd=tmp_path)
    assert str(vz.daemon_pid()) in vz.ok("daemon", "status", cwd=tmp_path)
    vz.ok("daemon", "stop", cwd=tmp_path)
