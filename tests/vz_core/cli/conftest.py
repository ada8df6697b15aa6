"""Fixtures for CLI tests (helpers live in vzcli.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vzcli import Vz, fake_machine, write_project


@pytest.fixture
def vz(tmp_path: Path) -> Vz:
    return Vz(tmp_path / "home")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "proj", fake_machine("web"), fake_machine("db"), default_machine="web")


@pytest.fixture
def running(vz: Vz, project: Path) -> Iterator[Path]:
    vz.ok("up", cwd=project)
    yield project
    vz.run("delete", cwd=project)
