"""End to end: two Environments of two Machines each, through the real `vz` console script.

The whole lifecycle a user goes through: up in two worktrees, exec everywhere, selection rules and their
errors, stop/start, status, and deletion safety (the sibling Environment's Machines keep their sentinel files
byte-identical). It runs on the fake driver and on linux_native (root, runc); ``VZ_E2E_DRIVER`` narrows it to
one driver (any installed one) and ``VZ_E2E_IMAGE`` changes the image (default "vz:default", embedded).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

IMAGE = os.environ.get("VZ_E2E_IMAGE", "vz:default")
DRIVERS = [
    pytest.param("fake", id="fake"),
    pytest.param("linux_native", id="linux_native", marks=pytest.mark.root),
]
if os.environ.get("VZ_E2E_DRIVER"):
    DRIVERS = [pytest.param(os.environ["VZ_E2E_DRIVER"], id=os.environ["VZ_E2E_DRIVER"])]
MACHINES = ("web", "db")

pytestmark = pytest.mark.slow


class Vz:
    def __init__(self, home: Path) -> None:
        beside = Path(sys.executable).parent / "vz"
        self.exe = str(beside) if beside.exists() else (shutil.which("vz") or "vz")
        self.home = home

    def run(
        self, *args: str, cwd: Path, input: bytes = b"", env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("VZ_") or k.startswith("VZ_E2E")}
        environ["VZ_HOME"] = str(self.home)
        environ.update(env or {})
        return subprocess.run(
            [self.exe, *args], cwd=cwd, input=input, capture_output=True, env=environ, timeout=300, check=False
        )

    def ok(self, *args: str, cwd: Path, **kw: Any) -> bytes:
        proc = self.run(*args, cwd=cwd, **kw)
        assert proc.returncode == 0, f"vz {' '.join(args)} → {proc.returncode}: {proc.stderr.decode()}"
        assert b"Traceback" not in proc.stderr
        return proc.stdout

    def fails(self, code: int, *args: str, cwd: Path, **kw: Any) -> str:
        proc = self.run(*args, cwd=cwd, **kw)
        err = proc.stderr.decode()
        assert proc.returncode == code, f"vz {' '.join(args)}: expected {code}, got {proc.returncode}: {err}"
        assert "Traceback" not in err
        return err

    def status(self, cwd: Path, *args: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.ok("status", "--json", *args, cwd=cwd))
        return result


def definition(driver: str) -> dict[str, Any]:
    machine = {"profile": "developer", "driver": driver, "image": IMAGE, "workspace": {"projection": "none"}}
    return {
        "version": 1,
        "project_id": "e2e-demo",
        "machines": [{"name": name, **machine} for name in MACHINES],
        "default_machine": "web",
    }


def worktree(path: Path, driver: str) -> Path:
    path.mkdir(parents=True)
    (path / "vz.json").write_text(json.dumps(definition(driver), indent=2))
    return path


def on_disk_sentinels(home: Path) -> dict[str, str]:
    """Digest of every sentinel file the driver keeps under VZ_HOME (where a driver keeps Machines on disk)."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in home.rglob("sentinel") if p.is_file()}


def _delete_everything(vz: Vz, cwd: Path) -> None:
    """Best effort, so a failing run leaves no Machine (process, mount) behind."""
    proc = vz.run("status", "--all", "--json", cwd=cwd)
    if proc.returncode == 0:
        for env in json.loads(proc.stdout)["environments"]:
            vz.run("delete", "--environment", env["id"], cwd=cwd)


