"""#18 item 3: secrets escape redaction. Every output path (`vz status` table and --json, `vz delete`/`stop`
--json and plain, `vz exec` errors) and every stored error is masked against all of the Environment's secret
values: those the definition declares and those its recorded Machines reference, read from the caller's
environment now (vz never stores a secret value). Secrets shorter than 4 characters are masked as whole tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_core" / "cli"))
from vzcli import Vz, add_test_driver, fake_machine, write_project

PLUGINS = Path(__file__).resolve().parent / "plugins_redaction"
LONG = "hunter2-very-secret-value"
SHORT = "ab1"


class LeakyVz(Vz):
    """``Vz`` whose runs set what the warm sec_leaky plugin leaks (``VZ_SEC_LEAK``/``VZ_SEC_VALUE`` in a run's
    ``env``) through its control file before the command, and clear it for runs that name none."""

    def __init__(self, home: Path, control: Path) -> None:
        super().__init__(home)
        self.control = control

    def run(self, *args: str, cwd: Path, env: dict[str, str | None] | None = None, **kw: Any) -> Any:
        env = dict(env or {})
        leak, value = env.pop("VZ_SEC_LEAK", None), env.pop("VZ_SEC_VALUE", None)
        self.control.write_text(json.dumps({"leak": leak or "", "value": value or ""}))
        return super().run(*args, cwd=cwd, env=env, **kw)


@pytest.fixture
def vz(tmp_path: Path) -> Vz:
    vz = LeakyVz(tmp_path / "home", tmp_path / "leak-control.json")
    vz.control.write_text("{}")
    add_test_driver(
        vz,
        "sec_leaky",
        cwd=tmp_path,
        plugins=PLUGINS,
        module="vz_sec_leaky",
        environ={"VZ_SEC_CONTROL": str(vz.control)},
    )
    return vz


def _project(root: Path, secret_var: str = "APP_TOKEN") -> Path:
    return write_project(
        root,
        fake_machine("web", driver="sec_leaky", environment={"TOKEN": {"from_env": secret_var}, "MODE": "dev"}),
    )


def _leak(secret: str, *calls: str, var: str = "APP_TOKEN") -> dict[str, str | None]:
    return {var: secret, "VZ_SEC_VALUE": secret, "VZ_SEC_LEAK": ",".join(calls)}


def _state_bytes(vz: Vz) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(vz.home.rglob("state.db*")))


@pytest.mark.parametrize("secret", [LONG, SHORT], ids=["long", "short"])
def test_status_table_and_json_mask_a_secret_in_a_driver_error(vz: Vz, tmp_path: Path, secret: str) -> None:
    proj = _project(tmp_path / "p")
    vz.ok("up", cwd=proj, env={"APP_TOKEN": secret})
    try:
        table = vz.run("status", cwd=proj, env=_leak(secret, "find"))
        assert table.returncode == 0, table.stderr
        text = table.stdout.decode() + table.stderr.decode()
        assert "find failed: backend said token=*** was refused (and ***)" in text
        assert f"={secret} " not in text and f"({secret})" not in text
        raw = vz.run("status", "--json", cwd=proj, env=_leak(secret, "find"))
        assert raw.returncode == 0, raw.stderr
        report = json.loads(raw.stdout)
        machine = report["environments"][0]["machines"][0]
        assert machine["error"] == "find failed: backend said token=*** was refused (and ***)"
        assert machine["driver"]["error"] == machine["error"]
        assert f"={secret} " not in raw.stdout.decode()
    finally:
        vz.run("delete", cwd=proj, env={"APP_TOKEN": secret})


def test_a_failed_delete_is_masked_in_json_output_and_in_the_state_database(vz: Vz, tmp_path: Path) -> None:
    proj = _project(tmp_path / "p")
    vz.ok("up", cwd=proj, env={"APP_TOKEN": LONG})
    proc = vz.run("delete", "--json", cwd=proj, env=_leak(LONG, "delete"))
    assert proc.returncode == 1, proc.stderr
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert LONG not in out and LONG not in err
    events = [json.loads(line) for line in out.splitlines()]
    error = next(e for e in events if e["event"] == "error")["error"]
    assert error["message"] == "delete failed: backend said token=*** was refused (and ***)"
    assert LONG.encode() not in _state_bytes(vz)
    log = vz.home / "daemon" / "daemon.log"  # the daemon ran the delete: its log (and its plugins' stderr) too
    assert log.exists() and LONG.encode() not in log.read_bytes()
    # Without the variable vz cannot know the value, but it has stored nothing that needs it.
    report = vz.status(proj)
    assert report["environments"][0]["last_operation"]["error"].startswith("delete failed: backend said token=***")
    vz.ok("delete", cwd=proj, env={"APP_TOKEN": LONG})


def test_secrets_of_recorded_machines_are_masked_after_vz_json_dropped_them(vz: Vz, tmp_path: Path) -> None:
    proj = _project(tmp_path / "p", secret_var="OLD_TOKEN")
    vz.ok("up", cwd=proj, env={"OLD_TOKEN": LONG})
    # vz.json no longer declares the secret; the recorded Machine still references it.
    write_project(proj, fake_machine("web", driver="sec_leaky"))
    proc = vz.run("status", "--json", cwd=proj, env=_leak(LONG, "find", var="OLD_TOKEN"))
    assert proc.returncode == 0, proc.stderr
    assert LONG not in proc.stdout.decode()
    assert "token=***" in proc.stdout.decode()
    stop = vz.run("stop", cwd=proj, env=_leak(LONG, "stop", var="OLD_TOKEN"))
    assert stop.returncode == 1 and LONG not in stop.stderr.decode() + stop.stdout.decode()
    assert "token=***" in stop.stderr.decode()
    assert LONG.encode() not in _state_bytes(vz)
    up = vz.run("up", cwd=proj, env=_leak(LONG, "preflight", var="OLD_TOKEN"))
    assert up.returncode == 1 and "preflight failed: backend said token=***" in up.stderr.decode()
    assert LONG not in up.stderr.decode() + up.stdout.decode()
    vz.ok("delete", cwd=proj, env={"OLD_TOKEN": LONG})


@pytest.mark.parametrize("secret", [LONG, SHORT], ids=["long", "short"])
def test_exec_errors_are_masked(vz: Vz, tmp_path: Path, secret: str) -> None:
    proj = _project(tmp_path / "p")
    vz.ok("up", cwd=proj, env={"APP_TOKEN": secret})
    try:
        proc = vz.run("exec", "--", "true", cwd=proj, env=_leak(secret, "exec"))
        err = proc.stderr.decode()
        assert proc.returncode == 125, err  # vz exec's own failure
        assert "exec refused: token=***" in err and f"token={secret}" not in err
    finally:
        vz.run("delete", cwd=proj, env={"APP_TOKEN": secret})


def test_a_short_secret_is_masked_only_as_a_whole_token(vz: Vz, tmp_path: Path) -> None:
    proj = _project(tmp_path / "p")
    vz.ok("up", cwd=proj, env={"APP_TOKEN": SHORT})
    try:
        report = json.loads(vz.ok("status", "--json", cwd=proj, env=_leak(SHORT, "find")))
        assert report["environments"][0]["machines"][0]["error"].count("***") == 2
        # "ab1" inside a longer word (an id, a path) is left alone: ids in the same report are intact.
        env = report["environments"][0]
        assert env["id"].startswith("env_") and "***" not in env["id"]
    finally:
        vz.run("delete", cwd=proj, env={"APP_TOKEN": SHORT})
