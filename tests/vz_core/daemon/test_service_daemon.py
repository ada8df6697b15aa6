"""The service behind the real daemon: a listener in this process, the blocking client (``connect``) in threads,
every driver a real plugin subprocess of the warm SessionPool (the reference fake's console script)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from vz_core.daemon import Connection, Daemon, DaemonError, DaemonPaths, connect
from vz_core.daemon._service import Service

SECRET = "wire-s3cret-value"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VZ_DAEMON_PLUGIN_IDLE", "0")
    root = tmp_path / "proj"
    root.mkdir()
    machine = {
        "name": "web",
        "profile": "developer",
        "driver": "fake",
        "image": "vz:default",
        "workspace": {"projection": "none"},
        "environment": {"TOKEN": {"from_env": "MY_TOKEN"}},
    }
    (root / "vz.json").write_text(json.dumps({"version": 1, "project_id": "wire", "machines": [machine]}))
    return root


def context(root: Path) -> dict[str, Any]:
    return {"cwd": str(root), "environ": {"MY_TOKEN": SECRET}, "definition_file": None}


@contextlib.asynccontextmanager
async def daemon_with_service(home: Path) -> AsyncIterator[tuple[Daemon, Service]]:
    paths = DaemonPaths(str(home))
    service = Service()
    await service.start()
    daemon = Daemon(paths, service.dispatch, handle_signals=False, idle_timeout=0.0, on_shutdown=[service.close])
    ready = asyncio.Event()
    task = asyncio.ensure_future(daemon.serve(ready=ready.set))
    await asyncio.wait([task, asyncio.ensure_future(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield daemon, service
    finally:
        daemon.request_shutdown("test over")
        await asyncio.wait_for(task, 60)


async def client(home: Path, fn: Callable[[Connection], Any]) -> Any:
    def run() -> Any:
        with connect(str(home), environ=dict(os.environ), autostart=False) as conn:
            return fn(conn)

    return await asyncio.to_thread(run)


def request(method: str, body: dict[str, Any], fds: list[int] | None = None) -> Callable[[Connection], Any]:
    def run(conn: Connection) -> tuple[list[Any], dict[str, Any]]:
        seen: list[Any] = []
        return seen, conn.request(method, body, fds or [], seen.append)

    return run


async def test_up_status_exec_through_the_daemon_and_a_warm_plugin(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with daemon_with_service(home) as (_, service):
        seen, up = await client(home, request("Environments.Up", {"context": context(project)}))
        assert up["environment"]["state"] == "running"
        steps = [m["progress"]["action"] for m in seen if "progress" in m and m["progress"]["event"] == "step"]
        assert "create" in steps and "boot" in steps

        _, report = await client(home, request("Environments.Get", {"context": context(project)}))
        machine = report["environments"][0]["machines"][0]
        assert machine["health"] == {**machine["health"], "source": "driver", "state": "running"}

        _, status = await client(home, request("System.Status", {}))
        fake = next(p for p in status["plugins"] if p["name"] == "fake")
        assert fake["pid"] not in (None, os.getpid()) and psutil.Process(fake["pid"]).is_running()

        # Streams as messages, then stdout handed over as a descriptor (the plugin's local exec path).
        def exec_messages(conn: Connection) -> tuple[list[Any], dict[str, Any]]:
            conn.call("Machines.Exec", {"context": context(project), "argv": ["sh", "-c", "cat; echo e >&2; exit 5"]})
            conn.write(0, b"through the wire\n")
            conn.send({"stdin_close": {}})
            seen: list[Any] = []
            return seen, conn.result(seen.append)

        seen, result = await client(home, exec_messages)
        assert result == {"exit_code": 5, "signal": None}
        assert [m for m in seen if isinstance(m, tuple)] == [(1, b"through the wire\n"), (2, b"e\n")]

        read_end, write_end = os.pipe()
        try:
            body = {"context": context(project), "argv": ["sh", "-c", "echo on-the-fd"], "stdio": [False, True, False]}

            def exec_fd(conn: Connection) -> tuple[list[Any], dict[str, Any]]:
                conn.call("Machines.Exec", body, [write_end])
                conn.send({"stdin_close": {}})
                seen: list[Any] = []
                return seen, conn.result(seen.append)

            seen, result = await client(home, exec_fd)
            os.close(write_end)
            write_end = -1
            assert result == {"exit_code": 0, "signal": None}
            assert os.read(read_end, 100) == b"on-the-fd\n" and not [m for m in seen if isinstance(m, tuple)]
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)

        with pytest.raises(DaemonError) as failed:
            await client(home, request("Environments.Get", {"context": context(project), "environment": "nope"}))
        assert (failed.value.kind, failed.value.exit_code) == ("not_found", 3)

        _, deleted = await client(home, request("Environments.Delete", {"context": context(project)}))
        assert deleted["environment"]["state"] == "deleted"
        # The daemon's log is masked with every secret a call brought.
        assert service.redactor.redact(f"x {SECRET} y") == "x *** y"
        assert SECRET not in repr([up, report, status, deleted])


async def test_a_client_hanging_up_kills_its_command(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    marker = "4321.8765"

    def hang_up(conn: Connection) -> None:
        conn.call("Machines.Exec", {"context": context(project), "argv": ["sleep", marker]})
        for _ in range(400):
            if _running(marker):
                return  # the connection closes here: the client is gone
            import time

            time.sleep(0.05)
        raise AssertionError("the command never started")

    async with daemon_with_service(home):
        await client(home, request("Environments.Up", {"context": context(project)}))
        await client(home, hang_up)
        for _ in range(200):
            if not _running(marker):
                break
            await asyncio.sleep(0.05)
        assert not _running(marker)
        await client(home, request("Environments.Delete", {"context": context(project)}))


def _running(marker: str) -> bool:
    return any(marker in (p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
