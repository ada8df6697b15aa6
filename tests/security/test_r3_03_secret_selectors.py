"""#26 item 3 (and 7c), the canary: a secret value of the project used as a selector, a command name, a workdir
or a stray argument is masked in everything vz prints and stores.

A project declares ``TOKEN: {"from_env": "RT_SECRET_TOKEN"}`` with a unique canary value. Every verb runs
through the real `vz` console script and daemon (a temporary VZ_HOME), with and without --json, with valid
selectors and with selectors holding the canary whole and as a substring; then every output, every row of
every table of state.db, the daemon's log and every file under VZ_HOME are searched for the canary.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DRIVERS = [
    pytest.param("fake", id="fake"),
    pytest.param("linux_native", id="linux_native", marks=pytest.mark.root),
]

pytestmark = pytest.mark.slow


class Run:
    def __init__(self, home: Path, project: Path, secret: str, agent: str | None) -> None:
        beside = Path(sys.executable).parent / "vz"
        self.exe = str(beside) if beside.exists() else (shutil.which("vz") or "vz")
        self.home, self.project, self.secret, self.agent = home, project, secret, agent
        self.outputs: list[tuple[str, bytes]] = []

    def __call__(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_")}
        env.update(VZ_HOME=str(self.home), RT_SECRET_TOKEN=self.secret)
        if self.agent is not None:
            env["VZ_AGENT_BINARY"] = self.agent
        proc = subprocess.run(
            [self.exe, *args], cwd=self.project, env=env, capture_output=True, timeout=300, check=False
        )
        shown = " ".join(a.replace(self.secret, "<canary>") for a in args)
        self.outputs += [(f"vz {shown} (stdout)", proc.stdout), (f"vz {shown} (stderr)", proc.stderr)]
        assert b"Traceback" not in proc.stderr, proc.stderr.decode()
        return proc

    def ok(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        proc = self(*args)
        assert proc.returncode == 0, f"vz {args[0]} exited {proc.returncode}: {proc.stderr.decode()}"
        return proc

    def fails(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        proc = self(*args)
        assert proc.returncode != 0, f"vz {args[0]} succeeded: {proc.stdout.decode()}"
        return proc


@pytest.fixture(scope="module")
def agent_binary() -> str:
    from vz_drivers.agent import ensure_agent_binary

    return str(ensure_agent_binary())


def _rows(db: Path) -> list[tuple[str, str]]:
    """Every row of every table, as text (read-only)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = []
        for table in tables:
            for row in con.execute(f'SELECT * FROM "{table}"'):
                rows.append((table, repr(row)))
        return rows
    finally:
        con.close()


def _files_holding(root: Path, needle: bytes) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    hits.append(str(path.relative_to(root)))
            except OSError:
                continue
    return sorted(hits)


