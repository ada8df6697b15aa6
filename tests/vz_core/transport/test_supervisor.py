"""Supervision: nothing of a plugin outlives it — host killed with SIGKILL, plugin crash, cancel, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from vz_core import ExecOutput, ExecSpec
from vz_core.errors import PluginError, UnavailableError
from vz_core.rpc import RemoteDriver
from vz_core.transport import LaunchSpec, PluginLauncher

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux supervision (subreaper)")

TESTDRIVERS = Path(__file__).resolve().parents[2] / "vz_plugins" / "testdrivers.py"


def _identity(pid: int) -> tuple[int, float]:
    return pid, psutil.Process(pid).create_time()


def _alive(ident: tuple[int, float]) -> bool:
    try:
        proc = psutil.Process(ident[0])
        return proc.create_time() == ident[1] and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(idents: list[tuple[int, float]], seconds: float = 10.0) -> list[tuple[int, float]]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [i for i in idents if _alive(i)]
        if not left:
            return []
        time.sleep(0.05)
    return [i for i in idents if _alive(i)]


async def _no_stdin() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover


def _mini() -> PluginLauncher:
    return PluginLauncher(lambda: LaunchSpec("mini", [sys.executable, str(TESTDRIVERS), "mini"]), name="mini")


HOST = textwrap.dedent(
    """
    import asyncio, os, sys
    from vz_core import ExecSpec
    from vz_core.rpc import RemoteDriver
    from vz_core.transport import LaunchSpec, PluginLauncher

    async def nothing():
        return
        yield b""

    async def main():
        argv = [sys.executable, {testdrivers!r}, "mini"]
        driver = RemoteDriver(PluginLauncher(lambda: LaunchSpec("mini", argv), name="mini"))
        spec = ExecSpec("w", ("spawn", "sh", "-c", "sleep 300 & sleep 301 & echo started; wait"))
        events = driver.exec(spec, nothing())
        first = await events.__anext__()
        conn = driver.connection
        print("READY", conn.pid, conn.process.supervisor_pid, os.path.dirname(conn.handshake.address), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("group", [False, True], ids=["host-only", "host-process-group"])
def test_host_killed_with_sigkill_mid_exec_leaves_nothing(tmp_path: Path, group: bool) -> None:
    """SIGKILL to the host alone, or to its whole process group (``timeout -s KILL``, job control)."""
    script = tmp_path / "host.py"
    script.write_text(HOST.format(testdrivers=str(TESTDRIVERS)))
    host = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=group)
    try:
        assert host.stdout is not None
        line = host.stdout.readline().split()
        assert line and line[0] == "READY", line
        plugin_pid, supervisor_pid, socket_dir = int(line[1]), int(line[2]), line[3]
        tree = [_identity(p.pid) for p in psutil.Process(host.pid).children(recursive=True)]
        pids = {pid for pid, _ in tree}
        assert {plugin_pid, supervisor_pid} <= pids
        # sh and its two background children (which may not have exec'd `sleep` yet, but exist).
        assert len(psutil.Process(plugin_pid).children(recursive=True)) >= 3, "the exec's grandchildren run"
        assert os.path.isdir(socket_dir)
        if group:
            os.killpg(host.pid, signal.SIGKILL)
        else:
            host.send_signal(signal.SIGKILL)
        host.wait()
        left = _wait_gone(tree)
        assert not left, f"left behind after the host was killed: {left}"
        assert not os.path.exists(socket_dir), "the supervisor removes the socket directory"
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        if host.stdout is not None:
            host.stdout.close()


async def test_the_supervisor_runs_outside_the_hosts_process_group_and_the_plugin_tree_dies_with_it() -> None:
    driver = RemoteDriver(_mini())
    events = driver.exec(ExecSpec("w", ("spawn", "sh", "-c", "sleep 300 & echo started; wait")), _no_stdin())
    try:
        first = await events.__anext__()
        assert isinstance(first, ExecOutput)
        conn = driver.connection
        assert conn is not None
        supervisor = conn.process.supervisor_pid
        assert os.getpgid(supervisor) != os.getpgid(0), "a group-wide signal to the host must miss it"
        tree = [_identity(conn.pid)] + [_identity(p.pid) for p in psutil.Process(conn.pid).children(recursive=True)]
        assert len(tree) >= 3, "the plugin, sh and its sleep"
        os.kill(supervisor, signal.SIGKILL)
        # the plugin dies with its supervisor (PR_SET_PDEATHSIG); the host kills what it left in its session
        assert await conn.wait_exited(5.0) is not None
        assert not _wait_gone(tree, 5.0)
    finally:
        with contextlib.suppress(Exception):
            await events.aclose()
        await driver.close()


