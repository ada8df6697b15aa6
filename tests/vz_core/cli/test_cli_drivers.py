"""Drivers from the CLI: listing, verifying, and a Machine on an external (out-of-process, checksummed) driver."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest
from vzcli import Vz, fake_machine, write_project

from vz_core.drivers import builtin_manifest
from vz_core.errors import UserError


def test_list_and_verify(vz: Vz, tmp_path: Path) -> None:
    out = vz.ok("driver", "list", cwd=tmp_path)
    assert any(line.startswith("fake ") and "builtin" in line for line in out.splitlines())
    listed = json.loads(vz.ok("driver", "list", "--json", cwd=tmp_path))
    assert {"name": "fake", "origin": "builtin"}.items() <= next(
        d for d in listed["drivers"] if d["name"] == "fake"
    ).items()
    out = vz.ok("driver", "verify", "fake", cwd=tmp_path)
    assert out.startswith("fake") and " ok " in out
    assert "unknown driver 'nope'" in vz.fails(3, "driver", "verify", "nope", cwd=tmp_path)


def test_machine_on_an_external_driver(vz: Vz, tmp_path: Path) -> None:
    manifest = tmp_path / "fake-ext.json"
    data = builtin_manifest("fake", manifest)  # the fake's plugin console script, pinned by its SHA-256
    data["name"] = "fake-ext"
    manifest.write_text(json.dumps(data))
    assert "added driver fake-ext" in vz.ok("driver", "add", str(manifest), cwd=tmp_path)
    project = write_project(tmp_path / "p", fake_machine("web", driver="fake-ext"))
    vz.ok("up", cwd=project)
    assert vz.ok("exec", "--", "sh", "-c", "echo via plugin", cwd=project) == "via plugin\n"
    web = vz.status(project)["environments"][0]["machines"][0]
    assert web["driver"]["name"] == "fake-ext" and web["driver"]["driver_name"] == "fake" and web["state"] == "running"
    provenance = web["driver"]["provenance"]
    assert provenance["origin"] == "file" and provenance["source"] == str(manifest) and provenance["signed"] is False
    vz.ok("delete", cwd=project)
    assert [p for p in psutil.process_iter(["cmdline"]) if _ours(p, vz.home)], "the daemon keeps the plugin warm"
    vz.ok("daemon", "stop", cwd=tmp_path)
    deadline = time.monotonic() + 10
    while [p for p in psutil.process_iter(["cmdline"]) if _ours(p, vz.home)]:
        assert time.monotonic() < deadline, "a plugin process outlived the vz daemon"
        time.sleep(0.05)


def _ours(proc: psutil.Process, home: Path) -> bool:
    """A vz-driver-fake process launched for this test (other tests may run their own plugins meanwhile)."""
    try:
        return "vz-driver-fake" in " ".join(proc.info["cmdline"] or []) and proc.environ().get("VZ_HOME") == str(home)
    except psutil.Error:
        return False


def _driver_command(*argv: str) -> int:
    import argparse

    from vz_core.cli._driver_cmd import add_driver_arguments, run_driver_command

    parser = argparse.ArgumentParser(prog="vz driver")
    add_driver_arguments(parser)
    return run_driver_command(parser.parse_args(list(argv)))


def test_configure_sets_shows_and_unsets_host_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    config = tmp_path / "home" / "config" / "drivers.json"
    assert _driver_command("configure", "linux_native", "subnet=10.77.0.0/16", "stop_timeout=3") == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"linux_native host configuration ({config}):",
        "  stop_timeout = 3.0",
        '  subnet = "10.77.0.0/16"',
    ]
    assert json.loads(config.read_text()) == {"linux_native": {"stop_timeout": 3.0, "subnet": "10.77.0.0/16"}}
    assert _driver_command("configure", "linux_native", "--unset", "stop_timeout", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {
        "name": "linux_native",
        "path": str(config),
        "options": {"subnet": "10.77.0.0/16"},
    }
    with pytest.raises(UserError, match=r"unknown linux_native option\(s\): colour; valid options: agent_binary"):
        _driver_command("configure", "linux_native", "colour=blue")
    with pytest.raises(UserError, match="is not a driver name"):
        _driver_command("configure", "../etc", "x=1")


def test_vz_driver_configure_is_where_host_options_are_set(vz: Vz, tmp_path: Path) -> None:
    state = tmp_path / "fake-state"
    out = vz.ok("driver", "configure", "fake", f"state_dir={state}", cwd=tmp_path)
    assert f"state_dir = {json.dumps(str(state))}" in out
    project = write_project(tmp_path / "p", fake_machine("web"))
    vz.ok("up", cwd=project)
    try:
        assert (state / "machines").is_dir() and any((state / "machines").iterdir())
        assert not (vz.home / "drivers" / "fake").exists()
    finally:
        vz.ok("delete", cwd=project)
    refused = write_project(tmp_path / "q", fake_machine("web", driver_options={"state_dir": str(tmp_path / "x")}))
    err = vz.fails(2, "up", cwd=refused)
    assert "driver_options.state_dir" in err and "vz driver configure fake state_dir=VALUE" in err
    assert json.loads(vz.ok("driver", "configure", "fake", "--json", cwd=tmp_path))["options"] == {
        "state_dir": str(state)
    }
