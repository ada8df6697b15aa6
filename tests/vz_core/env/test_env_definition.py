"""The ProjectDefinition model: examples, schema export, and errors that carry JSON paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vz_core.env import DefinitionError, ProjectDefinition, SecretRef, definition_json_schema, load_definition
from vz_core.env import parse_definition as parse

ROOT = Path(__file__).resolve().parents[3]


def machine(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "web", "profile": "developer", "driver": "fake", "image": "vz:default"}
    base.update(overrides)
    return base


def project(*machines: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"version": 1, "project_id": "demo", "machines": list(machines) or [machine()]}
    base.update(overrides)
    return base


def problems(data: object) -> dict[str, str]:
    with pytest.raises(DefinitionError) as info:
        parse(data)
    return dict(info.value.problems)


@pytest.mark.parametrize("path", sorted(ROOT.glob("examples/*/vz.json")), ids=lambda p: p.parent.name)
def test_every_example_is_valid(path: Path) -> None:
    definition = load_definition(path)
    assert definition.version in (1, 2)
    assert definition.effective_default_machine() is not None


def test_the_two_machines_example_declares_its_topology() -> None:
    definition = load_definition(ROOT / "examples/two-machines/vz.json")
    assert definition.version == 2


def test_committed_schema_matches_the_model() -> None:
    committed = json.loads((ROOT / "schemas" / "vz.schema.json").read_text())
    assert committed == definition_json_schema(), (
        "schemas/vz.schema.json is stale: regenerate it with "
        "`python -m vz_core.env._definition > schemas/vz.schema.json`"
    )


def test_schema_declares_the_required_machine_fields() -> None:
    schema = definition_json_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    assert set(schema["required"]) == {"version", "project_id", "machines"}
    machine_schema = schema["$defs"]["Machine"]
    assert set(machine_schema["required"]) == {"name", "profile", "driver", "image"}
    assert machine_schema["properties"]["profile"]["enum"] == ["developer", "hardened"]
    workspace = schema["$defs"]["Workspace"]["properties"]["projection"]["enum"]
    assert workspace == ["read-write", "read-only", "snapshot", "none"]


def test_defaults_are_filled_in() -> None:
    definition = parse(project())
    m = definition.machines[0]
    assert (m.target.os, m.target.arch) == ("linux", None)
    assert m.workspace.projection == "read-write" and m.workspace.target == "/workspace"
    assert m.egress == "allow"
    assert definition.effective_default_machine() == "web"


def test_sizes_accept_units_and_bytes() -> None:
    m = parse(project(machine(resources={"cpus": 2, "memory": "512MiB", "disk": "10GB"}))).machines[0]
    assert m.resources.memory == 512 * 1024**2
    assert m.resources.disk == 10 * 1000**3
    assert parse(project(machine(resources={"memory": 4096}))).machines[0].resources.memory == 4096


def test_secret_references_are_recorded_as_references() -> None:
    m = parse(project(machine(environment={"PLAIN": "x", "TOKEN": {"from_env": "GITHUB_TOKEN"}}))).machines[0]
    assert m.environment["TOKEN"] == SecretRef(from_env="GITHUB_TOKEN")
    assert m.secret_refs() == {"TOKEN": "GITHUB_TOKEN"}
    assert m.recorded()["environment"] == {"PLAIN": "x", "TOKEN": {"from_env": "GITHUB_TOKEN"}}


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        pytest.param(
            project(machine(profile=None)), "$.machines[0].profile", "'developer' or 'hardened'", id="null-profile"
        ),
        pytest.param(
            project({"name": "web", "driver": "fake", "image": "i"}),
            "$.machines[0].profile",
            "required field is missing (machine 'web')",
            id="missing-profile",
        ),
        pytest.param(
            project(machine(workspace={"projection": "rw"})),
            "$.machines[0].workspace.projection",
            "'read-write', 'read-only', 'snapshot' or 'none'",
            id="bad-projection",
        ),
        pytest.param(
            project(machine(colour="blue")),
            "$.machines[0].colour",
            "unknown field (allowed: name, target, profile, driver",
            id="unknown-machine-field",
        ),
        pytest.param(
            project(machine(environment={"A": 3})),
            "$.machines[0].environment.A",
            'expected a string or a secret reference {"from_env": "VARIABLE"}',
            id="env-not-string",
        ),
        pytest.param(
            project(machine(environment={"A": {"from": "X"}})),
            "$.machines[0].environment.A.from",
            "unknown field (allowed: from_env)",
            id="secret-typo",
        ),
        pytest.param(
            project(machine(environment={"VZ_MACHINE_ID": "x"})),
            "$.machines[0].environment",
            "set by vz itself",
            id="reserved-env",
        ),
        pytest.param(
            project(machine(resources={"memory": "lots"})),
            "$.machines[0].resources.memory",
            "not a size",
            id="bad-size",
        ),
        pytest.param(
            project(machine(target={"os": "linux", "arch": "x86"})),
            "$.machines[0].target.arch",
            "'amd64' or 'arm64'",
            id="bad-arch",
        ),
        pytest.param(
            project(machine(workspace={"target": "relative"})),
            "$.machines[0].workspace.target",
            "absolute path",
            id="relative-target",
        ),
        pytest.param(
            project(machine(mounts=[{"type": "bind", "target": "/data"}])),
            "$.machines[0].mounts[0]",
            "needs a 'source'",
            id="bind-without-source",
        ),
        pytest.param(
            project(machine(volumes=[{"name": "v", "target": "/workspace"}])),
            "$.machines[0]",
            "already used by workspace",
            id="target-collision",
        ),
        pytest.param(project(machine(), machine()), "$.machines", "repeated: web", id="duplicate-machines"),
        pytest.param(project(default_machine="db"), "$", "default_machine 'db' is not one of", id="bad-default"),
        pytest.param(project(project_id="Not Valid"), "$.project_id", "lowercase letters", id="bad-project-id"),
        pytest.param(project(machines=[]), "$.machines", "at least 1", id="no-machines"),
        pytest.param({"project_id": "x", "machines": [machine()]}, "$.version", "required field", id="no-version"),
        pytest.param(project(version=3), "$.version", "reads vz.json versions 1 and 2, not 3", id="newer-version"),
        pytest.param(["not", "an", "object"], "$", "expected a JSON object", id="not-object"),
        pytest.param(project(machine(name="Web_1")), "$.machines[0].name", "lowercase letters", id="bad-name"),
    ],
)
def test_errors_name_the_json_path(data: object, path: str, fragment: str) -> None:
    found = problems(data)
    assert path in found, f"expected a problem at {path}, got {found}"
    assert fragment in found[path]


def test_every_problem_is_reported_at_once() -> None:
    found = problems(project(machine(profile="x", image="", colour=1)))
    assert {"$.machines[0].profile", "$.machines[0].image", "$.machines[0].colour"} <= set(found)


def test_error_message_lists_each_problem_on_its_own_line() -> None:
    with pytest.raises(DefinitionError) as info:
        parse(project(machine(profile="x", egress="maybe")), source="/p/vz.json")
    text = str(info.value)
    assert text.startswith("/p/vz.json is not a valid project definition (2 problems):")
    assert "\n  $.machines[0].profile: " in text and "\n  $.machines[0].egress: " in text


def test_invalid_json_reports_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "vz.json"
    path.write_text('{\n  "version": 1,\n  "project_id": "x"\n  "machines": []\n}\n')
    with pytest.raises(DefinitionError, match=r"vz\.json:4:3: invalid JSON: Expecting ',' delimiter"):
        load_definition(path)


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "vz.json"
    path.write_bytes(b'{"version": 1, "project_id": "\xff"}')
    with pytest.raises(DefinitionError, match="not UTF-8"):
        load_definition(path)


def test_definition_is_immutable() -> None:
    definition = parse(project())
    with pytest.raises(Exception, match="frozen"):
        definition.project_id = "other"  # type: ignore[misc]
    assert isinstance(definition, ProjectDefinition)


def test_user_guide_definition_examples_are_valid() -> None:
    import re

    text = (ROOT / "docs" / "user-guide.md").read_text()
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, re.S)]
    definitions = [b for b in blocks if isinstance(b, dict) and "project_id" in b]
    assert definitions, "docs/user-guide.md should show a complete vz.json"
    for data in definitions:
        parse(data)
