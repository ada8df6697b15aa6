"""NetworkHost: the long-lived network parts of running Environments (DNS, exports, imports), for real.

Machines are plain test namespaces attached to route domains of made-up environment ids; host-side traffic stays
on loopback (and the host's own addresses, which never leave it). Everything is removed by the fixtures, which
also compare the host's namespaces/links/tables before and after.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from netns_kit import Namespaces, in_netns, run

from vz_core.env._definition import parse_definition
from vz_core.env._topology import TopologyPlan, compile_topology
from vz_core.errors import FailedPreconditionError, UnavailableError
from vz_core.network import Endpoint, NetworkHost, attach_machine, detach_machine, ensure_domain, remove_domain

pytestmark = [pytest.mark.root]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _machine(name: str, *services: tuple[str, int]) -> dict[str, Any]:
    return {
        "name": name,
        "profile": "developer",
        "driver": "fake",
        "image": "vz:default",
        "services": [{"name": n, "port": p} for n, p in services],
    }


def _definition(export_port: int, host_port: int, *, imports: bool = True) -> dict[str, Any]:
    return {
        "version": 2,
        "project_id": "shop",
        "machines": [_machine("app", ("http", 8080)), _machine("db", ("pg", 5432)), _machine("cache")],
        "paths": [{"from": "app", "to": "db", "service": "pg"}],
        "exports": [{"machine": "app", "service": "http", "host_port": export_port}],
        "imports": [{"machine": "app", "host_port": host_port, "port": 7000}] if imports else [],
    }


class Env:
    """One Environment: its plan, its route domain and its Machines (test namespaces), each serving a reply."""

    def __init__(self, plan: TopologyPlan, netns: dict[str, str]) -> None:
        self.plan = plan
        self.json = plan.to_json()
        self.netns = netns
        self.servers: list[asyncio.Server] = []

    @property
    def id(self) -> str:
        return self.plan.environment_id

    def address(self, machine: str) -> str:
        return self.plan.machine(machine).attachments[0].address

    def gateway(self, machine: str) -> str:
        return self.plan.machine(machine).attachments[0].gateway


async def _build(spaces: Namespaces, env_id: str, data: dict[str, Any], label: str, reply: bytes) -> Env:
    plan = compile_topology(parse_definition(data), env_id)
    await ensure_domain(plan.to_json())
    env = Env(plan, {})
    for m in plan.machines:
        env.netns[m.name] = spaces.add(f"{label}-{m.name}")
        await attach_machine(env.json, m.name, env.netns[m.name])
    env.servers.append(await _serve_in(env.netns["app"], env.address("app"), 8080, reply))
    return env


async def _serve_in(netns: str, address: str, port: int, reply: bytes) -> asyncio.Server:
    def make() -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(16)
        sock.setblocking(False)
        return sock

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        writer.write(reply + b" " + line)
        await writer.drain()
        writer.close()

    sock = await asyncio.to_thread(in_netns, netns, make)
    return await asyncio.start_server(handle, sock=sock)


def _fetch(netns: str | None, address: str, port: int, line: bytes = b"hello\n") -> bytes | None:
    """Connect (from ``netns``, or the host), send a line, read to the end; None when refused or reset."""
    sock = in_netns(netns, socket.socket) if netns else socket.socket()
    sock.settimeout(3)
    try:
        sock.connect((address, port))
        sock.sendall(line)
        data = b""
        while part := sock.recv(4096):
            data += part
        return data or None
    except OSError:
        return None
    finally:
        sock.close()


async def fetch(netns: str | None, address: str, port: int, line: bytes = b"hello\n") -> bytes | None:
    return await asyncio.to_thread(_fetch, netns, address, port, line)


def _query(name: str, qtype: int = 1) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"
    return struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + labels + struct.pack("!HH", qtype, 1)


def _resolve(netns: str, server: str, name: str) -> tuple[int, list[str]] | None:
    """(rcode, A addresses) of a UDP query from ``netns``; None when nothing answers."""
    sock = in_netns(netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    sock.settimeout(1.5)
    try:
        sock.sendto(_query(name), (server, 53))
        data = sock.recv(4096)
    except OSError:
        return None
    finally:
        sock.close()
    rcode, ancount = data[3] & 0x0F, struct.unpack_from("!H", data, 6)[0]
    # Answers of our own query: the question is echoed, then each A record's last 4 bytes are the address.
    offset = len(_query(name))
    addresses = []
    for _ in range(ancount):
        offset += 2  # a compression pointer to the question's name
        rtype, _cls, _ttl, length = struct.unpack_from("!HHIH", data, offset)
        offset += 10
        if rtype == 1:
            addresses.append(socket.inet_ntoa(data[offset : offset + length]))
        offset += length
    return rcode, addresses


async def resolve(netns: str, server: str, name: str) -> tuple[int, list[str]] | None:
    return await asyncio.to_thread(_resolve, netns, server, name)


def _socket_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with_target = os.path.join("/proc/self/fd", fd)
        try:
            if os.readlink(with_target).startswith("socket:"):
                count += 1
        except OSError:
            continue
    return count


def _host_addresses() -> list[str]:
    """The host's own IPv4 addresses other than 127.0.0.1 (127.0.0.2 always: loopback, never listened on)."""
    out = ["127.0.0.2"]
    for item in json.loads(run("ip", "-j", "-4", "addr", "show") or "[]"):
        for info in item.get("addr_info", []):
            if info.get("local") and not info["local"].startswith("127."):
                out.append(info["local"])
    return out


