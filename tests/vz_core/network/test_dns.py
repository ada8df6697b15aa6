"""The Environment's DNS responder: each Machine resolves exactly what its plan lets it see.

The messages are built and read by this test's own small encoder/decoder (not the responder's), once through
the pure ``dns_answer`` and once for real: servers in two overlapping route domains, queried from test
namespaces over UDP and TCP.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from netns_kit import Namespaces, in_netns

from vz_core.env._definition import parse_definition
from vz_core.env._topology import compile_topology
from vz_core.network import (
    DnsServer,
    DnsView,
    PlanError,
    attach_machine,
    dns_answer,
    ensure_domain,
    remove_domain,
)

ENV = "env_0123456789ab"


def _m(name: str, *services: tuple[str, int]) -> dict[str, Any]:
    return {
        "name": name,
        "profile": "developer",
        "driver": "fake",
        "image": "vz:default",
        "services": [{"name": n, "port": p} for n, p in services],
    }


SHOP = {
    "version": 2,
    "project_id": "shop",
    "machines": [_m("app"), _m("db", ("pg", 5432)), _m("cache", ("redis", 6379))],
    "paths": [{"from": "app", "to": "db", "service": "pg"}],
    "imports": [{"machine": "app", "host_port": 11434}],
}
BLOG = {
    "version": 2,
    "project_id": "blog",
    "machines": [_m("app", ("web", 80)), _m("db", ("pg", 5432))],
    "paths": [{"from": "db", "to": "app", "service": "web"}],
}


def query(name: str, qtype: int = 1, ident: int = 0x1234) -> bytes:
    head = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"
    return head + labels + struct.pack("!HH", qtype, 1)


def _name(msg: bytes, offset: int) -> tuple[str, int]:
    labels: list[str] = []
    end = None
    while True:
        length = msg[offset]
        if length & 0xC0 == 0xC0:
            pointer = struct.unpack_from("!H", msg, offset)[0] & 0x3FFF
            end = end or offset + 2
            offset = pointer
            continue
        offset += 1
        if length == 0:
            return ".".join(labels), end or offset
        labels.append(msg[offset : offset + length].decode())
        offset += length


def decode(msg: bytes) -> dict[str, Any]:
    ident, flags, qd, an, ns, ar = struct.unpack_from("!HHHHHH", msg, 0)
    offset = 12
    for _ in range(qd):
        _, offset = _name(msg, offset)
        offset += 4
    records = []
    for _ in range(an + ns + ar):
        name, offset = _name(msg, offset)
        rtype, _cls, _ttl, length = struct.unpack_from("!HHIH", msg, offset)
        offset += 10
        data = msg[offset : offset + length]
        if rtype == 1:
            value: Any = str(ipaddress.IPv4Address(data))
        elif rtype == 33:
            value = (struct.unpack_from("!HHH", data)[2], _name(msg, offset + 6)[0])
        else:
            value = data
        offset += length
        records.append((name, rtype, value))
    return {
        "id": ident,
        "rcode": flags & 0xF,
        "aa": bool(flags & 0x0400),
        "qr": bool(flags & 0x8000),
        "answers": records[:an],
        "additional": records[an + ns :],
    }


def test_each_machine_resolves_only_what_its_plan_shows() -> None:
    plan = compile_topology(parse_definition(SHOP), ENV)
    view = DnsView.from_plan(plan.to_json())
    addr = {m.name: m.attachments[0].address for m in plan.machines}
    gateway = plan.networks[0].gateway

    def ask(source: str, name: str, qtype: int = 1) -> dict[str, Any]:
        raw = dns_answer(view, addr.get(source, source), query(name, qtype))
        assert raw is not None
        return decode(raw)

    got = ask("app", "db.vz.internal")
    assert (got["rcode"], got["aa"], got["qr"], got["id"]) == (0, True, True, 0x1234)
    assert got["answers"] == [("db.vz.internal", 1, addr["db"])]
    assert ask("app", "DB.VZ.Internal")["answers"] == [("DB.VZ.Internal", 1, addr["db"])]  # the asked spelling
    srv = ask("app", "_pg._tcp.db.vz.internal", 33)
    assert srv["answers"] == [("_pg._tcp.db.vz.internal", 33, (5432, "db.vz.internal"))]
    assert srv["additional"] == [("db.vz.internal", 1, addr["db"])]
    assert ask("app", "host.vz.internal")["answers"] == [("host.vz.internal", 1, gateway)]
    assert ask("app", "host.docker.internal")["answers"] == [("host.docker.internal", 1, gateway)]
    assert ask("app", "app.vz.internal")["answers"] == [("app.vz.internal", 1, addr["app"])]
    # A visible name asked for another type: no data, not an error.
    assert (ask("app", "db.vz.internal", 28)["rcode"], ask("app", "db.vz.internal", 28)["answers"]) == (0, [])
    # db has no path to app, cache none at all, and neither imports: NXDOMAIN, never a hint it exists.
    for source, name in [
        ("db", "app.vz.internal"),
        ("cache", "db.vz.internal"),
        ("db", "host.vz.internal"),
        ("cache", "_pg._tcp.db.vz.internal"),
        ("app", "cache.vz.internal"),
        ("app", "vz.internal"),
    ]:
        found = ask(source, name)
        assert (found["rcode"], found["answers"]) == (3, []), (source, name)
    # Outside the Environment's zones: refused (no recursion yet); an unknown source: refused.
    assert ask("app", "example.com")["rcode"] == 5
    assert ask("10.99.0.9", "db.vz.internal")["rcode"] == 5


def test_malformed_messages_get_formerr_or_nothing() -> None:
    view = DnsView.from_plan(compile_topology(parse_definition(SHOP), ENV).to_json())
    app = compile_topology(parse_definition(SHOP), ENV).machine("app").attachments[0].address
    assert dns_answer(view, app, b"\x00" * 5) is None
    response = bytearray(query("db.vz.internal"))
    response[2] |= 0x80
    assert dns_answer(view, app, bytes(response)) is None  # a response is never answered
    truncated = dns_answer(view, app, query("db.vz.internal")[:-3])
    assert truncated is not None and decode(truncated)["rcode"] == 1
    pointer = struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c" + struct.pack("!HH", 1, 1)
    assert decode(dns_answer(view, app, pointer) or b"")["rcode"] == 1
    notify = bytearray(query("db.vz.internal"))
    notify[2] |= 4 << 3
    assert decode(dns_answer(view, app, bytes(notify)) or b"")["rcode"] == 4


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_never_break_the_responder(data: bytes) -> None:
    view = DnsView.from_plan(compile_topology(parse_definition(SHOP), ENV).to_json())
    out = dns_answer(view, "10.89.242.47", data)
    assert out is None or len(out) >= 12


def test_a_tampered_record_is_refused() -> None:
    plan = compile_topology(parse_definition(SHOP), ENV).to_json()
    plan["machines"][0]["dns"][0]["name"] = "evil\x00.vz.internal"
    with pytest.raises(PlanError, match="is not a DNS name"):
        DnsView.from_plan(plan)


def _udp(netns: str, server: str, message: bytes) -> bytes | None:
    sock = in_netns(netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    sock.settimeout(2)
    try:
        sock.sendto(message, (server, 53))
        return sock.recv(4096)
    except OSError:
        return None
    finally:
        sock.close()


def _tcp(netns: str, server: str, message: bytes) -> bytes | None:
    sock = in_netns(netns, socket.socket)
    sock.settimeout(2)
    try:
        sock.connect((server, 53))
        sock.sendall(struct.pack("!H", len(message)) + message)
        head = sock.recv(2)
        (length,) = struct.unpack("!H", head)
        data = b""
        while len(data) < length:
            data += sock.recv(length - len(data))
        return data
    except OSError:
        return None
    finally:
        sock.close()


@pytest.mark.root
async def test_two_overlapping_environments_each_answer_their_own_view(
    namespaces: Namespaces, env_ids: list[str]
) -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root")
    envs = {}
    servers = []
    try:
        for env_id, data, label in ((env_ids[0], SHOP, "a"), (env_ids[1], BLOG, "b")):
            plan = compile_topology(parse_definition(data), env_id)
            await ensure_domain(plan.to_json())
            netns = {}
            for m in plan.machines:
                netns[m.name] = namespaces.add(f"{label}-{m.name}")
                await attach_machine(plan.to_json(), m.name, netns[m.name])
            server = DnsServer(plan.to_json())
            await server.start()
            servers.append(server)
            envs[label] = (plan, netns)
        shop, shop_ns = envs["a"]
        blog, blog_ns = envs["b"]
        gateway = shop.networks[0].gateway
        assert gateway == blog.networks[0].gateway  # the same resolver address in both Environments

        async def ask(netns: str, name: str, tcp: bool = False) -> dict[str, Any]:
            raw = await asyncio.to_thread(_tcp if tcp else _udp, netns, gateway, query(name))
            assert raw is not None, name
            return decode(raw)

        assert (await ask(shop_ns["app"], "db.vz.internal"))["answers"] == [
            ("db.vz.internal", 1, shop.machine("db").attachments[0].address)
        ]
        assert (await ask(shop_ns["app"], "db.vz.internal", tcp=True))["answers"][0][2] == (
            shop.machine("db").attachments[0].address
        )
        assert (await ask(shop_ns["app"], "host.vz.internal"))["answers"][0][2] == gateway
        assert (await ask(shop_ns["db"], "app.vz.internal"))["rcode"] == 3
        # The blog's app asks the same address and gets the blog's view: db has the path there, app does not.
        assert (await ask(blog_ns["app"], "db.vz.internal"))["rcode"] == 3
        assert (await ask(blog_ns["db"], "app.vz.internal"))["answers"] == [
            ("app.vz.internal", 1, blog.machine("app").attachments[0].address)
        ]
        assert (await ask(blog_ns["app"], "host.vz.internal"))["rcode"] == 3
        assert (await ask(shop_ns["cache"], "example.com"))["rcode"] == 5
    finally:
        for server in servers:
            await server.close()
        for env_id in env_ids:
            await remove_domain(env_id)