async def test_plugin_crash_mid_exec_kills_its_orphans_and_reports_stderr() -> None:
    driver = RemoteDriver(_mini())
    try:
        spec = ExecSpec("w", ("spawn-crash", "sh", "-c", "sleep 300 & echo $!; wait"), environment={"K": "topsecret"})
        seen = asyncio.Event()

        async def go_ahead() -> AsyncIterator[bytes]:
            await seen.wait()
            yield b"go"

        events = driver.exec(spec, go_ahead())
        first = await events.__anext__()
        assert isinstance(first, ExecOutput)
        sleep = _identity(int(first.data.split()[0]))
        seen.set()  # the plugin dies now
        with pytest.raises(UnavailableError) as caught:
            await events.__anext__()
        assert "died during Exec (exit code 3)" in str(caught.value)
        assert not await asyncio.to_thread(_wait_gone, [sleep]), "the orphaned grandchild was killed"
        # The next call launches a fresh plugin.
        assert (await driver.info()).driver_name == "mini"
    finally:
        await driver.close()


async def test_cancelled_exec_kills_the_command_in_the_plugin() -> None:
    driver = RemoteDriver(_mini())
    try:
        spec = ExecSpec("w", ("spawn", "sh", "-c", "sleep 300 & echo $!; wait"))
        events = driver.exec(spec, _no_stdin())
        first = await events.__anext__()
        assert isinstance(first, ExecOutput)
        sleep = _identity(int(first.data.split()[0]))
        await events.aclose()  # type: ignore[attr-defined]
        assert not await asyncio.to_thread(_wait_gone, [sleep]), "cancel reached the plugin, which killed the command"
        assert (await driver.info()).driver_name == "mini"  # the plugin keeps serving
    finally:
        await driver.close()


async def test_shutdown_during_an_exec_leaves_nothing() -> None:
    conn_driver = RemoteDriver(_mini())
    spec = ExecSpec("w", ("spawn", "sh", "-c", "sleep 300 & echo $!; wait"))
    events = conn_driver.exec(spec, _no_stdin())
    first = await events.__anext__()
    assert isinstance(first, ExecOutput)
    sleep = _identity(int(first.data.split()[0]))
    conn = conn_driver.connection
    assert conn is not None
    plugin = _identity(conn.pid)
    status = await conn.shutdown()
    assert status.code == 0
    with pytest.raises(UnavailableError):
        await events.__anext__()
    await events.aclose()  # type: ignore[attr-defined]
    await conn_driver.close()
    assert not await asyncio.to_thread(_wait_gone, [sleep, plugin])


async def test_leftovers_of_a_plugin_that_exits_are_killed_but_new_sessions_are_left_alone(tmp_path: Path) -> None:
    """A plugin's orphans die with it; a process that started its own session detached on purpose."""
    code = textwrap.dedent(
        """
        import subprocess, sys
        stay = subprocess.Popen(["sleep", "60"], start_new_session=True)
        orphan = subprocess.Popen(["sleep", "300"])
        sys.stderr.write(f"{orphan.pid} {stay.pid}\\n")
        sys.stderr.flush()
        sys.exit(5)
        """
    )
    launcher = PluginLauncher(lambda: LaunchSpec("leaky", [sys.executable, "-c", code]), name="leaky")
    with pytest.raises(PluginError) as caught:
        await launcher.launch()
    orphan_pid, stay_pid = (int(x) for x in str(caught.value).strip().splitlines()[-1].split())
    try:
        assert "exit code 5" in str(caught.value)
        # The supervisor killed and reaped the orphan before it exited itself.
        assert not psutil.pid_exists(orphan_pid)
        assert psutil.Process(stay_pid).status() != psutil.STATUS_ZOMBIE, "a new session is a deliberate detach"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stay_pid, signal.SIGKILL)


async def test_an_exit_reaped_before_pidfd_open_is_not_held_up_by_a_detached_descendants_pipes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """asyncio's child watcher may reap the child just before ``pidfd_open``; the exit code then comes from the
    watcher's report, not from ``Process.wait()``, which also waits for pipes a detached descendant holds."""
    from vz_core.transport._process import PluginProcess

    code = "import subprocess, sys; print(subprocess.Popen(['sleep', '60'], start_new_session=True).pid); sys.exit(4)"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    detached = int(await proc.stdout.readline())
    try:

        def reaped(pid: int) -> int:
            raise ProcessLookupError(pid)

        monkeypatch.setattr(os, "pidfd_open", reaped)
        process = PluginProcess(proc, supervised=False)
        assert await asyncio.wait_for(process._exit_code(), 5.0) == 4
    finally:
        os.kill(detached, signal.SIGKILL)
        proc._transport.close()  # type: ignore[attr-defined]  # our ends of the pipes the sleep held


async def test_a_cancelled_watch_closes_the_supervisors_control_socket() -> None:
    """When the event loop closes under a running plugin, its watch is cancelled; the control socket to the
    supervisor is closed then, not left to the garbage collector."""
    from vz_core.transport._process import spawn_plugin

    process = await spawn_plugin([shutil.which("sleep") or "/bin/sleep", "60"], env=dict(os.environ))
    try:
        await asyncio.wait_for(process.started(), 10)
        assert process._ctl_writer is not None and process._watch is not None
        ctl = process._ctl_writer.get_extra_info("socket")
        assert ctl.fileno() >= 0
        process._watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await process._watch
        await asyncio.sleep(0)  # the transport closes its socket on the next turn of the loop
        assert ctl.fileno() == -1
    finally:
        for pid in {process.pid, process.supervisor_pid} - {0}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await process._proc.wait()
        process.close_pipes()
