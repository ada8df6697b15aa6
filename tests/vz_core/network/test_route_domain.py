"""Route domains for real: two Environments of two projects with overlapping ranges and declarations.

Machines are plain test namespaces attached through ``attach_machine``. Every source Machine tries every
destination listener of both Environments (declared services, an undeclared port, both networks of a
two-network Machine, the domain's import relay address); the expectation comes from the declarations alone
(not from the plan): a cell connects only when its Environment declares the path. Every listener counts what
reaches it, and an nft counter in each destination namespace counts the SYNs / datagrams that arrived, so a
refused cell is proven never to reach its destination.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from netns_kit import Listener, Namespaces, attempt, in_netns, listen, run

from vz_core.env._definition import ProjectDefinition, parse_definition
from vz_core.env._topology import TopologyPlan, compile_topology
from vz_core.errors import FailedPreconditionError
from vz_core.network import attach_machine, detach_machine, domain_exists, ensure_domain, list_domains, remove_domain

pytestmark = [pytest.mark.root]

UNDECLARED = 9999


def _m(name: str, *services: tuple[str, int, str]) -> dict[str, Any]:
    return {
        "name": name,
        "profile": "developer",
        "driver": "fake",
        "image": "vz:default",
        "services": [{"name": n, "port": p, "protocol": proto} for n, p, proto in services],
    }


SHOP = {
    "version": 2,
    "project_id": "shop",
    "machines": [
        _m("app", ("http", 8080, "tcp")),
        _m("db", ("pg", 5432, "tcp"), ("stats", 8125, "udp")),
        _m("cache", ("redis", 6379, "tcp")),
    ],
    "networks": [
        {"name": "front", "machines": ["app", "db", "cache"]},
        {"name": "back", "machines": ["db", "cache"], "subnet": "10.89.7.0/24"},
    ],
    "paths": [
        {"from": "app", "to": "db", "service": "pg"},
        {"from": "app", "to": "db", "port": 8125, "protocol": "udp"},
        {"from": "app", "to": "cache", "service": "redis"},
        {"from": "db", "to": "cache", "service": "redis"},
    ],
    "imports": [{"machine": "app", "host_port": 11434}],
}
BLOG = {
    "version": 2,
    "project_id": "blog",
    "machines": [_m("app", ("http", 8080, "tcp")), _m("db", ("pg", 5432, "tcp")), _m("worker", ("jobs", 7000, "tcp"))],
    "networks": [{"name": "front", "machines": ["app", "db", "worker"]}],
    "paths": [{"from": "worker", "to": "db", "service": "pg"}, {"from": "app", "to": "worker", "service": "jobs"}],
}


@dataclass
class Env:
    definition: ProjectDefinition
    plan: TopologyPlan
    netns: dict[str, str]  # Machine name -> namespace path

    @property
    def json(self) -> dict[str, Any]:
        return self.plan.to_json()


async def _build(spaces: Namespaces, env_id: str, data: dict[str, Any], label: str) -> Env:
    definition = parse_definition(data)
    plan = compile_topology(definition, env_id)
    await ensure_domain(plan.to_json())
    netns = {}
    for m in definition.machines:
        netns[m.name] = spaces.add(f"{label}-{m.name}")
        await attach_machine(plan.to_json(), m.name, netns[m.name])
    return Env(definition, plan, netns)


def _declared(definition: ProjectDefinition, source: str, dest: str, protocol: str, port: int, network: str) -> bool:
    """The expectation, from the vz.json declarations only (a Machine reaches its own addresses locally)."""
    if source == dest:
        return True
    members = {n.name: set(n.machines) for n in definition.effective_networks()}
    if source not in members[network] or dest not in members[network]:
        return False
    for path in definition.paths:
        if path.source != source or path.to != dest:
            continue
        svc = definition.machine(dest).service(path.service) if path.service else None
        want = (svc.protocol, svc.port) if svc else (path.protocol or "tcp", path.port)
        if want == (protocol, port):
            return True
    return False


def _syn_counters(netns: str, targets: Sequence[tuple[str, str, int]]) -> None:
    """An nft table in a destination namespace counting the SYNs / datagrams that arrive per address and port."""
    lines = ["table inet vztest {"]
    for i, _ in enumerate(targets):
        lines.append(f"  counter c{i} {{ }}")
    lines.append("  chain input {\n    type filter hook input priority -300; policy accept;")
    for i, (address, proto, port) in enumerate(targets):
        match = "tcp flags & (syn | ack) == syn" if proto == "tcp" else ""
        lines.append(f'    ip daddr {address} {proto} dport {port} {match} counter name "c{i}"')
    lines.append("  }\n}\n")
    run("nsenter", f"--net={netns}", "--", "nft", "-f", "-", stdin="\n".join(lines))


def _read_counters(netns: str) -> dict[str, int]:
    data = json.loads(
        run("nsenter", f"--net={netns}", "--", "nft", "-j", "list", "counters", "table", "inet", "vztest")
    )
    return {c["counter"]["name"]: c["counter"]["packets"] for c in data["nftables"] if "counter" in c}


async def test_only_declared_paths_connect_across_two_overlapping_environments(
    namespaces: Namespaces, env_ids: list[str]
) -> None:
    shop = await _build(namespaces, env_ids[0], SHOP, "a")
    blog = await _build(namespaces, env_ids[1], BLOG, "b")
    envs = {"shop": shop, "blog": blog}

    # The two Environments really overlap: same network range, same addresses for app and db.
    front = {e: {n.name: n.subnet for n in envs[e].plan.networks}["front"] for e in envs}
    assert front["shop"] == front["blog"]
    for name in ("app", "db"):
        assert shop.plan.machine(name).attachments[0].address == blog.plan.machine(name).attachments[0].address

    # Listeners: every service of every Machine on every attachment, plus an undeclared port; the shop's
    # import relay address (a stand-in for the relay the daemon will run in the domain).
    listeners: list[tuple[str, str, str, Listener]] = []  # (env, owner machine or "domain", network, listener)
    for env_name, env in envs.items():
        for m in env.definition.machines:
            ports = [(s.protocol, s.port) for s in m.services] + [("tcp", UNDECLARED)]
            targets = []
            for att in env.plan.machine(m.name).attachments:
                for proto, port in ports:
                    listener = listen(env.netns[m.name], m.name, att.address, port, proto)
                    listeners.append((env_name, m.name, att.network, listener))
                    targets.append((att.address, proto, port))
            _syn_counters(env.netns[m.name], targets)

    def label(env: str, owner: str, lst: Listener) -> str:
        return f"{env}/{owner} {lst.address}:{lst.port}/{lst.protocol}"

    relay = shop.plan.imports[0]
    relay_netns = f"/run/netns/{shop.plan.route_domain}"
    relay_listener = listen(relay_netns, "domain", relay.relay_addresses[0], relay.port, relay.protocol)
    try:
        cells = 0
        outcomes = {"path": 0, "self": 0, "refused": 0}
        for src_env_name, src_env in envs.items():
            for source in src_env.definition.machines:
                for env_name, owner, network, listener in listeners:
                    ok = await asyncio.to_thread(
                        attempt, src_env.netns[source.name], listener.address, listener.port, listener.protocol
                    )
                    if listener.protocol == "udp":
                        await asyncio.sleep(0.05)
                    arrived = {label(e, o, lst): lst.drain() for e, o, _, lst in listeners}
                    relay_got = relay_listener.drain()
                    expected = (
                        _declared(src_env.definition, source.name, owner, listener.protocol, listener.port, network)
                        if src_env_name == env_name
                        else False
                    )
                    cell = f"{src_env_name}/{source.name} -> {env_name}/{owner} {listener.address}:{listener.port}"
                    # The other Environment's Machine with the same address is never the one reached.
                    want = dict.fromkeys(arrived, 0)
                    if src_env_name != env_name:
                        twin = next(
                            (
                                lst
                                for e, o, n, lst in listeners
                                if e == src_env_name
                                and (lst.address, lst.port, lst.protocol)
                                == (listener.address, listener.port, listener.protocol)
                            ),
                            None,
                        )
                        if twin is not None:
                            _, twin_owner, twin_net, _ = next(x for x in listeners if x[3] is twin)
                            if _declared(
                                src_env.definition, source.name, twin_owner, twin.protocol, twin.port, twin_net
                            ):
                                want[label(src_env_name, twin_owner, twin)] = 1
                    elif expected:
                        want[label(env_name, owner, listener)] = 1
                    reached = [k for k, v in want.items() if v]
                    if not reached:
                        outcomes["refused"] += 1
                    else:
                        outcomes["self" if reached[0].startswith(f"{src_env_name}/{source.name} ") else "path"] += 1
                    diff = {k: (arrived[k], want[k]) for k in arrived if arrived[k] != want[k]}
                    assert not diff, f"{cell}: (arrived, expected) {diff}"
                    assert relay_got == 0, f"{cell} reached the import relay"
                    if listener.protocol == "tcp":
                        assert ok == any(want.values()), f"{cell}: connect {'succeeded' if ok else 'failed'}"
                    cells += 1
                # The import relay: only the importing Machine of the shop reaches it.
                ok = await asyncio.to_thread(
                    attempt, src_env.netns[source.name], relay_listener.address, relay.port, relay.protocol
                )
                got = relay_listener.drain()
                allowed = src_env_name == "shop" and source.name == relay.machine
                assert (ok, got) == (allowed, int(allowed)), f"{src_env_name}/{source.name} -> import relay"
                assert all(lst.drain() == 0 for _, _, _, lst in listeners)
        assert cells == 6 * len(listeners)

        # Kernel-side proof: the SYNs / datagrams that arrived at each destination are exactly the accepted ones.
        for env_name, env in envs.items():
            for m in env.definition.machines:
                counters = _read_counters(env.netns[m.name])
                mine = [lst for e, o, _, lst in listeners if e == env_name and o == m.name]
                assert [counters[f"c{i}"] for i in range(len(mine))] == [lst.count for lst in mine], (
                    f"{env_name}/{m.name}: packets arrived that no listener accepted"
                )
        assert sum(lst.count for _, _, _, lst in listeners) == outcomes["path"] + outcomes["self"]
        # The matrix exercises both outcomes between different Machines: declared paths and refusals.
        assert outcomes["path"] >= 7 and outcomes["refused"] >= 60, outcomes
    finally:
        relay_listener.sock.close()
        for *_, lst in listeners:
            lst.sock.close()
        for env_id in env_ids:
            await remove_domain(env_id)


async def test_a_machine_cannot_borrow_another_machines_address(namespaces: Namespaces, env_ids: list[str]) -> None:
    shop = await _build(namespaces, env_ids[0], SHOP, "a")
    db = shop.plan.machine("db").attachments[0]
    app = shop.plan.machine("app").attachments[0]
    listener = listen(shop.netns["db"], "db", db.address, 5432, "tcp")
    _syn_counters(shop.netns["db"], [(db.address, "tcp", 5432)])
    try:
        # app may reach db:5432; cache may not, and taking app's address does not change that: the domain drops
        # what arrives on cache's interface with app's address, so not even the SYN reaches db.
        assert await asyncio.to_thread(attempt, shop.netns["app"], db.address, 5432, "tcp")
        assert listener.drain() == 1
        assert _read_counters(shop.netns["db"]) == {"c0": 1}
        assert not await asyncio.to_thread(attempt, shop.netns["cache"], db.address, 5432, "tcp")
        run("nsenter", f"--net={shop.netns['cache']}", "--", "ip", "addr", "add", f"{app.address}/32", "dev", "eth0")

        def spoofed() -> bool:
            def make() -> socket.socket:
                sock = socket.socket()
                sock.bind((app.address, 0))
                return sock

            sock = in_netns(shop.netns["cache"], make)
            sock.settimeout(1.0)
            try:
                sock.connect((db.address, 5432))
                return True
            except OSError:
                return False
            finally:
                sock.close()

        assert not await asyncio.to_thread(spoofed)
        assert listener.drain() == 0
        assert _read_counters(shop.netns["db"]) == {"c0": 1}
    finally:
        listener.sock.close()
        await remove_domain(env_ids[0])


async def test_ensure_and_attach_are_idempotent_and_removal_is_per_environment(
    namespaces: Namespaces, env_ids: list[str]
) -> None:
    shop = await _build(namespaces, env_ids[0], SHOP, "a")
    blog = await _build(namespaces, env_ids[1], BLOG, "b")
    domain = f"/run/netns/{shop.plan.route_domain}"

    def state() -> tuple[str, str, str]:
        rules = run("nsenter", f"--net={domain}", "--", "nft", "list", "ruleset")
        links = run("nsenter", f"--net={domain}", "--", "ip", "-o", "link", "show")
        inner = run("nsenter", f"--net={shop.netns['db']}", "--", "ip", "-o", "-4", "addr", "show")
        return rules, "\n".join(sorted(line.split(":")[1] for line in links.splitlines())), inner

    before = state()
    for _ in range(2):
        await ensure_domain(shop.json)
        for name, path in shop.netns.items():
            await attach_machine(shop.json, name, path)
    assert state() == before
    assert before[0].count("table inet vz") == 1

    # A Machine recreated with a fresh namespace: the stale domain end is replaced, the path works again.
    namespaces.remove(shop.netns["db"].rsplit("/", 1)[1])
    shop.netns["db"] = namespaces.add("a-db")
    await attach_machine(shop.json, "db", shop.netns["db"])
    db = shop.plan.machine("db").attachments[0]
    listener = listen(shop.netns["db"], "db", db.address, 5432, "tcp")
    try:
        assert await asyncio.to_thread(attempt, shop.netns["app"], db.address, 5432, "tcp")
        assert listener.drain() == 1
    finally:
        listener.sock.close()

    # Detach: the Machine's interfaces go, in both namespaces.
    await detach_machine(shop.json, "db")
    assert "eth0" not in run("nsenter", f"--net={shop.netns['db']}", "--", "ip", "-o", "link", "show")
    await attach_machine(shop.json, "db", shop.netns["db"])

    # An interface of the same name that is not the attachment is refused, not taken over.
    stray = namespaces.add("a-stray")
    run("nsenter", f"--net={stray}", "--", "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth9")
    with pytest.raises(FailedPreconditionError, match="already has an interface eth0"):
        await attach_machine(shop.json, "app", stray)

    # Removing the shop's domain leaves the blog's untouched and working.
    assert shop.plan.route_domain in list_domains() and blog.plan.route_domain in list_domains()
    assert await remove_domain(env_ids[0]) is True
    assert not domain_exists(env_ids[0]) and domain_exists(env_ids[1])
    assert await remove_domain(env_ids[0]) is False
    for path in shop.netns.values():  # the Machine ends went with the domain
        assert "eth" not in run("nsenter", f"--net={path}", "--", "ip", "-o", "link", "show")
    db_b = blog.plan.machine("db").attachments[0]
    listener = listen(blog.netns["db"], "db", db_b.address, 5432, "tcp")
    try:
        assert await asyncio.to_thread(attempt, blog.netns["worker"], db_b.address, 5432, "tcp")
        assert not await asyncio.to_thread(attempt, blog.netns["app"], db_b.address, 5432, "tcp")
        assert listener.drain() == 1
    finally:
        listener.sock.close()
        await remove_domain(env_ids[1])
    assert not domain_exists(env_ids[1])


async def test_a_machine_namespace_given_as_proc_pid_is_attached(namespaces: Namespaces, env_ids: list[str]) -> None:
    """linux_native hands over a container's namespace as /proc/<pid>/ns/net (its init, not yet started)."""
    definition = parse_definition(BLOG)
    plan = compile_topology(definition, env_ids[0]).to_json()
    worker = namespaces.add("p-worker")
    db = namespaces.add("p-db")
    holder = await asyncio.create_subprocess_exec("nsenter", f"--net={db}", "--", "sleep", "60")
    try:
        await ensure_domain(plan)
        await attach_machine(plan, "worker", worker)
        await attach_machine(plan, "db", f"/proc/{holder.pid}/ns/net")
        await attach_machine(plan, "db", f"/proc/{holder.pid}/ns/net")  # idempotent through the pid path too
        address = compile_topology(definition, env_ids[0]).machine("db").attachments[0].address
        listener = listen(db, "db", address, 5432, "tcp")
        try:
            assert await asyncio.to_thread(attempt, worker, address, 5432, "tcp")
            assert listener.drain() == 1
        finally:
            listener.sock.close()
    finally:
        holder.kill()
        await holder.wait()
        await remove_domain(env_ids[0])
