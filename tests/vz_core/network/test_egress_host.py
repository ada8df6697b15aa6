"""The host half of egress, for real: the host's namespace is the upstream, a test namespace is "the internet".

The test creates a namespace ``inet`` joined to the host by a veth pair (198.51.100.0/30: a network directly
connected to the host) and routes 203.0.113.0/24 (a documentation range) through it; destinations there count
the connections that reach them. A DNS upstream on the host's 127.0.0.1 (a free port) answers a few names and
counts the queries it gets. Two Environments: ``alpha`` with Machines ``app`` (allowed), ``lst`` (an allowlist
of one CIDR and two domain patterns) and ``off`` (offline); ``beta`` with one allowed Machine. Checked, each
time counting what arrived at the destination:

* allowed reaches the public destinations; offline reaches nothing; the allowlist reaches its CIDR, and a
  listed name's address only after its Machine resolved that name through the Environment's resolver, until
  the entry expires; another name is REFUSED without the upstream ever being asked;
* DNS beyond the Environment is forwarded for allowed and allowlisted names only (offline: REFUSED);
* nothing reaches the host itself (a listener on 0.0.0.0 at every host address, the uplinks' host ends), the
  host's directly connected network, or the other Environment, even after the domain's own table was made to
  accept everything (the host table holds by itself);
* each Environment gets its own /30 (converging again keeps it and rewrites nothing); removal leaves no
  uplink end, no host table and no route domain.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from netns_kit import Listener, Namespaces, attempt, in_netns, listed, listen, run

from vz_core.env._definition import parse_definition
from vz_core.env._topology import compile_topology
from vz_core.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from vz_core.network import (
    HostNetworks,
    NetworkHost,
    Uplink,
    attach_machine,
    ensure_domain,
    ensure_egress,
    host_egress_ruleset,
    host_networks_script,
    host_table,
    remove_domain,
    uplink_name,
)

pytestmark = [pytest.mark.root]

M = {"profile": "developer", "driver": "fake", "image": "vz:default"}
ALPHA = {
    "version": 2,
    "project_id": "egresshost",
    "machines": [
        {"name": "app", **M, "egress": "allowed"},
        {"name": "lst", **M, "egress": {"allow": ["203.0.113.16/28", "api.example.com", "*.cdn.example.net"]}},
        {"name": "off", **M},
    ],
}
BETA = {"version": 2, "project_id": "egresshostb", "machines": [{"name": "peer", **M, "egress": "allowed"}]}
PUBLIC, LISTED_CIDR, BY_NAME, OTHER, CDN = (
    "203.0.113.10",
    "203.0.113.20",
    "203.0.113.60",
    "203.0.113.70",
    "203.0.113.80",
)
NAMES = {
    "api.example.com": BY_NAME,
    "other.example.com": OTHER,
    "img.cdn.example.net": CDN,
    "public.example.org": PUBLIC,
}
CONNECTED = "198.51.100.2"  # the inet namespace's end of its veth: a network directly connected to the host
TTL = 2


class Upstream:
    """A DNS server on 127.0.0.1 (UDP and TCP, one port) answering NAMES with A records (TTL 2); counts the
    queries per name and the TCP ones."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.tcp = socket.socket()
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("127.0.0.1", self.port))
        self.tcp.listen(8)
        self.tcp.settimeout(0.2)
        self.asked: dict[str, int] = {}
        self.over_tcp = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._serve, self._serve_tcp)]
        for thread in self._threads:
            thread.start()

    def _reply(self, data: bytes) -> bytes:
        name, end = _qname(data)
        self.asked[name] = self.asked.get(name, 0) + 1
        address = NAMES.get(name)
        flags = 0x8180 if address else 0x8183
        answers = b""
        if address is not None:
            answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, TTL, 4) + ipaddress.IPv4Address(address).packed
        head = data[:2] + struct.pack("!HHHHH", flags, 1, 1 if address else 0, 0, 0)
        return head + data[12:end] + answers

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(2048)
            except (TimeoutError, OSError):
                continue
            self.sock.sendto(self._reply(data), addr)

    def _serve_tcp(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(5)
                try:
                    (length,) = struct.unpack("!H", conn.recv(2, socket.MSG_WAITALL))
                    data = conn.recv(length, socket.MSG_WAITALL)
                except (OSError, struct.error):
                    continue
                self.over_tcp += 1
                reply = self._reply(data)
                conn.sendall(struct.pack("!H", len(reply)) + reply)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self.sock.close()
        self.tcp.close()


def _qname(message: bytes) -> tuple[str, int]:
    offset, labels = 12, []
    while message[offset]:
        length = message[offset]
        labels.append(message[offset + 1 : offset + 1 + length].decode())
        offset += 1 + length
    return ".".join(labels), offset + 5


def _query(name: str) -> bytes:
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00" + struct.pack("!HH", 1, 1)
    return struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + question


def resolve(netns: str, server: str, name: str, *, tcp: bool = False) -> tuple[int, list[str]]:
    """(rcode, A addresses) of a query for ``name`` sent from the namespace to ``server``:53 (UDP or TCP)."""
    kind = socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM
    sock = in_netns(netns, lambda: socket.socket(socket.AF_INET, kind))
    sock.settimeout(5)
    try:
        if tcp:
            sock.connect((server, 53))
            sock.sendall(struct.pack("!H", len(_query(name))) + _query(name))
            (length,) = struct.unpack("!H", sock.recv(2, socket.MSG_WAITALL))
            data = sock.recv(length, socket.MSG_WAITALL)
        else:
            sock.sendto(_query(name), (server, 53))
            data = sock.recv(2048)
    finally:
        sock.close()
    rcode = data[3] & 0x0F
    ancount = struct.unpack_from("!H", data, 6)[0]
    _, offset = _qname(data)
    found = []
    for _ in range(ancount):
        offset += 2  # a compressed name (the answers here all point at the question)
        rtype, _, _, length = struct.unpack_from("!HHIH", data, offset)
        offset += 10
        if rtype == 1:
            found.append(str(ipaddress.IPv4Address(data[offset : offset + 4])))
        offset += length
    return rcode, found


def _host_addresses() -> list[str]:
    out = []
    for item in json.loads(run("ip", "-j", "-4", "addr", "show")):
        for a in item.get("addr_info", []):
            if not str(a.get("local", "")).startswith("127."):
                out.append(str(a["local"]))
    return out


@pytest.fixture
def internet(namespaces: Namespaces, host_ipv4_forwarding: None) -> Iterator[str]:
    """The "internet" namespace, its veth to the host and the host's route to 203.0.113.0/24 (all removed)."""
    inet = namespaces.add("inet")
    name = inet.rsplit("/", 1)[1]
    host_end = f"vzt{namespaces.tag}h"
    run("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", name)
    try:
        run("ip", "addr", "add", "198.51.100.1/30", "dev", host_end)
        run("ip", "link", "set", host_end, "up")
        batch = "link set eth0 up\naddr add 198.51.100.2/30 dev eth0\nroute add default via 198.51.100.1\n"
        batch += "".join(f"addr add {a}/32 dev lo\n" for a in (PUBLIC, LISTED_CIDR, BY_NAME, OTHER, CDN))
        run("ip", "-n", name, "-batch", "-", stdin=batch)
        run("ip", "route", "add", "203.0.113.0/24", "via", "198.51.100.2", "dev", host_end)
        yield inet
    finally:
        with contextlib.suppress(RuntimeError):
            run("ip", "link", "del", host_end)  # the route goes with it


def _ip_forward(value: str | None = None) -> str:
    path = Path("/proc/sys/net/ipv4/ip_forward")
    if value is not None:
        path.write_text(value)
    return path.read_text().strip()


def _rules(table: str) -> str:
    """The host table without the host's networks (other work on the host may add networks meanwhile)."""
    text = run("nft", "list", "table", "inet", table)
    return re.sub(r"set (connected|gateways|direct_out) \{.*?\n\t\}", "", text, flags=re.S)


async def _within(seconds: float, condition: Callable[[], bool]) -> float:
    """Seconds until ``condition()`` held (polled), or a bit more than ``seconds`` when it never did."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > seconds:
            break
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def _reach(netns: str, address: str, port: int = 80) -> bool:
    # Refusals are resets from the domain or silent drops on the host: the listeners' counts say what arrived.
    return attempt(netns, address, port, "tcp", timeout=0.7)


def _host_listener() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))
    sock.listen(16)
    sock.setblocking(False)
    return sock


def _accepted(sock: socket.socket) -> int:
    got = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return got
        conn.close()
        got += 1


async def test_host_egress_allowed_offline_allowlist_and_denials(
    namespaces: Namespaces, env_ids: list[str], internet: str
) -> None:
    upstream = Upstream()
    listeners: dict[str, Listener] = {}
    host = NetworkHost(upstreams=[("127.0.0.1", upstream.port)], min_ttl=1, max_ttl=TTL)
    wildcard = _host_listener()
    wildcard_port = int(wildcard.getsockname()[1])
    plans: list[dict[str, Any]] = []
    netns: dict[str, str] = {}
    try:
        for env_id, definition, label in zip(env_ids, (ALPHA, BETA), "ab", strict=True):
            plan = compile_topology(parse_definition(definition), env_id).to_json()
            await ensure_domain(plan)  # what `vz up` does: no uplink of its own
            for m in plan["machines"]:
                netns[m["name"]] = namespaces.add(f"{label}-{m['name']}")
                await attach_machine(plan, m["name"], netns[m["name"]])
            plans.append(plan)
        uplinks = [await ensure_egress(plan) for plan in plans]
        assert all(u is not None for u in uplinks)
        ups = [u for u in uplinks if u is not None]
        assert ups[0].network != ups[1].network and not ups[0].network.overlaps(ups[1].network)
        # The allocation is kept: converging again picks the same /30 and changes nothing on the host.
        before = _rules(host_table(env_ids[0]))
        assert await ensure_egress(plans[0]) == ups[0]
        assert _rules(host_table(env_ids[0])) == before
        for plan in plans:
            await host.ensure(plan)
        alpha_dns = plans[0]["machines"][0]["dns_server"]
        for address in (PUBLIC, LISTED_CIDR, BY_NAME, OTHER, CDN, CONNECTED):
            listeners[address] = listen(internet, "inet", address, 80, "tcp")
        peer_address = plans[1]["machines"][0]["attachments"][0]["address"]
        listeners["peer"] = listen(netns["peer"], "peer", peer_address, 80, "tcp")

        def check(machine: str, address: str, want: bool, key: str | None = None) -> None:
            ok = _reach(netns[machine], address)
            got = {a: lst.drain() for a, lst in listeners.items()}
            assert ok == want, f"{machine} -> {address}: {'reached' if ok else 'refused'}"
            assert got == {a: int(want and a == (key or address)) for a in listeners}, (machine, address, got)

        # Before any name was resolved: allowed reaches the public destinations, the allowlist its CIDR only.
        for address in (PUBLIC, LISTED_CIDR, BY_NAME, OTHER, CDN):
            check("app", address, True)
            check("lst", address, address == LISTED_CIDR)
            check("off", address, False)
        check("peer", PUBLIC, True)
        # Never the host's directly connected network, the other Environment, the host itself.
        for machine in ("app", "lst", "off", "peer"):
            check(machine, CONNECTED, False)
        check("app", peer_address, False, "peer")  # the same subnet in the other Environment: not the same
        for address in [*_host_addresses(), *(str(u.upstream_address) for u in ups), str(ups[1].domain_address)]:
            for machine in ("app", "lst", "peer"):
                assert not _reach(netns[machine], address, wildcard_port), f"{machine} reached the host at {address}"
        assert _accepted(wildcard) == 0

        # DNS beyond the Environment: forwarded for allowed and for allowlisted names only.
        assert await asyncio.to_thread(resolve, netns["app"], alpha_dns, "public.example.org") == (0, [PUBLIC])
        assert await asyncio.to_thread(resolve, netns["off"], alpha_dns, "public.example.org") == (5, [])
        # Over TCP too (forwarded over TCP: the upstream counts it).
        assert await asyncio.to_thread(resolve, netns["app"], alpha_dns, "public.example.org", tcp=True) == (
            0,
            [PUBLIC],
        )
        assert upstream.over_tcp == 1
        assert await asyncio.to_thread(resolve, netns["off"], alpha_dns, "public.example.org", tcp=True) == (5, [])
        asked = dict(upstream.asked)
        assert await asyncio.to_thread(resolve, netns["lst"], alpha_dns, "other.example.com") == (5, [])
        assert await asyncio.to_thread(resolve, netns["lst"], alpha_dns, "example.com") == (
            5,
            [],
        )  # "*." is below the name, not it
        assert upstream.asked == asked  # refused without asking anyone
        check("lst", BY_NAME, False)
        assert await asyncio.to_thread(resolve, netns["lst"], alpha_dns, "api.example.com") == (0, [BY_NAME])
        assert await asyncio.to_thread(resolve, netns["lst"], alpha_dns, "img.cdn.example.net") == (0, [CDN])
        check("lst", BY_NAME, True)
        check("lst", CDN, True)
        check("lst", OTHER, False)
        check("off", BY_NAME, False)  # the entry is the allowlist Machine's, nobody else's
        # A `vz up` meanwhile (the domain's table replaced) keeps what the resolver admitted.
        await ensure_domain(plans[0])
        check("lst", BY_NAME, True)
        deadline = time.monotonic() + TTL + 3
        while time.monotonic() < deadline and _reach(netns["lst"], BY_NAME):
            listeners[BY_NAME].drain()
            await asyncio.sleep(0.5)
        check("lst", BY_NAME, False)  # expired: refused again until resolved again
        assert await asyncio.to_thread(resolve, netns["lst"], alpha_dns, "api.example.com") == (0, [BY_NAME])
        check("lst", BY_NAME, True)

        # Even with the domain's own table accepting everything, the host table holds.
        domain = f"/run/netns/{plans[0]['route_domain']}"
        run("nsenter", f"--net={domain}", "--", "nft", "insert", "rule", "inet", "vz", "forward", "accept")
        check("off", PUBLIC, True)  # the domain now lets anything out (the host's forwarding is not the filter)
        check("off", CONNECTED, False)
        for address in [*_host_addresses(), *(str(u.upstream_address) for u in ups), str(ups[1].domain_address)]:
            assert not _reach(netns["off"], address, wildcard_port), f"off reached the host at {address}"
        assert _accepted(wildcard) == 0
    finally:
        await host.close()
        upstream.close()
        wildcard.close()
        for listener in listeners.values():
            listener.sock.close()
        for env_id in env_ids:
            await remove_domain(env_id)
    links = run("ip", "-o", "link")
    tables = run("nft", "list", "tables")
    for env_id in env_ids:
        assert uplink_name(env_id) not in links
        assert host_table(env_id) not in tables


async def test_allocation_avoids_host_routes_and_leftovers_converge(
    namespaces: Namespaces, env_ids: list[str], internet: str
) -> None:
    plan = compile_topology(parse_definition(BETA), env_ids[0]).to_json()
    offline = compile_topology(parse_definition({**BETA, "machines": [{"name": "peer", **M}]}), env_ids[0]).to_json()
    leftover = host_table(env_ids[1])
    try:
        await ensure_domain(plan)
        await attach_machine(plan, "peer", namespaces.add("peer"))
        # A host that does not forward IPv4 is refused naming the sysctl; vz changes neither it nor anything else.
        _ip_forward("0")
        try:
            with pytest.raises(FailedPreconditionError, match=r"net\.ipv4\.ip_forward"):
                await ensure_egress(plan)
            assert _ip_forward() == "0"
        finally:
            _ip_forward("1")
        assert uplink_name(env_ids[0]) not in run("ip", "-o", "link")
        assert host_table(env_ids[0]) not in run("nft", "list", "tables")
        with pytest.raises(InvalidArgumentError, match="VZ_NETWORK_UPLINK_POOL"):
            await ensure_egress(plan, pool="10.254.0.0/31")
        # 198.51.100.0/30 is the internet veth's (a host route): the next /30 of the pool is taken instead.
        uplink = await ensure_egress(plan, pool="198.51.100.0/29")
        assert uplink is not None and str(uplink.network) == "198.51.100.4/30"
        # Every /30 of this pool overlaps a host route: refused naming what to change, the uplink untouched.
        with pytest.raises(UnavailableError, match="VZ_NETWORK_UPLINK_POOL"):
            await ensure_egress(plan, pool="198.51.100.0/30")
        assert "198.51.100.5/30" in run("ip", "-o", "-4", "addr", "show", "dev", uplink_name(env_ids[0]))
        # A host table whose Environment's domain is gone (a killed removal) is swept by the next convergence.
        run("nft", "add", "table", "inet", leftover)
        assert await ensure_egress(plan, pool="198.51.100.0/29") == uplink
        assert leftover not in run("nft", "list", "tables")
        # Every Machine offline: no uplink, no host table.
        assert await ensure_egress(offline) is None
        assert uplink_name(env_ids[0]) not in run("ip", "-o", "link")
        assert host_table(env_ids[0]) not in run("nft", "list", "tables")
        await ensure_egress(plan, pool="198.51.100.0/29")
    finally:
        await remove_domain(env_ids[0])
        with contextlib.suppress(RuntimeError):
            run("nft", "delete", "table", "inet", leftover)
    # remove_domain removed the host half with the domain; a host table left alone goes on the next removal too.
    assert host_table(env_ids[0]) not in run("nft", "list", "tables")
    run("nft", "add", "table", "inet", host_table(env_ids[0]))
    assert await remove_domain(env_ids[0]) is False
    assert host_table(env_ids[0]) not in run("nft", "list", "tables")


LAN_NETS = ("198.51.100.8/30", "198.51.100.12/30")  # networks the host joins during the test


def _join(namespaces: Namespaces, index: int) -> tuple[str, str, str, str]:
    """A namespace joined to the host by a new veth: the host gets 198.51.100.(8+4i)+1/30 (a directly connected
    network), the namespace .2 of it and 198.51.100.(200+i)/32 behind it, routed by the host through it (a
    gateway). (namespace, host end, connected address, routed address)."""
    base = ipaddress.IPv4Network(LAN_NETS[index])
    host_addr, peer = str(base.network_address + 1), str(base.network_address + 2)
    routed = f"198.51.100.{200 + index}"
    lan = namespaces.add(f"lan{index}")
    host_end = f"vzt{namespaces.tag}n{index}"
    run("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", lan.rsplit("/", 1)[1])
    batch = f"link set eth0 up\naddr add {peer}/30 dev eth0\nroute add default via {host_addr}\n"
    run("ip", "-n", lan.rsplit("/", 1)[1], "-batch", "-", stdin=batch + f"addr add {routed}/32 dev lo\n")
    run("ip", "addr", "add", f"{host_addr}/30", "dev", host_end)
    run("ip", "link", "set", host_end, "up")
    run("ip", "route", "add", f"{routed}/32", "via", peer, "dev", host_end)
    return lan, host_end, peer, routed


def _netlink_sockets() -> set[str]:
    """Inodes of this process's NETLINK_ROUTE sockets subscribed to multicast groups (the watcher's kind)."""
    mine = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = Path(fd).readlink().as_posix()
            if target.startswith("socket:["):
                mine.add(target[8:-1])
    subscribed = set()
    for line in Path("/proc/net/netlink").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == "0" and int(fields[3], 16) != 0 and fields[-1] in mine:
            subscribed.add(fields[-1])
    return subscribed


def _children() -> list[str]:
    return [c for t in Path("/proc/self/task").iterdir() for c in (t / "children").read_text().split()]


async def test_host_networks_followed_live(namespaces: Namespaces, env_ids: list[str], internet: str) -> None:
    """A network the host joins after the host table was written is never reached by an allowed Machine: the
    kernel's route decides it at once (no gateway on the route), and the watcher lists it within a second;
    what the host routes through a gateway there is reachable once the watcher listed that gateway."""
    plan = compile_topology(parse_definition(BETA), env_ids[0]).to_json()
    table = host_table(env_ids[0])
    host = NetworkHost(upstreams=[("127.0.0.1", 9)])
    listeners: list[Listener] = []
    before = _netlink_sockets()
    host_ends = [f"vzt{namespaces.tag}n{i}" for i in range(len(LAN_NETS))]
    try:
        await ensure_domain(plan)
        peer = namespaces.add("peer")
        await attach_machine(plan, "peer", peer)
        assert await ensure_egress(plan) is not None  # the table is written now; no watcher runs yet
        public = listen(internet, "inet", PUBLIC, 80, "tcp")
        listeners.append(public)
        assert _reach(peer, PUBLIC) and public.drain() == 1  # egress works through the host's routes

        # Joined with no watcher running: the lists do not have the new network or its gateway...
        lan, _, connected, routed = _join(namespaces, 0)
        near, far = listen(lan, "lan0", connected, 80, "tcp"), listen(lan, "lan0", routed, 80, "tcp")
        listeners += [near, far]
        assert not listed(table, "connected", connected) and not listed(table, "gateways", connected)
        # ...yet the connected address is refused (the route has no gateway) and so is what is routed through
        # the unknown gateway (refusing too much, never too little, until the lists are current).
        assert not _reach(peer, connected) and near.drain() == 0
        assert not _reach(peer, routed) and far.drain() == 0

        # The watcher (started by the first ensure) lists both; then the routed address is reachable.
        await host.ensure(plan)
        assert host.watcher is not None and len(_netlink_sockets() - before) == 1
        await _within(1.5, lambda: listed(table, "gateways", connected))
        assert listed(table, "connected", connected) and listed(table, "gateways", connected)
        assert _reach(peer, routed) and far.drain() == 1
        assert not _reach(peer, connected) and near.drain() == 0

        # Live: a network joined while the watcher runs is listed within a second, and unlisted when it goes.
        lan, host_end, connected, routed = _join(namespaces, 1)
        took = await _within(3, lambda: listed(table, "connected", connected))
        assert listed(table, "connected", connected), "the new network was not listed"
        assert took < 1.0, f"listed {took:.2f} s after the host joined it"
        assert await _within(1.0, lambda: listed(table, "gateways", connected)) < 1.0
        near, far = listen(lan, "lan1", connected, 80, "tcp"), listen(lan, "lan1", routed, 80, "tcp")
        listeners += [near, far]
        assert not _reach(peer, connected) and near.drain() == 0
        assert _reach(peer, routed) and far.drain() == 1
        # The domain's own table made to accept everything: the host table still refuses the new network.
        domain = f"/run/netns/{plan['route_domain']}"
        run("nsenter", f"--net={domain}", "--", "nft", "insert", "rule", "inet", "vz", "forward", "accept")
        assert not _reach(peer, connected) and near.drain() == 0
        run("ip", "link", "del", host_end)
        took = await _within(3, lambda: not listed(table, "connected", connected))
        assert not listed(table, "connected", connected) and not listed(table, "gateways", connected)
        assert took < 1.0, f"unlisted {took:.2f} s after the host left it"
        assert host.watcher.refreshes >= 2
    finally:
        await host.close()
        for listener in listeners:
            listener.sock.close()
        await remove_domain(env_ids[0])
        links = run("ip", "-o", "link")
        for end in host_ends:
            if f" {end}@" in links or f" {end}:" in links:
                run("ip", "link", "del", end)  # its routes go with it
    # The watcher is gone with the NetworkHost: its socket closed, no process of it left.
    assert host.watcher is None and _netlink_sockets() == before
    assert _children() == []


def test_host_table_text() -> None:
    uplink = Uplink.of("/proc/1/ns/net", "10.254.7.0/30")
    env_id = "env_0123456789ab"
    text = host_egress_ruleset(
        env_id,
        uplink,
        [ipaddress.IPv4Network("192.0.2.0/24"), ipaddress.IPv4Network("192.0.2.0/25")],
        ipaddress.IPv4Network("10.254.0.0/16"),
    )
    assert text.startswith(f"table inet {host_table(env_id)} {{")
    never = re.search(r"set never \{.*?elements = \{ (.*?) \}", text, re.S)
    assert never is not None and "10.254.0.0/16" in never.group(1) and "169.254.0.0/16" in never.group(1)
    assert "elements = { 192.0.2.0/24 }" in text  # collapsed: an interval set refuses overlapping elements
    dev = uplink_name(env_id)
    for rule in (
        f'iifname "{dev}" drop',
        f'iifname "{dev}" ip saddr != 10.254.7.2 drop',
        f'iifname "{dev}" oifname "vzu*" drop',
        f'oifname "{dev}" ct state established,related accept',
        'ip saddr 10.254.7.2 oifname != "vzu*" masquerade',
    ):
        assert rule in text, rule
    # A bare list of networks: a host with no gateway, so the next-hop rule lets nothing out.
    assert re.search(r"set gateways \{\n    type ipv4_addr\n  \}", text)
    for rule in (
        f'iifname "{dev}" ip daddr @gateways drop',
        f'iifname "{dev}" oifname != @direct_out rt ip nexthop != @gateways drop',
        f'iifname "{dev}" ip daddr @connected drop',
    ):
        assert rule in text, rule


def test_host_networks_text() -> None:
    facts = HostNetworks.of(
        [ipaddress.IPv4Network("192.0.2.0/25"), ipaddress.IPv4Network("192.0.2.128/25")],
        [ipaddress.IPv4Address("192.0.2.1"), ipaddress.IPv4Address("192.0.2.1"), ipaddress.IPv4Address("10.0.0.1")],
        ["ppp0", 'wg"0', "a" * 16, "ppp0"],
    )
    # Collapsed, deduplicated, sorted; a device name that could not be written in nft text is left out.
    assert facts == HostNetworks(
        (ipaddress.IPv4Network("192.0.2.0/24"),),
        (ipaddress.IPv4Address("10.0.0.1"), ipaddress.IPv4Address("192.0.2.1")),
        ("ppp0",),
    )
    text = host_egress_ruleset("env_0123456789ab", Uplink.of("/proc/1/ns/net", "10.254.7.0/30"), facts)
    assert "elements = { 10.0.0.1, 192.0.2.1 }" in text and 'elements = { "ppp0" }' in text
    assert host_networks_script(["vz_a", "vz_b"], facts).splitlines() == [
        *(
            line
            for t in ("vz_a", "vz_b")
            for line in (
                f"flush set inet {t} connected",
                f"add element inet {t} connected {{ 192.0.2.0/24 }}",
                f"flush set inet {t} gateways",
                f"add element inet {t} gateways {{ 10.0.0.1, 192.0.2.1 }}",
                f"flush set inet {t} direct_out",
                f'add element inet {t} direct_out {{ "ppp0" }}',
            )
        )
    ]
    # An empty set is flushed and nothing added; `only` limits the script to one set (a table of an earlier vz).
    assert host_networks_script(["vz_a"], HostNetworks(), only="connected") == "flush set inet vz_a connected\n"


async def test_environments_coming_up_together_get_distinct_uplinks(
    namespaces: Namespaces, env_ids: list[str], internet: str
) -> None:
    """The uplink's route domain is realized outside the allocation lock (N Environments coming up together do
    not wait for each other's ip and nft runs); a reservation keeps the /30 being realized from a concurrent
    allocation. A pool of two /30s: two Environments allocating at once get one each."""
    plans = [compile_topology(parse_definition(BETA), env_id).to_json() for env_id in env_ids]
    try:
        for plan in plans:
            await ensure_domain(plan)
        uplinks = await asyncio.gather(*(ensure_egress(plan, pool="198.51.100.248/29") for plan in plans))
        networks = sorted(str(u.network) for u in uplinks if u is not None)
        assert networks == ["198.51.100.248/30", "198.51.100.252/30"]
        for env_id, uplink in zip(env_ids, uplinks, strict=True):
            assert uplink is not None
            shown = run("ip", "-o", "-4", "addr", "show", "dev", uplink_name(env_id))
            assert str(uplink.upstream_address) in shown, shown
            assert host_table(env_id) in run("nft", "list", "tables")
    finally:
        for env_id in env_ids:
            await remove_domain(env_id)
