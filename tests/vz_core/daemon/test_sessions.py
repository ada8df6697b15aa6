"""The daemon's driver sessions (SessionPool), with real plugin processes of the fake driver over real sockets.

Every plugin these tests start is stopped by the pool (``aclose``) or shown dead; the suite's leak guard checks
that no child process is left.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import logging
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from sessions_testlib import gone, nothing, run, until

from vz_core import ExecExit, ExecSpec, RunImageRequest, env
from vz_core.daemon._sessions import (
    DEFAULT_PLUGIN_IDLE,
    ENV_PLUGIN_IDLE,
    PoolRedactor,
    SessionPool,
    SharedDriver,
    plugin_idle_seconds,
    running_pool,
)
from vz_core.drivers import HostConfig
from vz_core.env import DriverPool
from vz_core.errors import InvalidArgumentError, TrustError, UnavailableError, UserError
from vz_core.redact import Redactor
from vz_core.transport import PluginConnection

FAKE_SCRIPT = Path(sys.executable).parent / "vz-driver-fake"


def acquire_driver(name: str, options: Any = None, **kwargs: Any) -> Any:
    """A driver as a command in this daemon gets it: its context carries the running pool (None: in-process)."""
    return env.acquire_driver(name, options, source=running_pool(), **kwargs)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("VZ_HOME", str(path))
    return path


@pytest.fixture
async def pool(home: Path) -> AsyncIterator[SessionPool]:
    p = SessionPool(plugin_idle=0)
    await p.start()
    try:
        yield p
    finally:
        await p.aclose()


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    """A scripts directory holding a copy of the installed vz-driver-fake console script."""
    path = tmp_path / "bin"
    path.mkdir()
    copy = path / "vz-driver-fake"
    copy.write_bytes(FAKE_SCRIPT.read_bytes())
    copy.chmod(0o755)
    return path


def plugin_pid(driver: Any) -> int:
    assert isinstance(driver, SharedDriver)
    pid = driver.session.pid
    assert pid is not None
    return pid


# --- configuration --------------------------------------------------------------------------------------------


def test_plugin_idle_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PLUGIN_IDLE, raising=False)
    assert plugin_idle_seconds() == DEFAULT_PLUGIN_IDLE
    assert plugin_idle_seconds("2.5") == 2.5
    assert plugin_idle_seconds("0") is None
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(UserError, match=ENV_PLUGIN_IDLE):
            plugin_idle_seconds(bad)
    monkeypatch.setenv(ENV_PLUGIN_IDLE, "7")
    assert SessionPool().plugin_idle == 7.0


# --- one door: pinned console scripts, verified at every launch -----------------------------------------------


async def test_builtins_are_pinned_to_their_installed_console_scripts(pool: SessionPool) -> None:
    pinned = pool.pins["fake"].pinned
    assert pinned is not None
    assert pinned.script == FAKE_SCRIPT
    assert pinned.sha256 == hashlib.sha256(FAKE_SCRIPT.read_bytes()).hexdigest()
    # The editable install's RECORD carries the script's hash: the pin is anchored to the installation.
    assert pinned.anchor == "installation RECORD"
    assert pinned.interpreter == sys.executable
    driver = acquire_driver("fake", {})
    assert isinstance(driver, SharedDriver)
    assert (await driver.info()).driver_name == "fake"
    proc = psutil.Process(plugin_pid(driver))
    # What runs is the sealed copy of the verified bytes (a descriptor), under the supervisor (not us).
    assert any(arg.startswith(("/proc/self/fd/", "/dev/fd/")) for arg in proc.cmdline()), proc.cmdline()
    assert proc.ppid() != os.getpid()
    assert psutil.Process(proc.ppid()).ppid() == os.getpid()
    row = next(r for r in pool.status() if r["name"] == "fake")
    assert (row["script"], row["sha256"], row["launches"]) == (str(FAKE_SCRIPT), pinned.sha256, 1)


async def test_a_modified_console_script_is_refused_at_launch(home: Path, scripts: Path) -> None:
    script = scripts / "vz-driver-fake"
    original = script.read_bytes()
    async with SessionPool(plugin_idle=0, scripts_dir=scripts) as pool:
        pinned = pool.pins["fake"].pinned
        assert pinned is not None and pinned.anchor == "pinned"  # a copy: no installer record names it
        script.write_bytes(original + b"# changed after the daemon started\n")
        driver = acquire_driver("fake", {})
        with pytest.raises(TrustError) as caught:
            await driver.info()
        message = str(caught.value)
        assert f"built-in driver 'fake': refusing to launch its console script {script}" in message
        assert "SHA-256 mismatch" in message and pinned.sha256 in message
        assert "restart the daemon" in message
        session = pool.session("fake")
        assert (session.stats.launches, session.stats.launch_failures, session.pid) == (0, 1, None)
        # Verification happens at every launch (nothing cached): the original bytes launch again.
        script.write_bytes(original)
        assert (await driver.info()).driver_name == "fake"
        assert session.stats.launches == 1
        # And once more after the plugin died: the relaunch checks again.
        os.kill(plugin_pid(driver), signal.SIGKILL)
        await until(lambda: session.stats.crashes == 1)
        script.write_bytes(original.replace(b"import sys", b"import sys, os"))
        with pytest.raises(TrustError, match="refusing to launch"):
            await driver.find("ws")
        assert (session.stats.launches, session.stats.launch_failures) == (1, 2)


async def test_a_script_for_another_interpreter_is_refused(home: Path, scripts: Path) -> None:
    script = scripts / "vz-driver-fake"
    script.write_bytes(b"#!/bin/sh\n" + script.read_bytes().split(b"\n", 1)[1])
    async with SessionPool(plugin_idle=0, scripts_dir=scripts) as pool:
        assert "fake" not in pool.pins
        row = next(r for r in pool.status() if r["name"] == "fake")
        assert row["state"] == "refused" and "runs /bin/sh, not this interpreter" in row["error"]
        with pytest.raises(TrustError, match="runs /bin/sh"):
            acquire_driver("fake", {})


# --- sharing --------------------------------------------------------------------------------------------------


async def test_concurrent_commands_share_one_warm_plugin(pool: SessionPool) -> None:
    first, second = acquire_driver("fake", {}), acquire_driver("fake", None)
    await first.run_image(RunImageRequest("ws-share", "img"))
    try:
        finds = [first.find("ws-share") if i % 2 else second.find("ws-share") for i in range(20)]
        execs = [run(d, "ws-share", "sh", "-c", f"echo {i}") for i, d in enumerate([first, second] * 3)]
        found, outputs = await asyncio.gather(asyncio.gather(*finds), asyncio.gather(*execs))
        assert all(r is not None and r.id for r in found)
        assert [out for out, _ in outputs] == [f"{i}\n".encode() for i in range(6)]
        assert plugin_pid(first) == plugin_pid(second)
        session = pool.session("fake")
        assert session.stats.launches == 1
        # A command ends: its handles close, the plugin stays warm for the next one.
        pid = plugin_pid(first)
        await first.close()
        await second.close()
        assert session.state == "idle" and session.pid == pid and not gone(pid)
        third = acquire_driver("fake", {})
        assert await third.find("ws-share") is not None and plugin_pid(third) == pid
    finally:
        await acquire_driver("fake", {}).delete("ws-share")


async def test_a_call_in_flight_shows_as_warm(pool: SessionPool) -> None:
    driver = acquire_driver("fake", {})
    await driver.run_image(RunImageRequest("ws-busy", "img"))
    try:
        events = driver.exec(ExecSpec("ws-busy", ("sleep", "0.5")), nothing())
        task = asyncio.ensure_future(events.__anext__())
        await until(lambda: pool.session("fake").in_flight == 1)
        row = next(r for r in pool.status() if r["name"] == "fake")
        assert row["state"] == "warm" and row["in_flight"] == 1 and row["pid"] == plugin_pid(driver)
        assert isinstance(await task, ExecExit)
        await events.aclose()  # type: ignore[attr-defined]
        assert next(r for r in pool.status() if r["name"] == "fake")["state"] == "idle"
    finally:
        await driver.delete("ws-busy")


async def test_one_session_per_effective_options(pool: SessionPool, home: Path, tmp_path: Path) -> None:
    HostConfig().save({"fake": {"state_dir": str(tmp_path / "a")}})
    a1 = acquire_driver("fake", {})
    a2 = acquire_driver("fake", {}, recorded=True)
    b = acquire_driver("fake", {"state_dir": str(tmp_path / "b")}, recorded=True)
    assert isinstance(a1, SharedDriver) and isinstance(b, SharedDriver)
    assert a1.session is a2.session is not b.session  # type: ignore[attr-defined]
    assert a1.session.options == {"state_dir": str(tmp_path / "a")}
    await a1.run_image(RunImageRequest("ws-opt", "img"))
    try:
        assert await b.find("ws-opt") is None  # another state directory, another plugin
        assert plugin_pid(a1) != plugin_pid(b)
        assert await a2.find("ws-opt") is not None
    finally:
        await a1.delete("ws-opt")
    # Project options are validated before anything is made, as in-process.
    with pytest.raises(UserError, match="host configuration"):
        acquire_driver("fake", {"state_dir": "/elsewhere"})
    with pytest.raises(UserError, match="bogus"):
        acquire_driver("fake", {"bogus": 1})


# --- lifecycle: idle stop, crash and relaunch, shutdown -------------------------------------------------------


async def test_an_idle_plugin_is_stopped_and_the_next_call_relaunches_it(home: Path) -> None:
    async with SessionPool(plugin_idle=0.3) as pool:
        driver = acquire_driver("fake", {})
        await driver.run_image(RunImageRequest("ws-idle", "img"))
        try:
            first = plugin_pid(driver)
            session = pool.session("fake")
            await until(lambda: session.state == "stopped")
            await until(lambda: gone(first))
            assert session.stats.crashes == 0  # an idle stop is not a crash
            assert await driver.find("ws-idle") is not None
            assert plugin_pid(driver) != first and session.stats.launches == 2
        finally:
            await driver.delete("ws-idle")


async def test_a_plugin_being_stopped_shows_as_stopping_until_its_process_has_exited(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "stopped" is said only once the process has ended: a client waiting for it may count on the pid being gone.
    release = asyncio.Event()
    original = PluginConnection.shutdown

    async def slow_shutdown(self: PluginConnection, grace: float | None = None) -> Any:
        await release.wait()
        return await original(self, grace)

    monkeypatch.setattr(PluginConnection, "shutdown", slow_shutdown)
    async with SessionPool(plugin_idle=0.3) as pool:
        driver = acquire_driver("fake", {})
        assert await driver.find("nothing-here") is None
        first = plugin_pid(driver)
        session = pool.session("fake")
        await until(lambda: session.state == "stopping")
        row = next(r for r in pool.status() if r["name"] == "fake")
        assert row["state"] == "stopping" and row["pid"] == first and not gone(first)
        release.set()
        await until(lambda: session.state == "stopped")
        assert gone(first) and session.pid is None and session.stats.crashes == 0


async def test_a_crashed_plugin_is_relaunched_and_finds_its_machines(pool: SessionPool) -> None:
    driver = acquire_driver("fake", {})
    await driver.run_image(RunImageRequest("ws-crash", "img"))
    try:
        before = await driver.find("ws-crash")
        assert before is not None
        assert (await run(driver, "ws-crash", "sh", "-c", "echo kept > f; echo ok"))[0] == b"ok\n"
        pid = plugin_pid(driver)
        session = pool.session("fake")
        os.kill(pid, signal.SIGKILL)
        await until(lambda: session.stats.crashes == 1)
        assert session.state == "stopped"
        row = next(r for r in pool.status() if r["name"] == "fake")
        assert row["crashes"] == 1 and "SIGKILL" in row["last_crash"]["status"]
        # The next call starts the plugin again; it finds the Machine on disk and carries on with it.
        assert await driver.find("ws-crash") == before
        assert (await run(driver, "ws-crash", "cat", "f"))[0] == b"kept\n"
        assert plugin_pid(driver) != pid and session.stats.launches == 2
    finally:
        await driver.delete("ws-crash")


async def test_a_plugin_dying_during_a_call_fails_that_call_only(pool: SessionPool) -> None:
    driver = acquire_driver("fake", {})
    await driver.run_image(RunImageRequest("ws-mid", "img"))
    try:
        events = driver.exec(ExecSpec("ws-mid", ("sleep", "30")), nothing())
        pending = asyncio.ensure_future(events.__anext__())
        await until(lambda: pool.session("fake").in_flight == 1)
        os.kill(plugin_pid(driver), signal.SIGKILL)
        with pytest.raises(UnavailableError, match="the next call starts it again"):
            await pending
        await events.aclose()  # type: ignore[attr-defined]
        assert (await run(driver, "ws-mid", "echo", "again"))[0] == b"again\n"
    finally:
        await driver.delete("ws-mid")
    # The failed call's traceback (held by the task) references the dead plugin's gRPC call in a cycle: collect
    # it, so grpc.aio may shut its poller down when the pool closes (the leak guard counts sockets).
    del pending, events
    gc.collect()


async def test_shutdown_stops_every_plugin_and_restores_in_process_drivers(home: Path, tmp_path: Path) -> None:
    pool = SessionPool(plugin_idle=0)
    await pool.start()
    assert running_pool() is pool
    try:
        one = acquire_driver("fake", {})
        two = acquire_driver("fake", {"state_dir": str(tmp_path / "two")}, recorded=True)
        await asyncio.gather(one.info(), two.info())
        pids = [plugin_pid(one), plugin_pid(two)]
        supervisors = [psutil.Process(pid).ppid() for pid in pids]
    finally:
        await pool.aclose()
    assert all(gone(pid) for pid in pids + supervisors)
    assert running_pool() is None
    local = acquire_driver("fake", {})
    assert not isinstance(local, SharedDriver)
    await local.close()
    with pytest.raises(UserError, match="shutting down"):
        pool.driver("fake")


DAEMON = textwrap.dedent(
    """
    import asyncio, json, sys
    from vz_core import RunImageRequest
    from vz_core.daemon._sessions import SessionPool
    from vz_core import env

    async def main():
        pool = SessionPool(plugin_idle=0)
        await pool.start()
        driver = env.acquire_driver("fake", {}, source=pool)
        await driver.run_image(RunImageRequest("ws-daemon", "img", args=("sleep", "1000")))
        found = await driver.find("ws-daemon")
        pid = driver.session.pid
        supervisor = __import__("psutil").Process(pid).ppid()
        print(json.dumps({"plugin": pid, "supervisor": supervisor, "id": found.id}), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


async def test_a_sigkilled_daemon_takes_its_plugins_along_and_machines_survive(home: Path) -> None:
    daemon = await asyncio.create_subprocess_exec(sys.executable, "-c", DAEMON, stdout=asyncio.subprocess.PIPE)
    try:
        assert daemon.stdout is not None
        seen = json.loads(await asyncio.wait_for(daemon.stdout.readline(), 60))
        daemon.kill()
        await daemon.wait()
        # PR_SET_PDEATHSIG and the supervisor's control socket: nothing of the plugin outlives the daemon.
        await until(lambda: gone(seen["plugin"]) and gone(seen["supervisor"]))
        async with SessionPool(plugin_idle=0):
            driver = acquire_driver("fake", {})
            found = await driver.find("ws-daemon")
            assert found is not None and found.id == seen["id"] and found.state.status == "running"
            assert (await run(driver, "ws-daemon", "echo", "still here"))[0] == b"still here\n"
            await driver.delete("ws-daemon")
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()


# --- secrets ----------------------------------------------------------------------------------------------------


def test_pool_redactor_masks_declared_short_secrets_but_not_every_short_value() -> None:
    r = PoolRedactor()
    r.add("1", "on", "long-value")  # environment values a plugin was sent
    r.add_secret("ab1")  # a declared secret
    assert r.redact("exit 1 on ws-1: long-value ab1 tab1e") == "exit 1 on ws-1: *** *** tab1e"


async def test_the_pool_learns_every_secret_of_the_environments_it_serves(
    home: Path, scripts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret, short = "hunter2-very-secret", "zq9"
    script = scripts / "vz-driver-fake"
    head, rest = script.read_bytes().split(b"\n", 1)
    # This copy (pinned like the installed one) writes a secret to its stderr before serving.
    noisy = f"import sys; sys.stderr.write('token={secret} short {short} done\\n'); sys.stderr.flush()\n"
    script.write_bytes(head + b"\n" + noisy.encode() + rest)
    env_a = Redactor(short_tokens=True)
    env_a.add(secret)
    caplog.set_level(logging.INFO, logger="vz.plugin.fake")
    async with SessionPool(plugin_idle=0, scripts_dir=scripts) as pool:
        a = acquire_driver("fake", {}, redactor=env_a)
        env_b = Redactor(short_tokens=True)
        b = acquire_driver("fake", {}, redactor=env_b)  # another Environment, the same plugin
        await a.info()
        assert pool.redactor.redact(f"{secret} {short}") == f"*** {short}"
        env_b.add(short)  # a secret that command resolved after it got its driver
        await b.find("ws")  # its next call teaches it to the pool
        assert pool.redactor.redact(f"{secret} {short}") == "*** ***"
        with pytest.raises(InvalidArgumentError) as caught:
            await a.run_image(RunImageRequest("ws-secret", f"invalid/{secret}"))
        assert secret not in str(caught.value) and "invalid/***" in str(caught.value)
        session = pool.session("fake")
        os.kill(plugin_pid(a), signal.SIGKILL)
        await until(lambda: session.stats.crashes == 1)
        crash = session.stats.last_crash
        assert crash is not None and "token=*** short *** done" in crash["stderr"]
        # (a redacting stream holds back the last bytes of a line until it can tell they are no secret's start:
        # the line is logged whole once the plugin's stderr ends)
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    assert "token=*** short *** done" in logged
    assert secret not in logged and f" {short} " not in logged


# --- System.Capabilities ----------------------------------------------------------------------------------------


async def test_capabilities_are_the_negotiated_facts(home: Path) -> None:
    local = DriverPool()
    try:
        _, facts = await local.get("fake")
        expected = facts.describe()
    finally:
        await local.aclose()
    async with SessionPool(plugin_idle=0) as pool:
        rows = {row["name"]: row for row in await pool.capabilities(["fake", "nosuchdriver"])}
        assert rows["fake"]["facts"] == expected
        assert rows["nosuchdriver"]["error"]["code"] == "NOT_FOUND"
        assert "unknown driver 'nosuchdriver'" in rows["nosuchdriver"]["error"]["message"]
        session = pool.session("fake")
        assert session.stats.launches == 1
        # Facts are taken once per launch; a command's DriverPool in the daemon gets the same ones from them.
        taken = session.facts
        again = await pool.capabilities(["fake"])
        assert again[0]["facts"] == expected and session.stats.launches == 1 and session.facts is taken
        command = DriverPool(source=running_pool())
        try:
            _, facts = await command.get("fake")
            assert facts.describe() == expected and session.facts is taken
        finally:
            await command.aclose()
        assert session.state == "idle"
        # After a relaunch they are asked again.
        os.kill(session.pid or 0, signal.SIGKILL)
        await until(lambda: session.stats.crashes == 1)
        assert (await pool.capabilities(["fake"]))[0]["facts"] == expected  # stopped: the last facts, no launch
        assert session.stats.launches == 1
        await acquire_driver("fake", {}).find("ws")
        fresh = await pool.capabilities(["fake"])
        assert fresh[0]["facts"] == expected and session.stats.launches == 2 and session.facts is not taken


# --- external drivers take the same door ------------------------------------------------------------------------


def write_manifest(directory: Path, script: Path) -> Path:
    from vz_core.trust import host_platform

    manifest = directory / "extfake.json"
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    entry = {"path": script.name, "sha256": digest}
    doc = {"manifest_version": 1, "name": "extfake", "version": "1", "api_version": "1.3", "binaries": {}}
    doc["binaries"] = {host_platform(): entry}
    manifest.write_text(json.dumps(doc))
    return manifest


async def test_an_external_driver_is_shared_verified_and_picked_up_again_when_re_added(
    pool: SessionPool, scripts: Path
) -> None:
    from vz_core.drivers import add_manifest

    script = scripts / "vz-driver-fake"  # any plugin binary: here the fake's script, added as an external driver
    add_manifest(write_manifest(scripts, script))
    one, two = acquire_driver("extfake"), acquire_driver("extfake")
    assert (await one.info()).driver_name == "fake" and await two.find("ws") is None
    assert plugin_pid(one) == plugin_pid(two)
    session = pool.session("extfake")
    row = next(r for r in pool.status() if r["name"] == "extfake")
    assert row["origin"] == "external" and row["sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    assert row["provenance"]["source"] == str(scripts / "extfake.json") and row["provenance"]["signed"] is False
    # The binary changes: its next launch is refused (verified before every launch) ...
    os.kill(plugin_pid(one), signal.SIGKILL)
    await until(lambda: session.stats.crashes == 1)
    script.write_bytes(script.read_bytes() + b"# new build\n")
    with pytest.raises(TrustError, match="SHA-256 mismatch"):
        await one.find("ws")
    # ... until the user adds the updated manifest: the next command gets a session on the new record.
    add_manifest(write_manifest(scripts, script))
    three = acquire_driver("extfake")
    assert isinstance(three, SharedDriver) and three.session is not session
    assert await three.find("ws") is None
    await until(lambda: session.remote.connection is None and session not in pool._retiring)


# --- a declaration without a console script ---------------------------------------------------------------------

PLAIN_MODULE = '''"""A third-party style registration module: a declaration with a factory and no console script."""
from vz_core.registry import DriverDeclaration, hookimpl

DECLARATION = DriverDeclaration(name="plainfake", summary="the fake, declared without a console script",
                                factory="vz_conformance.fake:FakeDriver")


@hookimpl
def vz_builtin_drivers():
    return [DECLARATION]
'''


async def test_a_declaration_without_a_console_script_runs_from_a_pinned_generated_launcher(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from vz_core.registry import DriverRegistry

    modules = tmp_path / "modules"
    modules.mkdir()
    source = modules / "vzt_sessions_plain.py"
    source.write_text(PLAIN_MODULE)
    monkeypatch.syspath_prepend(str(modules))
    # What installing the package would do for the plugin too (the code under test stays first on the path).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(modules), *filter(None, [os.environ.get("PYTHONPATH")])]))
    registry = DriverRegistry(load_entry_points=False)
    registry.register(importlib.import_module("vzt_sessions_plain"))
    launchers = tmp_path / "launchers"
    async with SessionPool(plugin_idle=0, registry=registry, launcher_dir=launchers) as pool:
        pinned = pool.pins["plainfake"].pinned
        assert pinned is not None and pinned.anchor == "generated"
        assert pinned.script == launchers / "vz-driver-plainfake" and pinned.interpreter == sys.executable
        assert launchers.stat().st_mode & 0o777 == 0o700
        assert (pinned.module_file, pinned.module_sha256) == (
            str(source),
            hashlib.sha256(source.read_bytes()).hexdigest(),
        )
        driver = acquire_driver("plainfake", {})
        assert (await driver.info()).driver_name == "fake"
        proc = psutil.Process(plugin_pid(driver))
        assert any(arg.startswith(("/proc/self/fd/", "/dev/fd/")) for arg in proc.cmdline())
        # The registration module is pinned too: a changed one is refused at the next launch.
        session = pool.session("plainfake")
        os.kill(proc.pid, signal.SIGKILL)
        await until(lambda: session.stats.crashes == 1)
        source.write_text(PLAIN_MODULE + "# changed\n")
        with pytest.raises(TrustError, match=r"mismatch for its registration module .*vzt_sessions_plain\.py"):
            await driver.find("ws")
        source.write_text(PLAIN_MODULE)
        assert await driver.find("ws") is None and session.stats.launches == 2
        # And so is the generated launcher.
        os.kill(plugin_pid(driver), signal.SIGKILL)
        await until(lambda: session.stats.crashes == 2)
        pinned.script.write_text(pinned.script.read_text() + "import os\n")
        with pytest.raises(TrustError, match="refusing to launch its console script"):
            await driver.find("ws")


async def test_a_script_changed_under_a_warm_plugin_is_refused_at_the_next_acquire(home: Path, scripts: Path) -> None:
    script = scripts / "vz-driver-fake"
    original = script.read_bytes()
    async with SessionPool(plugin_idle=0, scripts_dir=scripts) as pool:
        driver = acquire_driver("fake", {})
        assert (await driver.info()).driver_name == "fake"
        session = pool.session("fake")
        warm_pid = session.pid
        assert warm_pid is not None
        script.write_bytes(original + b"# changed while its plugin runs\n")
        with pytest.raises(TrustError, match="SHA-256 mismatch"):
            acquire_driver("fake", {})  # the next command: refused although a verified plugin is running
        await until(lambda: not psutil.pid_exists(warm_pid) or psutil.Process(warm_pid).status() == "zombie")
        with pytest.raises(TrustError, match="refusing to launch"):
            await acquire_driver("fake", {}).info()  # a new session: its launch verifies, and refuses
        script.write_bytes(original)  # the pinned bytes again: launches again
        again = acquire_driver("fake", {})
        assert (await again.info()).driver_name == "fake"
        assert pool.session("fake").pid not in (None, warm_pid)
