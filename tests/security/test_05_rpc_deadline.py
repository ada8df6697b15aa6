"""#18 item 5: every unary RPC has a deadline; a hung plugin is reported, killed, and relaunched next call."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from vz_core.errors import RuntimeTimeoutError, UserError
from vz_core.rpc import DEFAULT_OPERATION_TIMEOUT, DEFAULT_TIMEOUT, ENV_TIMEOUT, RemoteDriver
from vz_core.transport import LaunchSpec, PluginLauncher

TESTDRIVERS = Path(__file__).resolve().parents[1] / "vz_plugins" / "testdrivers.py"


def _hang_driver(flag: Path, **kwargs: float) -> RemoteDriver:
    spec = LaunchSpec("hang", [sys.executable, str(TESTDRIVERS), "hang"], env={"VZ_TEST_HANG_FILE": str(flag)})
    return RemoteDriver(PluginLauncher(lambda: spec, name="hang"), name="hang", **kwargs)


def _gone(pid: int, created: float, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() != created or proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


async def test_a_plugin_that_never_answers_info_is_reported_killed_and_relaunched(tmp_path: Path) -> None:
    flag = tmp_path / "hang"
    flag.touch()
    driver = _hang_driver(flag, timeout=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeTimeoutError) as caught:
            await driver.find("w")
        assert time.monotonic() - started < 10.0
        err = caught.value
        assert "'hang'" in err.message and "Info" in err.message and ENV_TIMEOUT in err.message, err.message
        assert err.details["rpc"] == "Info"
        assert driver.connection is None, "the hung plugin is gone"

        flag.unlink()  # the next launch answers
        assert await driver.find("w") is None
        assert driver.connection is not None
    finally:
        await driver.close()


async def test_a_hung_find_kills_the_warm_plugin_and_the_next_call_gets_a_new_one(tmp_path: Path) -> None:
    driver = _hang_driver(tmp_path / "never", timeout=1.0)
    try:
        assert await driver.find("w") is None
        conn = driver.connection
        assert conn is not None
        pid, created = conn.pid, psutil.Process(conn.pid).create_time()
        with pytest.raises(RuntimeTimeoutError) as caught:
            await driver.find("hang")
        assert "Find" in caught.value.message and "'hang'" in caught.value.message
        assert "next call starts it again" in caught.value.message
        assert _gone(pid, created), "the hung plugin was killed"
        assert await driver.find("w") is None
        assert driver.connection is not None and driver.connection.pid != pid
    finally:
        await driver.close()


def test_deadlines_are_configurable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flag = tmp_path / "x"
    default = _hang_driver(flag)
    assert (default.timeout, default.operation_timeout) == (DEFAULT_TIMEOUT, DEFAULT_OPERATION_TIMEOUT)
    assert _hang_driver(flag, timeout=2.5, operation_timeout=7.0).operation_timeout == 7.0
    monkeypatch.setenv(ENV_TIMEOUT, "3.5")
    monkeypatch.setenv("VZ_PLUGIN_OPERATION_TIMEOUT", "90")
    from_env = _hang_driver(flag)
    assert (from_env.timeout, from_env.operation_timeout) == (3.5, 90.0)
    monkeypatch.setenv(ENV_TIMEOUT, "soon")
    with pytest.raises(UserError, match=ENV_TIMEOUT):
        _hang_driver(flag)
    monkeypatch.setenv(ENV_TIMEOUT, "-1")
    with pytest.raises(UserError, match="positive"):
        _hang_driver(flag)
