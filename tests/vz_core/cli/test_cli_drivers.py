"""Drivers from the CLI: listing, verifying, and a Machine on an external (out-of-process, checksummed) driver."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
from vzcli import Vz, fake_machine, write_project

from vz_core.drivers import builtin_manifest


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
    vz.ok("delete", cwd=project)
    assert not [p for p in psutil.process_iter(["cmdline"]) if _ours(p, vz.home)], "a plugin process outlived vz"


def _ours(proc: psutil.Process, home: Path) -> bool:
    """A vz-driver-fake process launched for this test (other tests may run their own plugins meanwhile)."""
    try:
        return "vz-driver-fake" in " ".join(proc.info["cmdline"] or []) and proc.environ().get("VZ_HOME") == str(home)
    except psutil.Error:
        return False