@pytest.mark.parametrize("driver", DRIVERS)
def test_two_environments_of_two_machines(tmp_path: Path, driver: str) -> None:
    if driver == "linux_native" and os.geteuid() != 0:
        pytest.fail("the linux_native end-to-end run needs root (namespaces, cgroups, overlay mounts)")
    vz = Vz(tmp_path / "home")
    main = worktree(tmp_path / "main", driver)
    feature = worktree(tmp_path / "feature", driver)
    stranger = worktree(tmp_path / "stranger", driver)

    try:
        # --- up: the first worktree gets "default", the second its own named Environment -----------------------
        vz.ok("up", cwd=main)
        vz.ok("up", "--environment", "feature", cwd=feature)
        report = vz.status(main, "--all")
        envs = {e["name"]: e for e in report["environments"]}
        assert sorted(envs) == ["default", "feature"]
        assert envs["default"]["bound_worktrees"] == [str(main)]
        assert envs["feature"]["bound_worktrees"] == [str(feature)]
        ids = {(e, m["name"]): m["id"] for e in envs for m in envs[e]["machines"]}
        workspaces = {m["workspace_id"] for e in envs.values() for m in e["machines"]}
        assert len(set(ids.values())) == 4 and len(workspaces) == 4
        for env in envs.values():
            assert [(m["name"], m["state"]) for m in env["machines"]] == [("web", "running"), ("db", "running")]
            for machine in env["machines"]:
                assert machine["driver"]["name"] == driver and machine["profile"] == "developer"
                assert machine["drift"]["status"] == "in-sync"

        # --- each worktree reaches its own Environment without flags; ids are visible inside the Machine ---------
        probe = ("sh", "-c", "echo $VZ_ENVIRONMENT_ID $VZ_MACHINE_ID")
        assert vz.ok("exec", "--", *probe, cwd=main).decode().split() == [envs["default"]["id"], ids["default", "web"]]
        assert vz.ok("exec", "--", *probe, cwd=feature).decode().split() == [
            envs["feature"]["id"],
            ids["feature", "web"],
        ]

        # --- isolation: a sentinel per Machine, each sees only its own ----------------------------------------------
        sentinels: dict[tuple[str, str], bytes] = {}
        for env in ("default", "feature"):
            for machine in MACHINES:
                data = secrets.token_bytes(4096) + f"{env}/{machine}".encode()
                sentinels[env, machine] = data
                vz.ok(
                    "exec",
                    "--environment",
                    env,
                    "--machine",
                    machine,
                    "--",
                    "sh",
                    "-c",
                    "cat > sentinel",
                    cwd=main,
                    input=data,
                )
        for (env, machine), data in sentinels.items():
            assert (
                vz.ok("exec", "--environment", env, "--machine", machine, "--", "cat", "sentinel", cwd=stranger) == data
            )

        # --- selection errors fail at their own level ---------------------------------------------------------------
        err = vz.fails(125, "exec", "--", "true", cwd=stranger)  # unbound worktree, two bound Environments
        assert f"default ({envs['default']['id']})" in err and f"feature ({envs['feature']['id']})" in err
        assert "--environment nope" in vz.fails(125, "exec", "--environment", "nope", "--", "true", cwd=main)
        assert "--machine cache" in vz.fails(125, "exec", "--machine", "cache", "--", "true", cwd=main)
        bogus = {"VZ_ENVIRONMENT_ID": "env_000000000000"}
        assert "VZ_ENVIRONMENT_ID=env_000000000000" in vz.fails(125, "exec", "--", "true", cwd=main, env=bogus)
        by_id = {"VZ_ENVIRONMENT_ID": envs["feature"]["id"]}
        assert vz.ok("exec", "--", *probe, cwd=main, env=by_id).decode().split()[0] == envs["feature"]["id"]
        assert vz.fails(4, "status", cwd=stranger)  # the same ambiguity for status

        # --- stop one Environment; the other keeps running; up brings it back with its data -------------------------
        vz.ok("stop", "--environment", "feature", cwd=main)
        states = {e["name"]: [m["state"] for m in e["machines"]] for e in vz.status(main, "--all")["environments"]}
        assert states == {"default": ["running", "running"], "feature": ["stopped", "stopped"]}
        assert "is not running" in vz.fails(125, "exec", "--", "true", cwd=feature)
        vz.ok("up", cwd=feature)
        assert vz.ok("exec", "--machine", "db", "--", "cat", "sentinel", cwd=feature) == sentinels["feature", "db"]
        after_restart = vz.status(feature)["environments"][0]
        assert {m["name"]: m["id"] for m in after_restart["machines"]} == {m: ids["feature", m] for m in MACHINES}

        # --- deletion safety: deleting "feature" leaves every byte of "default" alone -------------------------------
        disk_before = on_disk_sentinels(vz.home)
        vz.ok("delete", "--environment", "feature", cwd=main)
        remaining = vz.status(main, "--all")["environments"]
        assert [e["name"] for e in remaining] == ["default"]
        assert [(m["id"], m["state"]) for m in remaining[0]["machines"]] == [
            (ids["default", m], "running") for m in MACHINES
        ]
        for machine in MACHINES:
            out = vz.ok("exec", "--environment", "default", "--machine", machine, "--", "cat", "sentinel", cwd=main)
            assert out == sentinels["default", machine]
        disk_after = on_disk_sentinels(vz.home)
        assert set(disk_after) <= set(disk_before)
        assert {p: disk_before[p] for p in disk_after} == disk_after
        if disk_before:  # a driver that keeps Machines under VZ_HOME: feature's sentinels are gone, default's stay
            digest = {key: hashlib.sha256(data).hexdigest() for key, data in sentinels.items()}
            assert {digest["default", m] for m in MACHINES} <= set(disk_after.values())
            assert not {digest["feature", m] for m in MACHINES} & set(disk_after.values())
        assert "--environment feature" in vz.fails(125, "exec", "--environment", "feature", "--", "true", cwd=main)
        # The deleted Environment's worktree binding went with it: that worktree is unbound now and never adopts the
        # Environment another worktree uses (it fails closed, listing it and the commands that select one).
        err = vz.fails(125, "exec", "--", *probe, cwd=feature)
        assert f"default ({envs['default']['id']}), bound to {main}" in err and "vz up --environment" in err

        # --- delete the last one ------------------------------------------------------------------------------------
        vz.ok("delete", cwd=main)
        assert vz.status(main, "--all")["environments"] == []
        assert on_disk_sentinels(vz.home) == {}
        assert "has no Environment yet" in vz.fails(125, "exec", "--", "true", cwd=main)
    finally:
        _delete_everything(vz, main)
