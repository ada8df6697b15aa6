from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

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


@pytest.fixture(autouse=True)
async def _loop_errors() -> AsyncIterator[None]:
    """Fail a test whose event loop reported an error (an exception in a callback, an unretrieved task error):
    asyncio only logs those, so they would otherwise pass unnoticed."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield
    await asyncio.sleep(0)  # let callbacks scheduled by the test's last step run
    loop.set_exception_handler(previous)
    assert not errors, f"the event loop reported errors: {[c.get('message') for c in errors]} {errors}"
