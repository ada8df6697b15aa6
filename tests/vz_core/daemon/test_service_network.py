"""The daemon's network records (DaemonNetwork) and the service restoring them at start, without drivers.

An Environment recorded running in a private state store, its route domain realized for real and its Machines
stood in for by test namespaces (as `vz up` with an attaching driver leaves them). Host-side traffic stays on
loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vz_core.daemon._network import DaemonNetwork, has_domain
from vz_core.daemon._service import Service
from vz_core.env import Store, compile_topology
from vz_core.env._definition import parse_definition
from vz_core.errors import UnavailableError
from vz_core.network import attach_machine, ensure_domain, remove_domain

pytestmark = [pytest.mark.root]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _definition(export_port: int) -> dict[str, Any]:
    machine = {"profile": "developer", "driver": "fake", "image": "vz:default"}
    return {
        "version": 2,
        "project_id": "netrecords",
        "machines": [
            {"name": "app", **machine, "services": [{"name": "http", "port": 8080}]},
            {"name": "db", **machine},
        ],
        "exports": [{"machine": "app", "service": "http", "host_port": export_port}],
    }


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _in_netns(path: str, fn: Any) -> Any:
    """``fn()`` on a thread joined to the namespace at ``path`` (vz_core.network's own helper is not used, so
    this test does not rely on what it tests)."""
    import ctypes
    import threading

    box: dict[str, Any] = {}
    libc = ctypes.CDLL(None, use_errno=True)

    def target() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.setns(fd, 0x40000000) != 0:
                raise OSError(ctypes.get_errno(), "setns")
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc
        finally:
            os.close(fd)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store_path = tmp / "state.db"
        self.project = tmp / "project"
        self.project.mkdir()
        alphabet = "0123456789abcdefghjkmnpqrstvwxyz"
        self.env_id = "env_" + "".join(secrets.choice(alphabet) for _ in range(12))
        self.tag = secrets.token_hex(2)
        self.namespaces: list[str] = []
        self.servers: list[asyncio.Server] = []
        self.preferred = _free_port()
        self.data = _definition(self.preferred)
        (self.project / "vz.json").write_text(json.dumps(self.data))
        self.plan = compile_topology(parse_definition(self.data), self.env_id)
        self.ctx = SimpleNamespace(cwd=self.project, definition_file=None)

    async def realize(self) -> None:
        with Store(self.store_path) as store, store.transaction() as db:
            store.touch_project(db, "netrecords", str(self.project / "vz.json"))
            store.create_environment(
                db, env_id=self.env_id, project_id="netrecords", name="default", worktree="/w", default_machine=None
            )
            store.set_environment(db, self.env_id, state="running")
            for i, m in enumerate(("app", "db")):
                store.put_machine(
                    db,
                    env_id=self.env_id,
                    machine_id=f"mch_{i:012d}",
                    name=m,
                    workspace_id=f"w{i}-{self.tag}",
                    driver="fake",
                    spec={"image": "vz:default"},
                    state="running",
                )
        plan = self.plan.to_json()
        await ensure_domain(plan)
        for m in ("app", "db"):
            name = f"vzt{self.tag}-{m}"
            _run("ip", "netns", "add", name)
            self.namespaces.append(name)
            _run("ip", "-n", name, "link", "set", "lo", "up")
            await attach_machine(plan, m, f"/run/netns/{name}")
        address = self.plan.machine("app").attachments[0].address

        def make() -> socket.socket:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, 8080))
            sock.listen(8)
            sock.setblocking(False)
            return sock

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"from app")
            await writer.drain()
            writer.close()

        sock = await asyncio.to_thread(_in_netns, f"/run/netns/vzt{self.tag}-app", make)
        self.servers.append(await asyncio.start_server(handle, sock=sock))

    def recorded(self) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        with Store(self.store_path) as store, store.transaction() as db:
            row = db.execute("SELECT plan, ports FROM environment_networks WHERE env_id = ?", (self.env_id,)).fetchone()
        return None if row is None else (json.loads(row["plan"]), json.loads(row["ports"]))

    def set_state(self, state: str) -> None:
        with Store(self.store_path) as store, store.transaction() as db:
            store.set_environment(db, self.env_id, state=state)

    async def cleanup(self) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()
        for name in self.namespaces:
            with contextlib.suppress(subprocess.CalledProcessError):
                _run("ip", "netns", "del", name)
        await remove_domain(self.env_id)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    if os.geteuid() != 0:
        pytest.fail("these tests need root (route domains, network namespaces)")
    w = World(tmp_path)
    try:
        yield w
    finally:
        await w.cleanup()
    assert not has_domain(w.env_id)


async def fetch(port: int) -> bytes | None:
    def go() -> bytes | None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
                data = b""
                while part := sock.recv(4096):
                    data += part
                return data or None
        except OSError:
            return None

    return await asyncio.to_thread(go)


async def test_records_survive_a_restart_and_the_service_restores_them(world: World) -> None:
    network = DaemonNetwork(world.store_path)
    # Without its route domain, an Environment gets nothing (and nothing is recorded).
    assert await network.after_up(world.ctx, world.env_id) is None
    await world.realize()
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind(("127.0.0.1", world.preferred))
    blocker.listen(1)
    service: Service | None = None
    try:
        (endpoint,) = await network.after_up(world.ctx, world.env_id) or []
        fallback = endpoint["port"]
        assert endpoint == {
            "machine": "app",
            "service": "http",
            "protocol": "tcp",
            "host": "127.0.0.1",
            "port": fallback,
        }
        assert fallback != world.preferred and fallback in world.plan.exports[0].host_ports
        assert await fetch(fallback) == b"from app"
        recorded = world.recorded()
        assert recorded is not None
        assert recorded[0] == world.plan.to_json()
        assert recorded[1] == [{"machine": "app", "service": "http", "port": fallback}]

        # The daemon stops (its parts close, the records stay); the preference is free again meanwhile.
        await network.close()
        assert await fetch(fallback) is None
        blocker.close()
        # A new daemon's service restores the Environment at start, on the port it had.
        service = Service(warm_sessions=False, store_path=world.store_path)
        await service.start()
        assert service._network.endpoints(world.env_id) == [endpoint]
        assert await fetch(fallback) == b"from app"

        # Stop: closed, records kept; a daemon starting now does not serve a stopped Environment.
        await service._network.after_stop(world.env_id)
        assert await fetch(fallback) is None and world.recorded() is not None
        world.set_state("stopped")
        assert await DaemonNetwork(world.store_path).restore() == []
        world.set_state("running")
        again = DaemonNetwork(world.store_path)
        try:
            assert await again.restore() == [world.env_id]
            assert again.endpoints(world.env_id) == [endpoint]
        finally:
            await again.close()

        # Every candidate taken at up: the error names the export; the record keeps the port for later.
        blockers = []
        try:
            for port in world.plan.exports[0].host_ports:
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind(("127.0.0.1", port))
                    sock.listen(1)
                except OSError:
                    sock.close()
                    continue
                blockers.append(sock)
            with pytest.raises(UnavailableError, match="export app/http"):
                await service._network.after_up(world.ctx, world.env_id)
            assert world.recorded() is not None and world.recorded()[1][0]["port"] == fallback  # type: ignore[index]
        finally:
            for sock in blockers:
                sock.close()

        # Delete: closed and the record gone.
        await service._network.after_up(world.ctx, world.env_id)
        assert await fetch(fallback) == b"from app"
        await service._network.after_delete(world.env_id)
        assert await fetch(fallback) is None and world.recorded() is None
    finally:
        blocker.close()
        await network.close()
        if service is not None:
            await service.close()
