"""`vz up` and the Machine's Docker engine (vz.json ``docker``): a Machine that requires one is refused before
anything is created when its profile, driver or image cannot give it one; an ``auto`` Machine on vz:developer
whose driver runs no engine gets a note saying why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from vz_conformance.fake import FakeDriver

import vz_core.env._drivers as env_drivers
from vz_core._types import Extensions, RunImageRequest
from vz_core.docker_engine import FACT_KEY, declare
from vz_core.env import Context, up
from vz_core.env._progress import Progress
from vz_core.errors import UserError


class Declaring(FakeDriver):
    """The fake, declaring a Docker engine (or not) and the hardened profile, counting RunImage calls."""

    engine = ""
    runs: list[RunImageRequest] = []

    async def extensions(self) -> Extensions:
        ext = await super().extensions()
        facts = dict(ext.facts)
        if self.engine:
            facts[FACT_KEY] = self.engine
        return replace(ext, facts=facts, profiles=(*ext.profiles, "hardened"))

    async def run_image(self, request: RunImageRequest) -> None:
        type(self).runs.append(request)
        await super().run_image(request)


class Notes(Progress):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def note(self, kind: str, message: str, **_fields: Any) -> None:
        self.seen.append((kind, message))


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[type[Declaring]]:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    cls = type("Knobs", (Declaring,), {"runs": [], "engine": ""})
    monkeypatch.setattr(env_drivers, "acquire_driver", lambda name, options=None, **_: cls())
    yield cls


def project(root: Path, **machine: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    spec: dict[str, Any] = {"name": "dev", "profile": "developer", "driver": "fake", "image": "vz:developer"}
    spec["workspace"] = {"projection": "none"}
    spec.update(machine)
    (root / "vz.json").write_text(json.dumps({"version": 1, "project_id": "demo", "machines": [spec]}))
    return root


@pytest.mark.parametrize(
    ("engine", "machine", "message"),
    [
        pytest.param("", {}, r"does not declare a Docker engine", id="undeclared"),
        pytest.param(declare("no nesting here"), {}, r"runs no Docker engine: no nesting here", id="declared-no"),
        pytest.param("yes", {"profile": "hardened"}, r"hardened Machines have no Docker engine", id="hardened"),
        pytest.param("yes", {"image": "vz:default"}, r"vz:default has no Docker engine .*use vz:developer", id="img"),
    ],
)
async def test_required_docker_is_refused_before_anything_is_created(
    driver: type[Declaring], tmp_path: Path, engine: str, machine: dict[str, Any], message: str
) -> None:
    driver.engine = engine
    root = project(tmp_path / "p", docker="required", **machine)
    with pytest.raises(UserError, match=r"machines\[0\]\.docker: 'required', but .*" + message):
        await up(Context(cwd=root, environ={}))
    assert driver.runs == []


async def test_required_docker_on_a_driver_that_declares_an_engine_goes_ahead(
    driver: type[Declaring], tmp_path: Path
) -> None:
    driver.engine = "yes"
    await up(Context(cwd=project(tmp_path / "p", docker="required"), environ={}))
    assert len(driver.runs) == 1


@pytest.mark.parametrize("docker", ["auto", "off"])
async def test_auto_notes_an_engine_image_the_driver_cannot_run_and_off_says_nothing(
    driver: type[Declaring], tmp_path: Path, docker: str
) -> None:
    driver.engine = declare("no nesting here")
    notes = Notes()
    root = project(tmp_path / "p", docker=docker)
    await up(Context(cwd=root, environ={}, progress=notes))
    assert len(driver.runs) == 1
    said = [m for _k, m in notes.seen if "Docker" in m]
    if docker == "auto":
        assert said == [
            "$.machines[0]: no Docker engine in this Machine: driver 'fake' runs no Docker engine: no nesting here"
        ]
    else:
        assert said == []


def test_docker_field_rejects_unknown_values(tmp_path: Path) -> None:
    from vz_core.env import load_definition

    root = project(tmp_path / "p", docker="yes")
    with pytest.raises(UserError, match=r"docker"):
        load_definition(root / "vz.json")


def test_the_default_docker_setting_leaves_the_recorded_machine_as_before(tmp_path: Path) -> None:
    from vz_core.env import load_definition

    auto = load_definition(project(tmp_path / "a") / "vz.json").machines[0].recorded()
    assert "docker" not in auto  # records made before the field stay in sync: no recreate on upgrade
    required = load_definition(project(tmp_path / "b", docker="required") / "vz.json").machines[0].recorded()
    assert required["docker"] == "required"


@pytest.mark.parametrize(
    ("engine", "state", "reason"),
    [
        pytest.param(
            declare("no nesting here"), "none", "driver 'fake' runs no Docker engine: no nesting here", id="no"
        ),
        pytest.param(
            "yes",
            "unmanaged",
            "driver 'fake' declares an engine; vz relays no engine socket and makes no context yet",
            id="yes",
        ),
    ],
)
async def test_status_shows_the_machines_engine_state(
    driver: type[Declaring], tmp_path: Path, engine: str, state: str, reason: str
) -> None:
    from vz_core.cli._render import render_status
    from vz_core.env import status

    driver.engine = engine
    context = Context(cwd=project(tmp_path / "p"), environ={})
    await up(context)
    report = await status(context)
    row = report["environments"][0]["machines"][0]
    assert row["docker"] == {"setting": "auto", "state": state, "reason": reason, "socket": None, "context": None}
    assert f"  dev: docker {state}: {reason}" in render_status(report).splitlines()
