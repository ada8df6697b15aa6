"""The topology plan: deterministic, keyed by the environment id, and exactly the declarations."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest

from vz_core.env._definition import parse_definition
from vz_core.env._topology import DEFAULT_POOL, FALLBACK_PORTS, compile_topology, domain_name
from vz_core.network import DomainSpec, PlanError, domain_ruleset

ENV_A = "env_0123456789ab"
ENV_B = "env_zyxwvtsrqpnm"


def machine(name: str, *services: tuple[str, int, str], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "profile": "developer",
        "driver": "fake",
        "image": "vz:default",
        "services": [{"name": n, "port": p, "protocol": proto} for n, p, proto in services],
        **extra,
    }


def shop(**top: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "version": 2,
        "project_id": "shop",
        "machines": [
            machine("app", ("http", 8080, "tcp"), ("admin", 80, "tcp"), egress={"allow": ["pypi.org", "10.0.0.0/8"]}),
            machine("db", ("pg", 5432, "tcp"), ("stats", 8125, "udp")),
            machine("cache", ("redis", 6379, "tcp")),
        ],
        "networks": [
            {"name": "front", "machines": ["app", "db", "cache"]},
            {"name": "back", "machines": ["db", "cache"], "subnet": "10.89.7.0/24"},
        ],
        "paths": [
            {"from": "app", "to": "db", "service": "pg"},
            {"from": "app", "to": "db", "port": 8125, "protocol": "udp"},
            {"from": "db", "to": "cache", "service": "redis"},
        ],
        "exports": [
            {"machine": "app", "service": "http"},
            {"machine": "app", "service": "admin"},
            {"machine": "db", "service": "pg", "host_port": 15432},
        ],
        "imports": [{"machine": "app", "host_port": 11434}],
    }
    data.update(top)
    return data


def plan_of(data: dict[str, Any], env: str = ENV_A) -> Any:
    return compile_topology(parse_definition(data), env)


def test_the_same_input_gives_the_same_plan_byte_for_byte() -> None:
    first = plan_of(shop()).dumps()
    assert plan_of(shop()).dumps() == first
    assert plan_of(json.loads(json.dumps(shop()))).dumps() == first
    assert json.loads(first) == plan_of(shop()).to_json()  # plain JSON values


def test_the_route_domain_is_keyed_by_the_environment_id() -> None:
    a, b = plan_of(shop(), ENV_A), plan_of(shop(), ENV_B)
    assert (a.route_domain, b.route_domain) == ("vzd-0123456789ab", "vzd-zyxwvtsrqpnm")
    assert a.environment_id == ENV_A and b.environment_id == ENV_B
    # Environments of one project overlap on purpose: their domains isolate them.
    assert [n.subnet for n in a.networks] == [n.subnet for n in b.networks]
    assert [m.attachments for m in a.machines] == [m.attachments for m in b.machines]
    for bad in ("env_short", "0123456789ab", "env_0123456789AB", "env_0123456789ab\n"):
        with pytest.raises(ValueError, match="not an environment id"):
            domain_name(bad)


def test_addresses_are_inside_their_network_unique_and_not_the_gateway() -> None:
    plan = plan_of(shop())
    nets = {n.name: n for n in plan.networks}
    assert nets["back"].subnet == "10.89.7.0/24"
    assert ipaddress.IPv4Network(nets["front"].subnet).subnet_of(DEFAULT_POOL)
    for net in plan.networks:
        subnet = ipaddress.ip_network(net.subnet)
        assert net.gateway == str(subnet.network_address + 1)
        addresses = [a.address for m in plan.machines for a in m.attachments if a.network == net.name]
        assert len(addresses) == len(set(addresses)) == len(net.machines)
        for address in addresses:
            ip = ipaddress.ip_address(address)
            assert ip in subnet and address != net.gateway and ip != subnet.broadcast_address
    db = plan.machine("db")
    assert [(a.network, a.machine_ifname) for a in db.attachments] == [("front", "eth0"), ("back", "eth1")]
    assert db.dns_server == nets["front"].gateway
    ifnames = [a.domain_ifname for m in plan.machines for a in m.attachments]
    assert len(set(ifnames)) == len(ifnames) and all(len(n) <= 15 for n in ifnames)


def test_adding_a_machine_or_a_network_moves_nobody_else() -> None:
    before = plan_of(shop())
    grown = shop()
    grown["machines"].append(machine("worker"))
    grown["networks"][0]["machines"].append("worker")
    grown["networks"].insert(0, {"name": "extra", "machines": ["worker"]})
    after = plan_of(grown)
    for name in ("app", "db", "cache"):
        assert after.machine(name).attachments == before.machine(name).attachments
    assert {n.name: n.subnet for n in after.networks}.items() >= {n.name: n.subnet for n in before.networks}.items()


def test_forward_rules_are_exactly_the_declared_paths_on_every_shared_network() -> None:
    plan = plan_of(shop())
    got = {
        (r.source_machine, r.dest_machine, r.protocol, r.port, r.source_address, r.dest_address) for r in plan.forward
    }
    addr = {(m.name, a.network): a.address for m in plan.machines for a in m.attachments}
    assert got == {
        ("app", "db", "tcp", 5432, addr[("app", "front")], addr[("db", "front")]),
        ("app", "db", "udp", 8125, addr[("app", "front")], addr[("db", "front")]),
        ("db", "cache", "tcp", 6379, addr[("db", "front")], addr[("cache", "front")]),
        ("db", "cache", "tcp", 6379, addr[("db", "back")], addr[("cache", "back")]),
    }
    inbound = {s.service: s for s in plan.machine("cache").inbound}
    assert [(s.machine, s.network) for s in inbound["redis"].sources] == [("db", "back"), ("db", "front")]
    assert plan.machine("app").inbound[0].sources == () and plan.machine("app").inbound[0].exported


def test_no_paths_no_forwarding() -> None:
    plan = plan_of(shop(paths=[], exports=[], imports=[]))
    assert plan.forward == ()
    assert {r.purpose for r in plan.input} == {"dns"}


def test_each_machine_sees_only_the_names_it_has_a_path_to() -> None:
    plan = plan_of(shop())
    names = {m.name: sorted(r.name for r in m.dns) for m in plan.machines}
    assert names["app"] == sorted(
        [
            "app.vz.internal",
            "db.vz.internal",
            "_pg._tcp.db.vz.internal",
            "_stats._udp.db.vz.internal",
            "host.vz.internal",
            "host.docker.internal",
        ]
    )
    assert names["db"] == sorted(["db.vz.internal", "cache.vz.internal", "_redis._tcp.cache.vz.internal"])
    assert names["cache"] == ["cache.vz.internal"]  # it reaches nobody: it resolves only itself
    app = plan.machine("app")
    host = next(r for r in app.dns if r.name == "host.vz.internal")
    assert host.address == app.attachments[0].gateway  # the Environment-local relay address, not the host
    srv = next(r for r in app.dns if r.type == "SRV" and r.name.startswith("_pg"))
    assert (srv.port, srv.target) == (5432, "db.vz.internal")


def test_imports_open_the_relay_port_on_the_gateway_for_the_importer_only() -> None:
    plan = plan_of(shop())
    relay = plan.imports[0]
    app = plan.machine("app").attachments[0]
    assert (relay.machine, relay.port, relay.host_address, relay.relay_addresses) == (
        "app",
        11434,
        "127.0.0.1",
        (app.gateway,),
    )
    imports = [r for r in plan.input if r.purpose == "import"]
    assert [(r.machine, r.ifname, r.gateway, r.port) for r in imports] == [
        ("app", app.domain_ifname, app.gateway, 11434)
    ]


def test_export_host_ports_prefer_the_declared_then_the_service_port_then_stable_fallbacks() -> None:
    a, b = plan_of(shop(), ENV_A), plan_of(shop(), ENV_B)
    exports = {e.service: e for e in a.exports}
    assert exports["pg"].host_ports[0] == 15432 and exports["pg"].declared_host_port == 15432
    assert exports["http"].host_ports[0] == 8080  # the service's own port when it is not privileged
    assert 80 not in exports["admin"].host_ports  # a privileged service port is never the preference
    for export in a.exports:
        assert export.host_address == "127.0.0.1"
        assert len(set(export.host_ports)) == len(export.host_ports) >= 4
        assert all(p in FALLBACK_PORTS for p in export.host_ports[1:] if p != export.declared_host_port)
    # Stable for one Environment, different between two: two Environments exporting 8080 fall back apart.
    assert [e.host_ports for e in plan_of(shop(), ENV_A).exports] == [e.host_ports for e in a.exports]
    fallback_a = {e.service: e.host_ports[1:] for e in a.exports}
    fallback_b = {e.service: e.host_ports[1:] for e in b.exports}
    assert fallback_a != fallback_b


def test_egress_is_carried_normalized() -> None:
    plan = plan_of(shop())
    assert plan.machine("app").egress == {"mode": "allowlist", "cidrs": ["10.0.0.0/8"], "domains": ["pypi.org"]}
    assert plan.machine("db").egress == {"mode": "offline", "cidrs": [], "domains": []}


def test_a_version_1_definition_has_no_route_domain() -> None:
    web, db = machine("web"), machine("db", egress="deny")
    for m in (web, db):
        m.pop("services")
    data = {"version": 1, "project_id": "old", "machines": [web, db]}
    plan = compile_topology(parse_definition(data), ENV_A)
    assert plan.route_domain is None and plan.networks == () and plan.forward == ()
    assert [m.egress["mode"] for m in plan.machines] == ["allowed", "offline"]
    with pytest.raises(PlanError, match="version 1 definition has no route domain"):
        DomainSpec.from_plan(plan.to_json())


def test_the_kernel_side_reads_the_plan_and_its_ruleset_names_exactly_the_paths() -> None:
    plan = plan_of(shop())
    spec = DomainSpec.from_plan(plan.to_json())
    assert spec.name == plan.route_domain
    rules = domain_ruleset(spec)
    assert rules == domain_ruleset(DomainSpec.from_plan(plan_of(shop()).to_json()))
    for r in plan.forward:
        assert f'{r.source_address} . "{r.dest_ifname}" . {r.dest_address} . {r.protocol} . {r.port}' in rules
    assert rules.count(" . tcp . 5432") == 1
    # Every filter chain drops by default; the only accepting chain is the uplink's masquerade (nat).
    assert rules.count("policy drop") == 3 and rules.count("policy accept") == 1
    assert "type nat hook postrouting priority srcnat; policy accept;" in rules
    # The allowlist's CIDRs are per source address; "allowed" excludes private ranges; nothing reaches "never".
    app = plan.machine("app").attachments[0].address
    assert f"{app} . 10.0.0.0/8" in rules and "ip daddr != @lan" in rules and "ip daddr != @never" in rules
