"""`vz volume list` lists every recorded volume with its state (in use, kept); `vz volume rm` says why it
refuses one in use. Through the real console script and daemon, linux_native (the fake driver keeps no named
volumes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from vzcli import Vz, fake_machine, write_project

pytestmark = pytest.mark.slow


def test_volumes_in_use_and_kept_are_listed_with_their_state(tmp_path: Path) -> None:
    vz = Vz(tmp_path / "home", extra_env={k: os.environ[k] for k in ("VZ_AGENT_BINARY",) if k in os.environ})
    machine = fake_machine("web", driver="linux_native", volumes=[{"name": "cache", "target": "/cache"}])
    project = write_project(tmp_path / "p", machine)
    assert vz.ok("volume", "list", cwd=project).startswith("no volumes")
    vz.ok("up", cwd=project)
    try:
        listed = json.loads(vz.ok("volume", "list", "--json", cwd=project))["volumes"]
        assert [(v["volume"], v["state"]) for v in listed] == [("cache", "attached")]
        name = listed[0]["name"]
        human = vz.ok("volume", "list", cwd=project)
        assert "in use" in human and name in human and "vz volume rm" not in human
        err = vz.fails(3, "volume", "rm", name, cwd=project)
        assert f"volume {name!r} is in use by Machine" in err and "`vz delete` removes it" in err
    finally:
        vz.ok("delete", "--keep-volumes", cwd=project)
    listed = json.loads(vz.ok("volume", "list", "--json", cwd=project))["volumes"]
    assert [(v["name"], v["state"]) for v in listed] == [(name, "kept")]
    assert "remove one with `vz volume rm NAME`" in vz.ok("volume", "list", cwd=project)
    vz.ok("volume", "rm", name, cwd=project)
    assert json.loads(vz.ok("volume", "list", "--json", cwd=project)) == {"volumes": []}
    vz.run("daemon", "stop", cwd=project)
