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

    def assert_recorded_nothing(self) -> None:
        """Nothing of any project was written under VZ_HOME (a failed command changed nothing).

        Allowed: the vz daemon's own directory (its socket, pid file and log), a state database holding no
        project, Environment, Machine, binding, volume or operation (the daemon's event log lives there), and the
        private directories the daemon makes at start (drivers/, locks/, cache/) while they hold no file.
        """
        if not self.home.exists():
            return
        allowed = {"daemon", "state.db", "state.db-wal", "state.db-shm", "state.db-journal"}
        made = {"drivers", "locks", "cache"}
        extra = sorted(
            p.name
            for p in self.home.iterdir()
            if p.name not in allowed and not (p.name in made and not any(f.is_file() for f in p.rglob("*")))
        )
        assert not extra, f"a failed command wrote {extra} under {self.home}"
        db = self.home / "state.db"
        if db.exists():
            import sqlite3

            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                for table in sorted(
                    tables & {"projects", "environments", "machines", "bindings", "volumes", "operations"}
                ):
                    (count,) = con.execute(f"SELECT count(*) FROM {table}").fetchone()
                    assert count == 0, f"a failed command recorded {count} row(s) in {table}"
            finally:
                con.close()

    def daemon_pid(self) -> int:
        """The pid of the vz daemon serving this home (from its pid file)."""
        info = json.loads((self.home / "daemon" / "daemon.json").read_text())
        pid: int = info["pid"]
        return pid

    def popen(self, *args: str, cwd: Path, **kw: Any) -> subprocess.Popen[bytes]:
        env = self.env(**kw.pop("env", {}))
        return subprocess.Popen([self.exe, *args], cwd=cwd, env=env, **kw)


PLUGIN_SCRIPT = """\
#!{python}
import os
import sys

sys.path.insert(0, {plugins!r})
os.environ["VZ_DRIVER_OPTIONS"] = {options!r}
os.environ.update({environ!r})
from vz_plugins import plugin_main

plugin_main(["--module", {module!r}, {declared!r}])
"""


def add_test_driver(
    vz: Vz,
    name: str,
    *,
    cwd: Path,
    options: dict[str, Any] | None = None,
    plugins: Path = PLUGINS,
    module: str = "vz_test_blocking",
    declared: str | None = None,
    environ: dict[str, str] | None = None,
) -> None:
    """Record test-only driver ``declared`` (default ``name``) of ``plugins/<module>.py`` as external driver
    ``name`` of ``vz``'s home: a plugin script pinned by its SHA-256 in a manifest, added with `vz driver add`.

    The vz daemon runs every driver out of process, so a test driver is a plugin like any other. External
    drivers take no options from vz.json: ``options`` (and ``environ``, variables the plugin process gets) are
    fixed in the script (the driver's own configuration).
    """
    import hashlib

    from vz_core.trust import host_platform

    where = vz.home.parent / f"test-driver-{name}"
    where.mkdir(parents=True)
    script = where / f"vz-test-{name}"
    script.write_text(
        PLUGIN_SCRIPT.format(
            python=sys.executable,
            plugins=str(plugins),
            options=json.dumps(options or {}),
            module=module,
            declared=declared or name,
            environ=environ or {},
        )
    )
    script.chmod(0o755)
    manifest = {
        "manifest_version": 1,
        "name": name,
        "version": "0",
        "api_version": "1.3",
        "binaries": {host_platform(): {"path": str(script), "sha256": hashlib.sha256(script.read_bytes()).hexdigest()}},
    }
    (where / "manifest.json").write_text(json.dumps(manifest))
    vz.ok("driver", "add", str(where / "manifest.json"), cwd=cwd)


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
