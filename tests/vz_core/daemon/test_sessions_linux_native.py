"""linux_native through the daemon's SessionPool: its Machines (runc containers) survive a plugin crash and a
SIGKILL of the daemon, and the next plugin (the next daemon's) finds them by Find and carries on with them.

Real runc, real namespaces (root); the plugin is the installed, pinned ``vz-driver-linux-native`` console script.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sessions_testlib import gone, run, until

from vz_core import RunImageRequest, env
from vz_core.daemon._sessions import SessionPool, SharedDriver, running_pool
from vz_core.drivers import HostConfig

pytestmark = pytest.mark.root

SUBNET = "10.232.0.0/16"


def acquire_driver(name: str, options: Any = None, **kwargs: Any) -> Any:
    """A driver as a command in this daemon gets it: its context carries the running pool (None: in-process)."""
    return env.acquire_driver(name, options, source=running_pool(), **kwargs)


@pytest.fixture(scope="module")
def agent_binary() -> str:
    from vz_drivers._agent import ensure_agent_binary

    return str(ensure_agent_binary())


@pytest.fixture
async def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent_binary: str) -> AsyncIterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("the linux_native tests need root (namespaces, cgroups, overlay mounts)")
    for tool in ("runc", "ip", "nft", "nsenter"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: apt-get install runc iproute2 nftables util-linux")
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("VZ_HOME", str(path))
    state, images = tmp_path / "state", tmp_path / "images"
    HostConfig().save(
        {
            "linux_native": {
                "state_dir": str(state),
                "image_dir": str(images),
                "agent_binary": agent_binary,
                "subnet": SUBNET,
                "stop_timeout": 5,
            }
        }
    )
    try:
        yield path
    finally:
        from vz_drivers.linux_native import cleanup_state

        await cleanup_state(str(state), image_dir=str(images), agent_binary=agent_binary, subnet=SUBNET)


def containers(home: Path) -> dict[str, tuple[int, str]]:
    """What runc itself says runs under the driver's private root: container id -> (init pid, status)."""
    root = home.parent / "state" / "runc"
    out = subprocess.run(["runc", "--root", str(root), "list", "-f", "json"], capture_output=True, check=True).stdout
    return {c["id"]: (c["pid"], c["status"]) for c in json.loads(out or b"[]") or []}


def machine_request(workspace_id: str) -> RunImageRequest:
    return RunImageRequest(workspace_id=workspace_id, image="vz:default", args=("sleep", "1000000"))


async def test_a_machine_survives_a_plugin_crash(home: Path) -> None:
    async with SessionPool(plugin_idle=0):
        driver = acquire_driver("linux_native", {})
        assert isinstance(driver, SharedDriver)
        await driver.run_image(machine_request("ln-crash"))
        try:
            before = await driver.find("ln-crash")
            assert before is not None and before.state.status == "running"
            running = containers(home)
            assert [status for _, status in running.values()] == ["running"]
            assert await run(driver, "ln-crash", "sh", "-c", "echo kept > /var/tmp/f; echo ok") == (b"ok\n", 0)
            session = driver.session
            pid = session.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            await until(lambda: session.stats.crashes == 1, 15.0)
            assert containers(home) == running  # the same container, the same init process
            # The container does not belong to the plugin: the relaunched plugin finds it as it was.
            assert await driver.find("ln-crash") == before
            assert await run(driver, "ln-crash", "cat", "/var/tmp/f") == (b"kept\n", 0)
            assert session.pid != pid and session.stats.launches == 2
        finally:
            await driver.delete("ln-crash")
        assert await driver.find("ln-crash") is None


DAEMON = textwrap.dedent(
    """
    import asyncio, json
    import psutil
    from vz_core import ExecSpec, ExecOutput, RunImageRequest
    from vz_core.daemon._sessions import SessionPool
    from vz_core import env

    async def nothing():
        return
        yield b""

    async def main():
        pool = SessionPool(plugin_idle=0)
        await pool.start()
        driver = env.acquire_driver("linux_native", {}, source=pool)
        await driver.run_image(RunImageRequest("ln-daemon", "vz:default", args=("sleep", "1000000")))
        async for _ in driver.exec(ExecSpec("ln-daemon", ("sh", "-c", "echo before > /var/tmp/f")), nothing()):
            pass
        found = await driver.find("ln-daemon")
        pid = driver.session.pid
        print(json.dumps({"plugin": pid, "supervisor": psutil.Process(pid).ppid(), "id": found.id}), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


async def test_a_machine_survives_a_sigkilled_daemon_and_the_next_daemon_finds_it(home: Path) -> None:
    daemon = await asyncio.create_subprocess_exec(sys.executable, "-c", DAEMON, stdout=asyncio.subprocess.PIPE)
    try:
        assert daemon.stdout is not None
        line = await asyncio.wait_for(daemon.stdout.readline(), 240)
        assert line, "the daemon process ended before its Machine was up"
        seen = json.loads(line)
        running = containers(home)
        assert [status for _, status in running.values()] == ["running"]
        daemon.kill()
        await daemon.wait()
        await until(lambda: gone(seen["plugin"]) and gone(seen["supervisor"]), 15.0)
        assert containers(home) == running
        async with SessionPool(plugin_idle=0):
            driver = acquire_driver("linux_native", {})
            try:
                found = await driver.find("ln-daemon")
                assert found is not None and found.id == seen["id"] and found.state.status == "running"
                assert await run(driver, "ln-daemon", "cat", "/var/tmp/f") == (b"before\n", 0)
            finally:
                await driver.delete("ln-daemon")
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()