@pytest.fixture
async def host(namespaces: Namespaces, env_ids: list[str]) -> AsyncIterator[NetworkHost]:
    sockets_before = _socket_fds()
    network = NetworkHost()
    try:
        yield network
    finally:
        await network.close()
        for env_id in env_ids:
            await remove_domain(env_id)
    gc.collect()  # sockets nothing refers to any more are closed by the collector, not leaks of the host
    assert _socket_fds() <= sockets_before, "the NetworkHost left sockets open"


async def _host_service(port: int, hits: list[int]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits[0] += 1
        writer.write(b"from the host")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def _close(env: Env) -> None:
    for server in env.servers:
        server.close()
        await server.wait_closed()


async def test_dns_exports_and_imports_of_an_environment(
    host: NetworkHost, namespaces: Namespaces, env_ids: list[str]
) -> None:
    preferred, host_port = _free_port(), _free_port()
    hits = [0]
    outside = await _host_service(host_port, hits)
    shop = await _build(namespaces, env_ids[0], _definition(preferred, host_port), "a", b"shop")
    # The other Environment (same addresses, same preferred port) declares no import.
    blog = await _build(namespaces, env_ids[1], _definition(preferred, host_port, imports=False), "b", b"blog")
    try:
        endpoints = await host.ensure(shop.json)
        assert endpoints == [Endpoint("app", "http", "tcp", "127.0.0.1", preferred)]
        assert host.endpoints(shop.id) == endpoints and host.environments() == [shop.id]
        gw = shop.gateway("app")

        # DNS: only the declared names, from the Environment's own Machines.
        assert await resolve(shop.netns["app"], gw, "db.vz.internal") == (0, [shop.address("db")])
        assert await resolve(shop.netns["app"], gw, "app.vz.internal") == (0, [shop.address("app")])
        assert await resolve(shop.netns["app"], gw, "host.vz.internal") == (0, [gw])
        assert await resolve(shop.netns["app"], gw, "cache.vz.internal") == (3, [])  # no path: NXDOMAIN
        assert await resolve(shop.netns["db"], gw, "app.vz.internal") == (3, [])
        assert await resolve(shop.netns["db"], gw, "host.vz.internal") == (3, [])  # db imports nothing
        assert await resolve(shop.netns["app"], gw, "example.com") == (5, [])  # REFUSED: no recursion
        # blog's domain has the same gateway address, and no responder: nothing answers there.
        assert await resolve(blog.netns["app"], gw, "db.vz.internal") is None

        # Export: 127.0.0.1 only, reaching shop's app (which sees its gateway as the peer).
        assert await fetch(None, "127.0.0.1", preferred) == b"shop hello\n"
        for address in _host_addresses():
            assert await fetch(None, address, preferred) is None, address
        # Import: only from shop's app, to exactly the declared host port.
        assert await fetch(shop.netns["app"], gw, 7000) == b"from the host" and hits[0] == 1
        for netns in (shop.netns["db"], shop.netns["cache"], blog.netns["app"], blog.netns["db"]):
            assert await fetch(netns, gw, 7000) is None
        assert await fetch(shop.netns["app"], gw, host_port) is None
        assert hits[0] == 1

        # The second Environment exporting the same preferred port: its own fallback, both work.
        (second,) = await host.ensure(blog.json)
        assert second.port != preferred and second.port in blog.plan.exports[0].host_ports[1:]
        assert await fetch(None, "127.0.0.1", second.port) == b"blog hello\n"
        assert await fetch(None, "127.0.0.1", preferred) == b"shop hello\n"
        assert await fetch(blog.netns["app"], gw, 7000) is None  # blog has no import relay
        assert sorted(host.environments()) == sorted([shop.id, blog.id])

        # Stop: nothing answers any more, the chosen ports are kept; the other Environment is untouched.
        assert await host.stop(shop.id) is True
        assert await fetch(None, "127.0.0.1", preferred) is None
        assert await fetch(shop.netns["app"], gw, 7000) is None
        assert await resolve(shop.netns["app"], gw, "db.vz.internal") is None
        assert host.endpoints(shop.id) == [] and host.chosen_ports(shop.id) == {("app", "http"): preferred}
        assert await fetch(None, "127.0.0.1", second.port) == b"blog hello\n"
        # ... and the next ensure brings everything back where it was.
        assert await host.ensure(shop.json) == endpoints
        assert await resolve(shop.netns["app"], gw, "db.vz.internal") == (0, [shop.address("db")])
        assert await fetch(shop.netns["app"], gw, 7000) == b"from the host"

        # Remove: closed and forgotten.
        assert await host.remove(shop.id) is True
        assert host.chosen_ports(shop.id) == {} and host.plan(shop.id) is None
        assert await fetch(None, "127.0.0.1", preferred) is None
        assert await host.remove(shop.id) is False
        assert host.environments() == [blog.id]
    finally:
        outside.close()
        await outside.wait_closed()
        await _close(shop)
        await _close(blog)


async def test_ensure_is_idempotent_and_follows_plan_changes(
    host: NetworkHost, namespaces: Namespaces, env_ids: list[str]
) -> None:
    preferred = _free_port()
    data = _definition(preferred, _free_port(), imports=False)
    shop = await _build(namespaces, env_ids[0], data, "a", b"shop")
    try:
        await host.ensure(shop.json)
        # A relayed connection stays open across an ensure of the same plan (nothing is restarted).
        sock = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", preferred), 3)
        try:
            listener_before = host._envs[shop.id].exports[("app", "http")][1]
            dns_before = host._envs[shop.id].dns
            assert await host.ensure(compile_topology(parse_definition(data), shop.id).to_json())
            assert host._envs[shop.id].exports[("app", "http")][1] is listener_before
            assert host._envs[shop.id].dns is dns_before
            await asyncio.to_thread(sock.sendall, b"still there\n")
            assert await asyncio.to_thread(sock.recv, 4096) == b"shop still there\n"
        finally:
            sock.close()
        # The definition changes: a second export appears, the DNS view changes (db now imports a host port).
        host_port, hits = _free_port(), [0]
        outside = await _host_service(host_port, hits)
        try:
            changed = dict(
                data,
                exports=[*data["exports"], {"machine": "db", "service": "pg"}],
                imports=[{"machine": "db", "host_port": host_port}],
            )
            plan = compile_topology(parse_definition(changed), shop.id).to_json()
            shop.servers.append(await _serve_in(shop.netns["db"], shop.address("db"), 5432, b"db"))
            await ensure_domain(plan)  # `vz up` converges the domain (its nft input rules) first
            endpoints = await host.ensure(plan)
            assert [(e.machine, e.service) for e in endpoints] == [("app", "http"), ("db", "pg")]
            assert endpoints[0].port == preferred
            assert await fetch(None, "127.0.0.1", endpoints[1].port) == b"db hello\n"
            gw = shop.gateway("db")
            assert await resolve(shop.netns["db"], gw, "host.vz.internal") == (0, [gw])
            assert await fetch(shop.netns["db"], gw, host_port) == b"from the host"
            assert await fetch(shop.netns["app"], gw, host_port) is None
            # Back to the first plan: db's export and import are closed, app's export is where it was.
            await ensure_domain(shop.json)
            assert await host.ensure(shop.json) == [Endpoint("app", "http", "tcp", "127.0.0.1", preferred)]
            assert await fetch(None, "127.0.0.1", endpoints[1].port) is None
            assert await fetch(shop.netns["db"], gw, host_port) is None
            assert await resolve(shop.netns["db"], gw, "host.vz.internal") == (3, [])
        finally:
            outside.close()
            await outside.wait_closed()
    finally:
        await _close(shop)


async def test_chosen_port_is_stable_across_stop_and_a_restart(
    host: NetworkHost, namespaces: Namespaces, env_ids: list[str]
) -> None:
    preferred = _free_port()
    shop = await _build(namespaces, env_ids[0], _definition(preferred, _free_port(), imports=False), "a", b"shop")
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", preferred))
    blocker.listen(1)
    try:
        (first,) = await host.ensure(shop.json)
        assert first.port != preferred and first.port in shop.plan.exports[0].host_ports  # a fallback
        blocker.close()  # the preference is free again ...
        await host.stop(shop.id)
        (again,) = await host.ensure(shop.json)
        assert again.port == first.port  # ... but the Environment keeps the port it had
        # A new host (the daemon restarted) given the recorded port: the same port again.
        await host.stop(shop.id)
        restarted = NetworkHost()
        try:
            (restored,) = await restarted.ensure(shop.json, ports={("app", "http"): first.port})
            assert restored.port == first.port
            assert await fetch(None, "127.0.0.1", first.port) == b"shop hello\n"
            # A recorded port that is no longer a candidate of the export (its preference changed) is ignored.
            await restarted.remove(shop.id)
            (fresh,) = await restarted.ensure(shop.json, ports={("app", "http"): 1})
            assert fresh.port == preferred
        finally:
            await restarted.close()
        # Every candidate taken: a clear error; the other parts (DNS) still run.
        blockers = []
        try:
            for port in shop.plan.exports[0].host_ports:
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the TIME_WAITs of the test
                try:
                    sock.bind(("127.0.0.1", port))
                    sock.listen(1)
                except OSError:
                    sock.close()
                    continue
                blockers.append(sock)
            await host.remove(shop.id)
            with pytest.raises(UnavailableError, match=r"export app/http: every host port of this export is taken"):
                await host.ensure(shop.json)
            assert host.endpoints(shop.id) == []
            gw = shop.gateway("app")
            assert await resolve(shop.netns["app"], gw, "db.vz.internal") == (0, [shop.address("db")])
        finally:
            for sock in blockers:
                sock.close()
    finally:
        blocker.close()
        await _close(shop)


async def test_parts_of_unattached_machines_wait_for_them(
    host: NetworkHost, namespaces: Namespaces, env_ids: list[str]
) -> None:
    host_port, hits = _free_port(), [0]
    data = _definition(_free_port(), host_port)
    plan = compile_topology(parse_definition(data), env_ids[0])
    with pytest.raises(FailedPreconditionError, match=r"route domain vzd-.* does not exist"):
        await host.ensure(plan.to_json())
    outside = await _host_service(host_port, hits)
    shop = await _build(namespaces, env_ids[0], data, "a", b"shop")
    try:
        await detach_machine(shop.json, "app")
        # app (the exporter and importer) is not attached: no export, no import; DNS on the others' gateway.
        assert await host.ensure(shop.json) == []
        gw = shop.gateway("db")
        assert await resolve(shop.netns["db"], gw, "db.vz.internal") == (0, [shop.address("db")])
        await attach_machine(shop.json, "app", shop.netns["app"])
        (endpoint,) = await host.ensure(shop.json)
        assert await fetch(None, "127.0.0.1", endpoint.port) == b"shop hello\n"
        assert await fetch(shop.netns["app"], gw, 7000) == b"from the host"
        # A UDP export starts beside the TCP one (tests/vz_core/network/test_udp.py relays it for real).
        udp = dict(
            data,
            machines=[_machine("app", ("http", 8080), ("stats", 8125)), *data["machines"][1:]],
            exports=[*data["exports"], {"machine": "app", "service": "stats"}],
        )
        udp["machines"][0]["services"][1]["protocol"] = "udp"
        both = await host.ensure(compile_topology(parse_definition(udp), shop.id).to_json())
        assert both[0] == endpoint and [(e.service, e.protocol, e.host) for e in both[1:]] == [
            ("stats", "udp", "127.0.0.1")
        ]
        assert host.endpoints(shop.id) == both
    finally:
        outside.close()
        await outside.wait_closed()
        await _close(shop)
