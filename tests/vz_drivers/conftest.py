"""Fixtures shared by the driver tests; ``machine_testlib`` importable from every driver's test directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One image store for the session's driver tests (the default image is unpacked once)."""
    return tmp_path_factory.mktemp("driver-images")


@pytest.fixture(scope="session")
def agent_binary() -> str:
    """The guest agent, built from the bundled sources once."""
    from vz_drivers._agent import ensure_agent_binary

    return str(ensure_agent_binary())


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"
