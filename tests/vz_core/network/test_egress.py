"""Egress through a route domain's uplink, for real: offline, allowed and an allowlist, per Machine.

The uplink's upstream is a namespace the test creates (standing in for the host), holding "internet"
destinations on its loopback: a public address, an allowlisted private one, another private one, the upstream
address itself (the host) and the metadata address. Two Environments of one project use the same upstream with
their own uplinks: each masquerades behind its own address. Every destination counts what reaches it.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from netns_kit import Listener, Namespaces, attempt, in_netns, listen, run

from vz_core.env._definition import parse_definition
from vz_core.env._topology import compile_topology
from vz_core.network import Uplink, attach_machine, ensure_domain, remove_domain, uplink_name

pytestmark = [pytest.mark.root]

M = {"profile": "developer", "driver": "fake", "image": "vz:default"}
DEFINITION = {
    "version": 2,
    "project_id": "shop",
    "machines": [
        {"name": "app", **M, "egress": "allowed"},
        {"name": "db", **M, "egress": {"allow": ["10.200.0.0/16", "10.200.1.0/24", "example.com"]}},
        {"name": "cache", **M},
    ],
}
PUBLIC, LISTED, PRIVATE, METADATA = "198.51.100.7", "10.200.0.7", "172.31.0.7", "169.254.169.254"


def _expected(machine: str, destination: str) -> bool:
    """From the declarations: allowed = public destinations only; the allowlist = its CIDRs; offline = none."""
    if machine == "app":
        return destination == PUBLIC
    if machine == "db":
        return destination == LISTED
    return False


def _peer_of(netns: str, address: str, port: int) -> str | None:
    sock = in_netns(netns, socket.socket)
    sock.settimeout(2)
    try:
        sock.connect((address, port))
        return sock.recv(64).decode()
    except OSError:
        return None
    finally:
        sock.close()


async def test_each_machine_reaches_exactly_what_its_egress_allows(namespaces: Namespaces, env_ids: list[str]) -> None:
    upstream = namespaces.add("up")
    uplinks = [Uplink.of(upstream, "10.255.254.0/30"), Uplink.of(upstream, "10.255.254.4/30")]
    destinations = [PUBLIC, LISTED, PRIVATE, METADATA]
    for address in destinations:
        run("nsenter", f"--net={upstream}", "--", "ip", "addr", "add", f"{address}/32", "dev", "lo")
    envs: list[tuple[Any, dict[str, str]]] = []
    listeners: dict[str, Listener] = {}
    try:
        for env_id, uplink, label in zip(env_ids, uplinks, "ab", strict=True):
            plan = compile_topology(parse_definition(DEFINITION), env_id)
            await ensure_domain(plan.to_json(), uplink=uplink)
            netns = {}
            for m in plan.machines:
                netns[m.name] = namespaces.add(f"{label}-{m.name}")
                await attach_machine(plan.to_json(), m.name, netns[m.name])
            envs.append((plan, netns))
        for address in [*destinations, *(str(u.upstream_address) for u in uplinks)]:
            listeners[address] = listen(upstream, "up", address, 80, "tcp")
        for plan, netns in envs:
            for machine in ("app", "db", "cache"):
                for address in listeners:
                    ok = await asyncio.to_thread(attempt, netns[machine], address, 80, "tcp", timeout=1.5)
                    got = {a: lst.drain() for a, lst in listeners.items()}
                    want = _expected(machine, address)
                    assert ok == want, f"{plan.environment_id} {machine} -> {address}: {'reached' if ok else 'refused'}"
                    assert got == {a: int(want and a == address) for a in listeners}, (machine, address, got)
        # The upstream sees each Environment behind its own uplink address, never a Machine's address.
        for (_, netns), uplink in zip(envs, uplinks, strict=True):
            server = await _reply_with_peer(upstream, PUBLIC, 8080)
            try:
                peer = await asyncio.to_thread(_peer_of, netns["app"], PUBLIC, 8080)
            finally:
                server.close()
                await server.wait_closed()
            assert peer == str(uplink.domain_address)
        # Converging twice changes nothing; with uplink=None, the link goes (both ends) and nothing leaves.
        plan, netns = envs[0]
        before = run("nsenter", f"--net=/run/netns/{plan.route_domain}", "--", "nft", "list", "ruleset")
        await ensure_domain(plan.to_json(), uplink=uplinks[0])
        assert run("nsenter", f"--net=/run/netns/{plan.route_domain}", "--", "nft", "list", "ruleset") == before
        await ensure_domain(plan.to_json())  # the default keeps the uplink (`vz up` does not own it)
        assert uplink_name(plan.environment_id) in run("nsenter", f"--net={upstream}", "--", "ip", "-o", "link")
        await ensure_domain(plan.to_json(), uplink=None)
        assert uplink_name(plan.environment_id) not in run("nsenter", f"--net={upstream}", "--", "ip", "-o", "link")
        assert not await asyncio.to_thread(attempt, netns["app"], PUBLIC, 80, "tcp", timeout=1.5)
        assert listeners[PUBLIC].drain() == 0
    finally:
        for listener in listeners.values():
            listener.sock.close()
        for env_id in env_ids:
            await remove_domain(env_id)
    links = run("nsenter", f"--net={upstream}", "--", "ip", "-o", "link")
    assert all(uplink_name(e) not in links for e in env_ids)  # removal took the upstream ends too


async def _reply_with_peer(netns: str, address: str, port: int) -> asyncio.Server:
    def make() -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(8)
        sock.setblocking(False)
        return sock

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(writer.get_extra_info("peername")[0].encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, sock=await asyncio.to_thread(in_netns, netns, make))
