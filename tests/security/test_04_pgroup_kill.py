"""#18 item 4: a SIGKILL to the host's whole process group leaves no plugin process and no socket directory.

``timeout -s KILL`` and job control kill a process group; the plugin's supervisor used to share the host's
group and die with it, orphaning the plugin and its children with their socket directories in /tmp.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux supervision (subreaper)")

TESTDRIVERS = Path(__file__).resolve().parents[1] / "vz_plugins" / "testdrivers.py"

# The host: a RemoteDriver whose plugin command spawns two children before it becomes the plugin, and an exec
# in it that spawns a grandchild of its own. It prints what it started, then waits to be killed.
HOST = textwrap.dedent(
    """
    import asyncio, os, shlex, sys
    from vz_core import ExecSpec
    from vz_core.rpc import RemoteDriver
    from vz_core.transport import LaunchSpec, PluginLauncher

    async def nothing():
        return
        yield b""

    async def main():
        plugin = f"sleep 300 & sleep 301 & exec {shlex.quote(sys.executable)} {shlex.quote(sys.argv[1])} mini"
        argv = ["/bin/sh", "-c", plugin]
        driver = RemoteDriver(PluginLauncher(lambda: LaunchSpec("mini", argv), name="mini"))
        spec = ExecSpec("w", ("spawn", "sh", "-c", "sleep 302 & echo started; wait"))
        events = driver.exec(spec, nothing())
        await events.__anext__()
        conn = driver.connection
        print("READY", conn.pid, conn.process.supervisor_pid, os.path.dirname(conn.handshake.address), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def _identity(proc: psutil.Process) -> tuple[int, float]:
    return proc.pid, proc.create_time()


def _alive(ident: tuple[int, float]) -> bool:
    try:
        proc = psutil.Process(ident[0])
        return proc.create_time() == ident[1] and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_killing_the_hosts_process_group_kills_the_whole_plugin_tree(tmp_path: Path) -> None:
    script = tmp_path / "host.py"
    script.write_text(HOST)
    # The host leads a process group of its own, with a sibling in it (as a shell pipeline would have).
    command = "sleep 303 & exec " + shlex.join([sys.executable, str(script), str(TESTDRIVERS)])
    host = subprocess.Popen(["/bin/sh", "-c", command], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert host.stdout is not None
        line = host.stdout.readline().split()
        assert line and line[0] == "READY", line
        plugin_pid, supervisor_pid, socket_dir = int(line[1]), int(line[2]), line[3]
        tree = [_identity(p) for p in psutil.Process(host.pid).children(recursive=True)]
        siblings = [p for p in psutil.Process(host.pid).children() if p.name() == "sleep"]
        assert siblings and all(os.getpgid(p.pid) == host.pid for p in siblings), "a sibling shares the group"
        tree += [_identity(p) for p in siblings]
        pids = {pid for pid, _ in tree}
        assert {plugin_pid, supervisor_pid} <= pids
        plugin_tree = psutil.Process(plugin_pid).children(recursive=True)
        # the plugin command's two sleeps, and the exec's sh with its sleep
        assert len(plugin_tree) >= 4, [p.cmdline() for p in plugin_tree]
        assert os.path.isdir(socket_dir)

        os.killpg(host.pid, signal.SIGKILL)
        host.wait()

        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and (any(_alive(i) for i in tree) or os.path.exists(socket_dir)):
            time.sleep(0.05)
        left = [i for i in tree if _alive(i)]
        assert not left, f"left behind after a process-group SIGKILL: {left}"
        assert not os.path.exists(socket_dir), "the socket directory is removed"
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
            host.wait()
        if host.stdout is not None:
            host.stdout.close()
