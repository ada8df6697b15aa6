"""#14 item 1 through the real `vz` console script on the fake driver: the whole selection table, and two git
worktrees of one project (same project_id) where the second, unbound worktree never touches the first one's
Environment: `vz exec` and `vz up --recreate` there fail closed and every byte of the first one's Machines stays."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git for the worktree case")


class Vz:
    def __init__(self, home: Path) -> None:
        beside = Path(sys.executable).parent / "vz"
        self.exe = str(beside) if beside.exists() else (shutil.which("vz") or "vz")
        self.home = home

    def run(self, *args: str, cwd: Path, env: dict[str, str] | None = None, input: bytes = b"") -> Any:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("VZ_")}
        environ["VZ_HOME"] = str(self.home)
        environ.update(env or {})
        return subprocess.run(
            [self.exe, *args], cwd=cwd, env=environ, capture_output=True, input=input, timeout=120, check=False
        )

    def ok(self, *args: str, cwd: Path, **kw: Any) -> str:
        proc = self.run(*args, cwd=cwd, **kw)
        assert proc.returncode == 0, f"vz {' '.join(args)} → {proc.returncode}: {proc.stderr.decode()}"
        return str(proc.stdout.decode())

    def fails(self, code: int, *args: str, cwd: Path, **kw: Any) -> str:
        proc = self.run(*args, cwd=cwd, **kw)
        err = str(proc.stderr.decode())
        assert proc.returncode == code, f"vz {' '.join(args)}: expected {code}, got {proc.returncode}: {err}"
        assert "Traceback" not in err
        return err

    def envs(self, cwd: Path) -> dict[str, dict[str, Any]]:
        report = json.loads(self.ok("status", "--all", "--json", cwd=cwd))
        return {e["name"]: e for e in report["environments"]}


def definition(**extra: Any) -> dict[str, Any]:
    machine = {"profile": "developer", "driver": "fake", "image": "vz:default", "workspace": {"projection": "none"}}
    return {
        "version": 1,
        "project_id": "wt-demo",
        "machines": [{"name": "web", **machine, **extra}, {"name": "db", **machine}],
        "default_machine": "web",
    }


def git(*args: str, cwd: Path) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@e"
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def machines_on_disk(home: Path) -> dict[str, str]:
    """Digest of every file the fake driver keeps for its Machines (roots and records), locks aside."""
    root = home / "drivers" / "fake"
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "locks" not in p.parts
    }


@pytest.fixture
def worktrees(tmp_path: Path) -> tuple[Path, Path]:
    first = tmp_path / "first"
    first.mkdir()
    git("init", "-q", "-b", "main", cwd=first)
    (first / "vz.json").write_text(json.dumps(definition(), indent=2))
    git("add", "vz.json", cwd=first)
    git("commit", "-q", "-m", "project", cwd=first)
    second = tmp_path / "second"
    git("worktree", "add", "-q", "-b", "feature", str(second), cwd=first)
    assert json.loads((second / "vz.json").read_text())["project_id"] == "wt-demo"
    return first, second


def test_second_git_worktree_never_touches_the_first_ones_environment(
    tmp_path: Path, worktrees: tuple[Path, Path]
) -> None:
    first, second = worktrees
    vz = Vz(tmp_path / "home")
    try:
        vz.ok("up", cwd=first)
        for machine in ("web", "db"):
            data = os.urandom(2048) + machine.encode()
            vz.ok("exec", "--machine", machine, "--", "sh", "-c", "cat > sentinel", cwd=first, input=data)
        envs = vz.envs(first)
        default = envs["default"]
        assert default["bound_worktrees"] == [str(first)]
        before = machines_on_disk(vz.home)
        assert sum(k.endswith("sentinel") for k in before) == 2
        ids = [m["id"] for m in default["machines"]]

        # The second worktree is bound to nothing: exec, up, up --recreate, status, stop, delete all fail closed.
        for command in (
            ("exec", "--", "sh", "-c", "echo touched > sentinel"),
            ("up",),
            ("up", "--recreate"),
            ("status",),
            ("stop",),
            ("delete",),
        ):
            err = vz.fails(125 if command[0] == "exec" else 4, *command, cwd=second)
            assert f"default ({default['id']}), bound to {first}" in err, err
            assert f"this worktree ({second})" in err
            assert "vz up --environment NAME" in err and "vz up --environment NEW-NAME" in err
        # Write the first worktree's vz.json differently in the second: still nothing is recreated there.
        (second / "vz.json").write_text(json.dumps(definition(environment={"CHANGED": "1"})))
        vz.fails(4, "up", "--recreate", cwd=second)
        assert machines_on_disk(vz.home) == before
        after = vz.envs(first)
        assert list(after) == ["default"] and [m["id"] for m in after["default"]["machines"]] == ids
        assert [m["state"] for m in after["default"]["machines"]] == ["running", "running"]

        # The second worktree makes its own Environment, explicitly; the first one's bytes stay.
        vz.ok("up", "--environment", "feature", cwd=second)
        vz.ok("exec", "--", "sh", "-c", "echo mine > sentinel", cwd=second)
        envs = vz.envs(first)
        assert envs["feature"]["bound_worktrees"] == [str(second)]
        for key, digest in before.items():
            assert machines_on_disk(vz.home)[key] == digest
        assert vz.ok("exec", "--", "cat", "sentinel", cwd=second) == "mine\n"
    finally:
        for env in vz.envs(first).values():
            vz.run("delete", "--environment", env["id"], cwd=first)


def test_the_selection_table(tmp_path: Path, worktrees: tuple[Path, Path]) -> None:
    first, second = worktrees
    vz = Vz(tmp_path / "home")
    probe = ("sh", "-c", "echo $VZ_ENVIRONMENT_ID $VZ_MACHINE_ID")
    try:
        # No Environment at all: up creates "default"; nothing else has anything to act on.
        assert "has no Environment yet" in vz.fails(125, "exec", "--", "true", cwd=first)
        vz.ok("up", cwd=first)
        envs = vz.envs(first)
        default = envs["default"]
        web, db = (m["id"] for m in default["machines"])

        # Binding (first worktree) + default Machine.
        assert vz.ok("exec", "--", *probe, cwd=first).split() == [default["id"], web]
        # Explicit Machine by name and by id; VZ_MACHINE_ID; a wrong one fails at its level.
        assert vz.ok("exec", "--machine", "db", "--", *probe, cwd=first).split()[1] == db
        assert vz.ok("exec", "--machine", db, "--", *probe, cwd=first).split()[1] == db
        assert vz.ok("exec", "--", *probe, cwd=first, env={"VZ_MACHINE_ID": db}).split()[1] == db
        bogus_machine = {"VZ_MACHINE_ID": "mch_000000000000"}
        assert "VZ_MACHINE_ID=mch_000000000000" in vz.fails(125, "exec", "--", "true", cwd=first, env=bogus_machine)

        # Unbound worktree: fails closed; explicit name, explicit id and VZ_ENVIRONMENT_ID select without binding.
        vz.fails(125, "exec", "--", "true", cwd=second)
        assert vz.ok("exec", "--environment", "default", "--", *probe, cwd=second).split()[0] == default["id"]
        assert vz.ok("exec", "--environment", default["id"], "--", *probe, cwd=second).split()[0] == default["id"]
        by_var = {"VZ_ENVIRONMENT_ID": default["id"]}
        assert vz.ok("exec", "--", *probe, cwd=second, env=by_var).split()[0] == default["id"]
        assert vz.envs(first)["default"]["bound_worktrees"] == [str(first)]  # exec never binds
        # Wrong selectors fail at their level (never fall through to a binding).
        assert "--environment nope" in vz.fails(125, "exec", "--environment", "nope", "--", "true", cwd=first)
        bogus = {"VZ_ENVIRONMENT_ID": "env_000000000000"}
        assert "VZ_ENVIRONMENT_ID=env_000000000000" in vz.fails(125, "exec", "--", "true", cwd=first, env=bogus)

        # `vz up --environment default` from the second worktree binds it (after the ownership checks).
        vz.ok("up", "--environment", "default", cwd=second)
        assert vz.envs(first)["default"]["bound_worktrees"] == sorted([str(first), str(second)])
        assert vz.ok("exec", "--", *probe, cwd=second).split()[0] == default["id"]

        # One worktree may own several Environments: then, with no selector, every command fails listing them.
        vz.ok("up", "--environment", "extra", cwd=second)
        extra = vz.envs(first)["extra"]
        err = vz.fails(125, "exec", "--", "true", cwd=second)
        assert "bound to several Environments" in err
        assert f"default ({default['id']})" in err and f"extra ({extra['id']})" in err
        vz.fails(4, "up", cwd=second)
        assert vz.ok("exec", "--environment", "extra", "--", *probe, cwd=second).split()[0] == extra["id"]
        # The first worktree still has exactly one binding.
        assert vz.ok("exec", "--", *probe, cwd=first).split()[0] == default["id"]

        # Several Machines and no default: the Machine level is ambiguous.
        (first / "vz.json").write_text(json.dumps({**definition(), "default_machine": None}))
        vz.ok("up", cwd=first)
        err = vz.fails(125, "exec", "--", "true", cwd=first)
        assert "several Machines and no default_machine" in err

        # Deleting removes its bindings: the second worktree is then bound to "extra" only.
        vz.ok("delete", "--environment", "default", cwd=first)
        assert vz.ok("exec", "--", *probe, cwd=second).split()[0] == extra["id"]
        # The first worktree is unbound now and fails closed rather than adopting "extra".
        assert f"extra ({extra['id']}), bound to {second}" in vz.fails(125, "exec", "--", "true", cwd=first)
    finally:
        for env in vz.envs(first).values():
            vz.run("delete", "--environment", env["id"], cwd=first)
