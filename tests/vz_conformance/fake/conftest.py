from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fake_testlib import request, unique_id
from vz_conformance.fake import FakeDriver


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
async def driver(state_dir: Path) -> AsyncIterator[FakeDriver]:
    drv = FakeDriver(state_dir)
    yield drv
    await drv.close()


@pytest.fixture
async def machine(driver: FakeDriver) -> str:
    """The workspace id of a running Machine."""
    workspace_id = unique_id()
    await driver.run_image(request(workspace_id))
    return workspace_id
