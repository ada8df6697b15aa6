"""Helpers for CLI tests: the real `vz` console script in a subprocess, with its own VZ_HOME."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PLUGINS = Path(__file__).resolve().parent / "plugins"


def vz_executable() -> str:
    beside = Path(sys.executable).parent / "vz"
    if beside.exists():
        return str(beside)
    found = shutil.which("vz")
    assert found, "the vz console script is not installed (pip install -e .)"
    return found


class Vz:
    """Runs `vz` with its own state directory; ``extra_env`` applies to every run."""

    def __init__(self, home: Path, extra_env: dict[str, str] | None = None) -> None:
        self.home = home
        self.exe = vz_executable()
        self.extra_env = extra_env or {}

    def env(self, **overrides: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_") and k != "PYTEST_CURRENT_TEST"}
        env["VZ_HOME"] = str(self.home)
        env.update(self.extra_env)
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def run(
        self,
        *args: str,
        cwd: Path,
        input: bytes | None = None,
        env: dict[str, str | None] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [self.exe, *args],
            cwd=cwd,
            input=input if input is not None else b"",
            capture_output=True,
            env=self.env(**(env or {})),
            timeout=timeout,
            check=False,
        )

    def ok(self, *args: str, cwd: Path, **kw: Any) -> str:
        """Run, require exit 0 and no traceback; the stdout text."""
        proc = self.run(*args, cwd=cwd, **kw)
        assert proc.returncode == 0, f"vz {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()}"
        assert b"Traceback" not in proc.stderr
        return proc.stdout.decode()

    def fails(self, code: int, *args: str, cwd: Path, **kw: Any) -> str:
        """Run, require exit ``code``, a one-line-per-problem message and no traceback; the stderr text."""
        proc = self.run(*args, cwd=cwd, **kw)
        err = proc.stderr.decode()
        assert proc.returncode == code, f"vz {' '.join(args)}: expected {code}, got {proc.returncode}: {err}"
        assert "Traceback" not in err, err
        return err

    def status(self, cwd: Path, *args: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.ok("status", "--json", *args, cwd=cwd))
        return data

    def popen(self, *args: str, cwd: Path, **kw: Any) -> subprocess.Popen[bytes]:
        env = self.env(**kw.pop("env", {}))
        return subprocess.Popen([self.exe, *args], cwd=cwd, env=env, **kw)


def write_project(root: Path, *machines: dict[str, Any], project_id: str = "demo", **extra: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    data = {"version": 1, "project_id": project_id, "machines": list(machines), **extra}
    (root / "vz.json").write_text(json.dumps(data, indent=2))
    return root


def fake_machine(name: str, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name,
        "profile": "developer",
        "driver": "fake",
        "image": "vz:default",
        "workspace": {"projection": "none"},
    }
    base.update(overrides)
    return base
