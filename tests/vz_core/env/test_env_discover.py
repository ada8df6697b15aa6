"""Finding vz.json upward and the fast header read used by `vz exec`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vz_core.env import DefinitionError, DefinitionNotFoundError, find_definition
from vz_core.env._discover import read_header

GOOD = {
    "version": 1,
    "project_id": "demo",
    "machines": [{"name": "m", "profile": "developer", "driver": "fake", "image": "i"}],
}


def test_nearest_definition_upward_wins(tmp_path: Path) -> None:
    (tmp_path / "vz.json").write_text(json.dumps(GOOD))
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    assert find_definition(inner) == tmp_path / "vz.json"
    (tmp_path / "a" / "vz.json").write_text(json.dumps(GOOD))
    assert find_definition(inner) == tmp_path / "a" / "vz.json"


def test_missing_definition_names_every_directory_searched(tmp_path: Path) -> None:
    inner = tmp_path / "x" / "y"
    inner.mkdir(parents=True)
    with pytest.raises(DefinitionNotFoundError) as info:
        find_definition(inner)
    searched = info.value.searched
    assert searched[0] == str(inner) and searched[1] == str(tmp_path / "x") and searched[-1] == "/"
    assert f"no vz.json found in {inner} or any parent directory" in str(info.value)


def test_explicit_file_and_directory(tmp_path: Path) -> None:
    (tmp_path / "vz.json").write_text(json.dumps(GOOD))
    assert find_definition(Path("/"), tmp_path) == tmp_path / "vz.json"
    assert find_definition(tmp_path, Path("vz.json")) == tmp_path / "vz.json"
    with pytest.raises(DefinitionNotFoundError, match="given with --file"):
        find_definition(tmp_path, Path("missing.json"))


def test_header_reads_project_id(tmp_path: Path) -> None:
    path = tmp_path / "vz.json"
    path.write_text(json.dumps(GOOD))
    header = read_header(path)
    assert header.project_id == "demo" and header.worktree == tmp_path


def test_header_of_a_broken_file_gives_the_full_validation_error(tmp_path: Path) -> None:
    path = tmp_path / "vz.json"
    path.write_text(json.dumps({**GOOD, "project_id": "Bad Id"}))
    with pytest.raises(DefinitionError, match=r"\$\.project_id"):
        read_header(path)
    path.write_text("{")
    with pytest.raises(DefinitionError, match="invalid JSON"):
        read_header(path)
