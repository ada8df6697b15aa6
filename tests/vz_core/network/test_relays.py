"""Exports on 127.0.0.1 and import relays, for real: two Environments of one project, Machines as test namespaces.

Host-side traffic stays on loopback; everything else is in namespaces the test creates.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import pytest
from netns_kit import Namespaces, in_netns
from relay_testlib import HostService, build, close_all, definition, fetch_from, free_port, taking

from vz_core.errors import UnavailableError
from vz_core.network import ExportListener, ImportRelay, PlanError

pytestmark = [pytest.mark.root]


def _definition(export_port: int, host_port: int) -> dict[str, Any]:
    return definition("shop", {"name": "http", "port": 8080}, export_port, host_port)


async def _serve_in(netns: str, address: str, port: int, reply: bytes) -> tuple[asyncio.Server, list[int]]:
    """A TCP server inside a namespace answering ``reply`` and counting connections."""
    count = [0]

    def make() -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(16)
        sock.setblocking(False)
        return sock

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count[0] += 1
        try:
            writer.write(reply + b" " + writer.get_extra_info("peername")[0].encode())
            await writer.drain()
        except ConnectionError:
            pass  # the client went away first: the connection still counts, and is still closed
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()  # closed for real before the test's loop ends

    sock = await asyncio.to_thread(in_netns, netns, make)
    return await asyncio.start_server(handle, sock=sock), count


async def test_two_environments_export_the_same_port_on_loopback_only(
    namespaces: Namespaces, env_ids: list[str]
) -> None:
    preferred = free_port()
    data = _definition(preferred, free_port())
    opened: list[Any] = []
    try:
        envs = [await build(namespaces, env_id, data, label) for env_id, label in zip(env_ids, "ab", strict=True)]
        listeners = []
        for i, (plan, netns) in enumerate(envs):
            app = plan.machine("app").attachments[0]
            server, _ = await _serve_in(netns["app"], app.address, 8080, f"env{i}".encode())
            opened.append(server)
            export = ExportListener(plan.to_json(), "app", "http")
            opened.append(export)
            await export.start()
            listeners.append(export)
        first, second = listeners
        assert first.port == preferred  # the declared preference, free: taken by the first Environment
        assert second.port != preferred and second.port in envs[1][0].exports[0].host_ports[1:]
        gateway = envs[0][0].machine("app").attachments[0].gateway
        for i, export in enumerate(listeners):
            assert [s.getsockname()[0] for s in export._servers[0].sockets] == ["127.0.0.1"]
            assert export.port is not None
            got = await asyncio.to_thread(fetch_from, None, "127.0.0.1", export.port)
            assert got == f"env{i} {gateway}".encode()  # the Machine sees its gateway as the peer
        # Stable: closed and reopened, the first Environment gets its port again (it is free).
        await first.close()
        again = ExportListener(envs[0][0].to_json(), "app", "http")
        opened.append(again)
        assert await again.start() == preferred
        # Every candidate taken: a clear refusal, not a wildcard or random port.
        taken = pytest.raises(UnavailableError, match="every host port of this export is taken")
        with taking(envs[1][0].exports[0].host_ports), taken:
            await ExportListener(envs[1][0].to_json(), "app", "http").start()
    finally:
        await close_all(opened, env_ids)


async def test_an_import_reaches_the_host_port_only_from_the_declaring_machine(
    namespaces: Namespaces, env_ids: list[str]
) -> None:
    host_port = free_port()
    data = _definition(free_port(), host_port)
    host = HostService(host_port, b"from the host")
    opened: list[Any] = [host]
    try:
        shop, shop_ns = await build(namespaces, env_ids[0], data, "a")
        other = dict(data, imports=[])
        blog, blog_ns = await build(namespaces, env_ids[1], other, "b")
        relay = ImportRelay(shop.to_json(), 0)
        opened.append(relay)
        await relay.start()
        gateway = shop.imports[0].relay_addresses[0]
        assert gateway == blog.machine("app").attachments[0].gateway  # the other Environment: same address
        got = await asyncio.to_thread(fetch_from, shop_ns["app"], gateway, 7000)
        assert (got, host.hits) == (b"from the host", 1)
        for netns in (shop_ns["db"], blog_ns["app"], blog_ns["db"]):
            assert await asyncio.to_thread(fetch_from, netns, gateway, 7000) is None
        # Only the declared Machine-side port: the host port itself is not reachable through the gateway.
        assert await asyncio.to_thread(fetch_from, shop_ns["app"], gateway, host_port) is None
        assert host.hits == 1
        with pytest.raises(PlanError, match="no such import"):
            ImportRelay(blog.to_json(), 0)
    finally:
        await close_all(opened, env_ids)
