"""UDP exports and imports for real: Machines as test namespaces attached to route domains the test creates.

Host-side traffic stays on loopback; everything else is in namespaces the test creates. Each Machine-side and
host-side service counts the datagrams that reach it, so a refused datagram is one that never arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any, cast

import pytest
from netns_kit import Namespaces, in_netns
from relay_testlib import HostService, build, close_all, definition, fetch_from, free_port, taking

from vz_core.env._definition import parse_definition
from vz_core.env._topology import compile_topology
from vz_core.errors import UnavailableError
from vz_core.network import ExportListener, ImportRelay
from vz_core.network._udp import UdpExport, UdpImport

pytestmark = [pytest.mark.root]


def _definition(export_port: int, host_port: int) -> dict[str, Any]:
    service = {"name": "stats", "port": 8125, "protocol": "udp"}
    return definition("metrics", service, export_port, host_port, protocol="udp")


class _Echo(asyncio.DatagramProtocol):
    """Answers every datagram with ``<name> <data> <peer address>:<peer port>`` and remembers who sent what."""

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.seen: list[tuple[bytes, Any]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.seen.append((data, addr))
        assert self.transport is not None
        self.transport.sendto(b"%s %s %s:%d" % (self.name, data, addr[0].encode(), addr[1]), addr)


async def _echo_in(netns: str | None, address: str, port: int, name: bytes) -> tuple[asyncio.DatagramTransport, _Echo]:
    def make() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((address, port))
        sock.setblocking(False)
        return sock

    sock = await asyncio.to_thread(in_netns, netns, make) if netns else make()
    transport, proto = await asyncio.get_running_loop().create_datagram_endpoint(lambda: _Echo(name), sock=sock)
    return transport, proto


def _client(netns: str | None) -> socket.socket:
    def make() -> socket.socket:
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    sock = in_netns(netns, make) if netns else make()
    sock.settimeout(1.5)
    return sock


def _ask(sock: socket.socket, address: str, port: int, data: bytes) -> bytes | None:
    """Send one datagram; the answer, or None when nothing answers in time (or the port is unreachable)."""
    try:
        sock.sendto(data, (address, port))
        return sock.recv(4096)
    except OSError:  # timeout, or ICMP port unreachable reported on this socket
        return None


async def _ask_from(netns: str | None, address: str, port: int, data: bytes) -> bytes | None:
    def go() -> bytes | None:
        with _client(netns) as sock:
            return _ask(sock, address, port, data)

    return await asyncio.to_thread(go)


async def _until(predicate: Any, seconds: float = 5.0) -> bool:
    deadline = asyncio.get_running_loop().time() + seconds
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_a_udp_export_relays_each_host_peer_on_its_own_socket_and_expires_idle_ones(
    namespaces: Namespaces, env_ids: list[str]
) -> None:
    preferred = free_port(socket.SOCK_DGRAM)
    data = _definition(preferred, free_port(socket.SOCK_DGRAM))
    opened: list[Any] = []
    try:
        plan, netns = await build(namespaces, env_ids[0], data, "a")
        app = plan.machine("app").attachments[0]
        transport, machine = await _echo_in(netns["app"], app.address, 8125, b"app")
        opened.append(transport)
        export = ExportListener(plan.to_json(), "app", "stats", idle=0.4)
        opened.append(export)
        assert export.protocol == "udp"
        assert await export.start() == preferred
        assert export.udp is not None
        assert export.udp.local_addresses() == [("127.0.0.1", preferred)]  # loopback only, never a wildcard

        def two_peers() -> tuple[bytes | None, bytes | None, bytes | None]:
            with _client(None) as one, _client(None) as two:
                first = _ask(one, "127.0.0.1", preferred, b"one")
                second = _ask(two, "127.0.0.1", preferred, b"two")
                again = _ask(one, "127.0.0.1", preferred, b"one-again")
                return first, second, again

        first, second, again = await asyncio.to_thread(two_peers)
        assert first is not None and first.startswith(f"app one {app.gateway}:".encode())  # the peer is the gateway
        assert second is not None and second.startswith(f"app two {app.gateway}:".encode())
        assert again is not None and again.startswith(b"app one-again ")
        ports = [addr[1] for _, addr in machine.seen]
        assert ports[0] == ports[2] != ports[1]  # one domain-side socket per host peer, kept while in use
        assert export.udp.peers == 2
        # Nothing but 127.0.0.1 carries the export: another loopback address reaches no Machine.
        assert await _ask_from(None, "127.0.0.2", preferred, b"elsewhere") is None
        assert len(machine.seen) == 3
        # Idle sessions expire (their sockets are closed); the next datagram opens a new one.
        assert await _until(lambda: export.udp is not None and export.udp.peers == 0)
        assert (await _ask_from(None, "127.0.0.1", preferred, b"later") or b"").startswith(b"app later ")
        assert export.udp.peers == 1
        # Port taken (here: by the running export itself): the next Environment's fallbacks, never a random port.
        other = compile_topology(parse_definition(data), env_ids[1]).to_json()
        second_export = ExportListener(other, "app", "stats")
        assert second_export.candidates[0] == preferred
        try:
            taken = pytest.raises(UnavailableError, match="every host port of this export is taken")
            with taking(second_export.candidates[1:], socket.SOCK_DGRAM), taken:
                await second_export.start()
        finally:
            await second_export.close()
    finally:
        await close_all(opened, env_ids)


async def test_a_udp_export_keeps_at_most_max_peers_sessions(namespaces: Namespaces, env_ids: list[str]) -> None:
    port = free_port(socket.SOCK_DGRAM)
    opened: list[Any] = []
    try:
        plan, netns = await build(namespaces, env_ids[0], _definition(port, free_port(socket.SOCK_DGRAM)), "a")
        app = plan.machine("app").attachments[0]
        transport, machine = await _echo_in(netns["app"], app.address, 8125, b"app")
        opened.append(transport)
        relay = UdpExport(f"/run/netns/{plan.route_domain}", (app.address, 8125), [port], max_peers=2)
        opened.append(relay)
        await relay.start()

        def three() -> list[bytes | None]:
            clients = [_client(None) for _ in range(3)]
            try:
                return [_ask(c, "127.0.0.1", port, b"hi %d" % i) for i, c in enumerate(clients)]
            finally:
                for c in clients:
                    c.close()

        answers = await asyncio.to_thread(three)
        assert all(a is not None and a.startswith(b"app hi ") for a in answers)
        assert relay.peers == 2  # the least recently used session was closed to admit the third peer
        assert len({addr[1] for _, addr in machine.seen}) == 3
    finally:
        await close_all(opened, env_ids)


class _HostEcho:
    def __init__(self, port: int) -> None:
        self.port = port
        self.transport: asyncio.DatagramTransport | None = None
        self.proto: _Echo | None = None

    async def start(self) -> _HostEcho:
        self.transport, self.proto = await _echo_in(None, "127.0.0.1", self.port, b"host")
        return self

    @property
    def hits(self) -> int:
        return len(self.proto.seen) if self.proto else 0

    async def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def test_a_udp_import_reaches_the_host_port_only_from_the_declaring_machine(
    namespaces: Namespaces, env_ids: list[str]
) -> None:
    host_port = free_port(socket.SOCK_DGRAM)
    data = _definition(free_port(socket.SOCK_DGRAM), host_port)
    opened: list[Any] = []
    try:
        host = await _HostEcho(host_port).start()
        opened.append(host)
        shop, shop_ns = await build(namespaces, env_ids[0], data, "a")
        blog, blog_ns = await build(namespaces, env_ids[1], dict(data, imports=[]), "b")
        relay = ImportRelay(shop.to_json(), 0, idle=0.4)
        opened.append(relay)
        assert relay.protocol == "udp"
        await relay.start()
        gateway = shop.imports[0].relay_addresses[0]
        assert gateway == blog.machine("app").attachments[0].gateway  # the other Environment: same address
        got = await _ask_from(shop_ns["app"], gateway, 7000, b"ping")
        assert got is not None and got.startswith(b"host ping 127.0.0.1:")
        assert host.hits == 1
        # The neighbour, and both Machines of the other Environment (same gateway address): nothing arrives.
        for netns in (shop_ns["db"], blog_ns["app"], blog_ns["db"]):
            assert await _ask_from(netns, gateway, 7000, b"intruder") is None
        # Only the declared Machine-side port: the host port itself is not reachable through the gateway.
        assert await _ask_from(shop_ns["app"], gateway, host_port, b"direct") is None
        assert host.hits == 1
        assert relay.udp is not None
        assert await _until(lambda: relay.udp is not None and relay.udp.peers == 0)  # idle session expired
    finally:
        await close_all(opened, env_ids)


async def test_a_udp_import_relay_checks_the_source_itself(namespaces: Namespaces, env_ids: list[str]) -> None:
    """The nft ``local`` set admits the importing Machine; the relay checks the source again: a relay told to
    accept another address relays nothing from this Machine (and counts what it dropped)."""
    host_port = free_port(socket.SOCK_DGRAM)
    opened: list[Any] = []
    try:
        host = await _HostEcho(host_port).start()
        opened.append(host)
        plan, netns = await build(namespaces, env_ids[0], _definition(free_port(socket.SOCK_DGRAM), host_port), "a")
        app = plan.machine("app").attachments[0]
        db = plan.machine("db").attachments[0]
        relay = UdpImport(
            f"/run/netns/{plan.route_domain}", [app.gateway], 7000, {db.address}, ("127.0.0.1", host_port)
        )
        opened.append(relay)
        await relay.start()
        assert await _ask_from(netns["app"], app.gateway, 7000, b"ping") is None
        assert (host.hits, relay.dropped, relay.peers) == (0, 1, 0)
        with pytest.raises(ValueError, match="loopback"):
            UdpImport("/run/netns/x", [app.gateway], 7000, set(), ("192.0.2.1", 53))
    finally:
        await close_all(opened, env_ids)


async def test_closing_a_udp_relay_leaves_no_socket(namespaces: Namespaces, env_ids: list[str]) -> None:
    port = free_port(socket.SOCK_DGRAM)
    opened: list[Any] = []
    try:
        plan, netns = await build(namespaces, env_ids[0], _definition(port, free_port(socket.SOCK_DGRAM)), "a")
        app = plan.machine("app").attachments[0]
        transport, _ = await _echo_in(netns["app"], app.address, 8125, b"app")
        opened.append(transport)
        export = ExportListener(plan.to_json(), "app", "stats")
        await export.start()
        assert await _ask_from(None, "127.0.0.1", port, b"x") is not None
        assert export.udp is not None and export.udp.peers == 1
        await export.close()
        assert export.udp.peers == 0 and export.udp.local_addresses() == []
        # The port is free again: something else can bind it.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", port))
        with contextlib.suppress(Exception):
            await export.close()  # idempotent
    finally:
        await close_all(opened, env_ids)


async def test_two_machines_of_one_network_import_the_same_host_port(
    namespaces: Namespaces, env_ids: list[str]
) -> None:
    """Machines sharing a gateway may import the same host port at the same port (tcp and udp): each one's relay
    starts (they share the gateway's port) and each Machine reaches the host; a Machine without the import
    does not."""
    tcp_port, udp_port = free_port(), free_port(socket.SOCK_DGRAM)
    m = {"profile": "developer", "driver": "fake", "image": "vz:default"}
    data = {
        "version": 2,
        "project_id": "models",
        "machines": [{"name": n, **m} for n in ("app", "worker", "db")],
        "imports": [
            {"machine": name, "host_port": port, "port": at, "protocol": proto}
            for name in ("app", "worker")
            for port, at, proto in ((tcp_port, 7000, "tcp"), (udp_port, 7001, "udp"))
        ],
        "default_machine": "app",
    }
    opened: list[Any] = []
    try:
        tcp = HostService(tcp_port, b"tcp host")
        opened.append(tcp)
        udp = await _HostEcho(udp_port).start()
        opened.append(udp)
        plan, netns = await build(namespaces, env_ids[0], data, "a")
        for index in range(4):
            relay = ImportRelay(plan.to_json(), index)
            opened.append(relay)
            await relay.start()
        gateway = plan.imports[0].relay_addresses[0]
        for name in ("app", "worker"):
            assert await asyncio.to_thread(fetch_from, netns[name], gateway, 7000, 2) == b"tcp host"
            got = await _ask_from(netns[name], gateway, 7001, name.encode())
            assert got is not None and got.startswith(b"host " + name.encode())
        assert await asyncio.to_thread(fetch_from, netns["db"], gateway, 7000, 2) is None
        assert await _ask_from(netns["db"], gateway, 7001, b"db") is None
        assert (tcp.hits, udp.hits) == (2, 2)
    finally:
        await close_all(opened, env_ids)