def _cleanup(run: Run) -> None:
    """Delete every Environment of the project, by id (old code let a secret name one)."""
    proc = run("status", "--all", "--json")
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return
    for env in report.get("environments", []):
        run("delete", "--environment", env["id"])


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_secret_in_any_caller_string_is_masked_in_every_output_and_every_stored_row(
    tmp_path: Path, driver: str, request: pytest.FixtureRequest
) -> None:
    if driver == "linux_native" and os.geteuid() != 0:
        pytest.fail("the linux_native canary needs root (namespaces, cgroups, runc)")
    agent = str(request.getfixturevalue("agent_binary")) if driver == "linux_native" else None
    canary = "canary-" + secrets.token_hex(12)
    project = tmp_path / "proj"
    project.mkdir()
    machine = {
        "name": "web",
        "profile": "developer",
        "driver": driver,
        "image": "vz:default",
        "workspace": {"projection": "none"},
        "environment": {"TOKEN": {"from_env": "RT_SECRET_TOKEN"}},
    }
    (project / "vz.json").write_text(json.dumps({"version": 1, "project_id": "canary", "machines": [machine]}))
    run = Run(tmp_path / "home", project, canary, agent)
    whole, inside = canary, f"x-{canary}-y"
    masked: list[bytes] = []  # outputs that must show the mask where the canary was
    try:
        run.ok("up")
        run.ok("up", "--json")
        # Selectors that hold the canary: refused, never created, never echoed.
        for selector in (whole, inside):
            for json_flag in ((), ("--json",)):
                for verb in ("up", "stop", "delete", "status"):
                    proc = run.fails(verb, "--environment", selector, *json_flag)
                    masked.append(proc.stderr)
                proc = run.fails("status", "--machine", selector, *json_flag)
                masked.append(proc.stderr)
            masked.append(run.fails("exec", "--environment", selector, "--", "true").stderr)
            masked.append(run.fails("exec", "--machine", selector, "--", "true").stderr)
            masked.append(run.fails("exec", "--workdir", f"/{selector}", "--", "true").stderr)
            # 7c: the Machine's own "no such file" line names the command: masked too.
            proc = run.fails("exec", "--", f"/{selector}")
            assert proc.returncode == 127, proc.stderr.decode()
            masked.append(proc.stderr)
            # A stray argument: the CLI's own usage error.
            masked.append(run.fails("stop", selector).stderr)
        # The canary as an ordinary argument reaches the command (compared inside, never printed).
        run.ok("exec", "--", "sh", "-c", 'test "$1" = "$TOKEN"', "sh", canary)
        # Valid selectors, every verb, both output forms.
        env_id = json.loads(run.ok("status", "--json").stdout)["environments"][0]["id"]
        for json_flag in ((), ("--json",)):
            run.ok("status", "--environment", "default", *json_flag)
            run.ok("status", "--environment", env_id, "--machine", "web", *json_flag)
            run.ok("stop", "--environment", "default", *json_flag)
            run.ok("up", "--environment", "default", *json_flag)
        run.ok("exec", "--environment", env_id, "--machine", "web", "--workdir", "/", "--", "true")
    finally:
        _cleanup(run)
    assert all(b"***" in text for text in masked), [t.decode() for t in masked if b"***" not in t]
    needle = canary.encode()
    leaked = [where for where, text in run.outputs if needle in text]
    assert leaked == [], leaked
    rows = [f"{table}: {row}" for table, row in _rows(run.home / "state.db") if canary in row]
    assert rows == []
    assert (run.home / "daemon" / "daemon.log").exists()
    assert _files_holding(run.home, needle) == []


def test_the_events_of_a_refused_selector_are_stored_masked(tmp_path: Path) -> None:
    """The rows the issue saw: operation.started.environment and operation.finished.error.message."""
    canary = "canary-" + secrets.token_hex(12)
    project = tmp_path / "proj"
    project.mkdir()
    machine: dict[str, Any] = {
        "name": "web",
        "profile": "developer",
        "driver": "fake",
        "image": "vz:default",
        "workspace": {"projection": "none"},
        "environment": {"TOKEN": {"from_env": "RT_SECRET_TOKEN"}},
    }
    (project / "vz.json").write_text(json.dumps({"version": 1, "project_id": "canary", "machines": [machine]}))
    run = Run(tmp_path / "home", project, canary, None)
    try:
        run.ok("up")
        run.fails("stop", "--environment", canary)
        run.fails("delete", "--environment", f"a{canary}")
    finally:
        _cleanup(run)
    con = sqlite3.connect(f"file:{run.home / 'state.db'}?mode=ro", uri=True)
    try:
        events = [(kind, json.loads(data)) for kind, data in con.execute("SELECT kind, data FROM events")]
    finally:
        con.close()
    started = [d["environment"] for k, d in events if k == "operation.started" and d["method"] != "Environments.Up"]
    assert "***" in started and "a***" in started
    failed = [d["error"]["message"] for k, d in events if k == "operation.finished" and d["status"] == "failed"]
    assert any(m.startswith("--environment ***:") for m in failed), failed
    assert any(m.startswith("--environment a***:") for m in failed), failed
