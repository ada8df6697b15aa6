"""The real `vz` (CLI, daemon, driver plugin) in one project directory of a version 2 vz.json, for the tests that
bring a networked Environment up through it: ``vz_project(tmp_path, definition)`` writes the project, yields a
``ProjectVz`` and, whatever the test did, deletes the Environment, removes its route domain and stops the daemon.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vz_core.daemon import stop_daemon
from vz_core.network import remove_domain


class ProjectVz:
    """Runs `vz` in ``cwd`` with its own VZ_HOME (``home``) and no other VZ_* setting of this process."""

    def __init__(self, home: Path, cwd: Path) -> None:
        beside = Path(sys.executable).parent / "vz"
        self.exe = str(beside) if beside.exists() else "vz"
        self.home = home
        self.cwd = cwd
        self.environ = {k: v for k, v in os.environ.items() if not k.startswith("VZ_")}
        self.environ["VZ_HOME"] = str(home)
        self.env_id = ""
        """The Environment's id, once ``up`` or ``status`` saw it (what the clean-up removes)."""

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.exe, *args], cwd=self.cwd, env=self.environ, capture_output=True, text=True, timeout=300
        )

    def ok(self, *args: str, stderr: bool = False) -> str:
        """Run, require exit 0; the stdout text (followed by the stderr text with ``stderr``)."""
        proc = self.run(*args)
        assert proc.returncode == 0, f"vz {' '.join(args)} -> {proc.returncode}: {proc.stderr}"
        return proc.stdout + proc.stderr if stderr else proc.stdout

    def sh(self, machine: str, script: str) -> str:
        """``script`` run by ``sh -c`` in ``machine`` (must exit 0); its stdout, stripped."""
        proc = self.run("exec", "--machine", machine, "--", "sh", "-c", script)
        assert proc.returncode == 0, f"{machine}: {script} -> {proc.returncode}: {proc.stderr}"
        return proc.stdout.strip()

    def status(self) -> dict[str, Any]:
        """The one Environment of `vz status --json` (its id noted in ``env_id``)."""
        report = json.loads(self.ok("status", "--json"))
        (env,) = report["environments"]
        self.env_id = env["id"]
        return dict(env)

    def up(self) -> str:
        """`vz up` (must exit 0), then the Environment's id noted; its stdout and stderr text."""
        out = self.ok("up", stderr=True)
        self.status()
        return out


@contextmanager
def vz_project(tmp_path: Path, definition: Mapping[str, Any]) -> Iterator[ProjectVz]:
    """``tmp_path/project/vz.json`` holding ``definition`` and a ``ProjectVz`` there (home ``tmp_path/home``).

    On exit, whatever happened: `vz delete`, the route domain of ``env_id`` (and its host egress) removed if
    anything of them is left, the daemon stopped.
    """
    where = tmp_path / "project"
    where.mkdir()
    (where / "vz.json").write_text(json.dumps(definition))
    vz = ProjectVz(tmp_path / "home", where)
    try:
        yield vz
    finally:
        vz.run("delete")
        if vz.env_id:
            asyncio.run(remove_domain(vz.env_id))
        stop_daemon(vz.home, environ=vz.environ)
