"""The plugin SDK translates an error of a streaming RPC exactly once, however the driver raises it (#31).

``Driver.logs`` may be a plain method that raises before it returns its iterator (a NotFoundError for a missing
Machine): the client gets that category and message, not UNKNOWN. A driver that advertises Logs but keeps the
default ``Driver.logs`` is told that it does not implement it (not that it does not advertise it). Exec and
ExecPty start their streams inside the translation already (``vz_core.rpc._server_exec``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vz_core.errors import NotFoundError, RuntimeFailureError, UnsupportedError
from vz_core.rpc import RemoteDriver
from vz_core.transport import LaunchSpec, PluginLauncher

TESTDRIVERS = Path(__file__).resolve().parents[1] / "vz_plugins" / "testdrivers.py"


def _driver(kind: str) -> RemoteDriver:
    def prepare() -> LaunchSpec:
        return LaunchSpec(kind, [sys.executable, str(TESTDRIVERS), kind])

    return RemoteDriver(PluginLauncher(prepare, name=kind), mode="warm")


async def _collect(driver: RemoteDriver, workspace: str) -> bytes:
    return b"".join([chunk async for chunk in driver.logs(workspace)])


async def test_an_error_raised_before_the_logs_iterator_keeps_its_category() -> None:
    driver = _driver("logs")
    try:
        assert await _collect(driver, "web") == b"line 1\n"
        with pytest.raises(NotFoundError, match="no Machine 'missing'"):
            await _collect(driver, "missing")
        with pytest.raises(RuntimeFailureError, match="the driver failed unexpectedly during Logs"):
            await _collect(driver, "boom")
        assert await _collect(driver, "web") == b"line 1\n"
    finally:
        await driver.close()


async def test_advertising_logs_without_implementing_it_says_so() -> None:
    driver = _driver("logs-unimplemented")
    try:
        with pytest.raises(UnsupportedError, match=r"does not implement Logs \(Driver.logs is not overridden\)"):
            await _collect(driver, "web")
    finally:
        await driver.close()
