"""Bounded, reproducible fuzz of the network declarations and the topology plan (style of tests/security).

1. Random version 2 definitions built from a small alphabet of names (so references sometimes resolve and
   sometimes do not): parsing ends in a definition or a ``DefinitionError`` whose every problem names a JSON
   path, never another exception. A definition that parses compiles to a plan that holds the invariants below
   and that the kernel side (``DomainSpec``) accepts.
2. A valid definition with one field replaced by arbitrary JSON: a definition or a clear error.

CI runs 300 derandomized examples per strategy. Longer: ``VZ_FUZZ_EXAMPLES=20000 python -m pytest ...``.
"""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vz_core.env import DefinitionError
from vz_core.env._definition import parse_definition
from vz_core.env._topology import compile_topology
from vz_core.errors import UserError
from vz_core.network import DomainSpec, domain_ruleset

EXAMPLES = int(os.environ.get("VZ_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ENV = "env_0123456789ab"

names = st.sampled_from(["app", "db", "cache", "web", "x"])
ports = st.one_of(st.sampled_from([53, 80, 5432, 6379, 8080, 8125]), st.integers(min_value=-1, max_value=70000))
protocols = st.sampled_from(["tcp", "udp", "sctp"])
subnets = st.sampled_from(["10.89.1.0/24", "10.89.1.0/25", "192.168.0.0/29", "10.0.0.0/8", "8.8.8.0/24", "x"])
destinations = st.sampled_from(
    ["10.0.0.0/8", "10.0.0.1/8", "example.com", "*.pypi.org", "127.0.0.1", "0.0.0.0/0", "::1", "a..b", "Foo.Org."]
)
egress = st.one_of(
    st.sampled_from(["offline", "allowed", "allow", "deny", "maybe"]),
    st.builds(lambda items: {"allow": items}, st.lists(destinations, max_size=3)),
)
service = st.fixed_dictionaries({"name": names, "port": ports}, optional={"protocol": protocols})
machine = st.fixed_dictionaries(
    {"name": names, "profile": st.just("developer"), "driver": st.just("fake"), "image": st.just("vz:default")},
    optional={"services": st.lists(service, max_size=3), "egress": egress},
)
network = st.fixed_dictionaries({"name": names, "machines": st.lists(names, max_size=4)}, optional={"subnet": subnets})
path = st.fixed_dictionaries(
    {"from": names, "to": names}, optional={"service": names, "port": ports, "protocol": protocols}
)
export = st.fixed_dictionaries({"machine": names, "service": names}, optional={"host_port": ports})
import_ = st.fixed_dictionaries(
    {"machine": names, "host_port": ports},
    optional={
        "port": ports,
        "protocol": protocols,
        "host_address": st.sampled_from(["127.0.0.1", "127.1.2.3", "::1", "0.0.0.0", "192.168.1.1", "x"]),
    },
)
definitions = st.fixed_dictionaries(
    {"version": st.just(2), "project_id": st.just("fuzz"), "machines": st.lists(machine, min_size=1, max_size=4)},
    optional={
        "networks": st.lists(network, max_size=3),
        "paths": st.lists(path, max_size=5),
        "exports": st.lists(export, max_size=3),
        "imports": st.lists(import_, max_size=3),
    },
)


def _check_plan(data: dict[str, Any]) -> None:
    try:
        definition = parse_definition(data)
    except DefinitionError as exc:
        assert exc.problems and all(p.startswith("$") and m for p, m in exc.problems)
        return
    plan = compile_topology(definition, ENV)
    again = compile_topology(parse_definition(json.loads(json.dumps(data))), ENV)
    assert plan.dumps() == again.dumps()
    subnets = {n.name: ipaddress.ip_network(n.subnet) for n in plan.networks}
    for net in plan.networks:
        addresses = [a.address for m in plan.machines for a in m.attachments if a.network == net.name]
        assert len(addresses) == len(set(addresses))
        assert all(ipaddress.ip_address(a) in subnets[net.name] and a != net.gateway for a in addresses)
    declared = set()
    for p in definition.paths:
        dest = definition.machine(p.to)
        svc = dest.service(p.service) if p.service else None
        declared.add((p.source, p.to, *((svc.protocol, svc.port) if svc else (p.protocol or "tcp", p.port))))
    assert {(r.source_machine, r.dest_machine, r.protocol, r.port) for r in plan.forward} == declared
    for m in plan.machines:
        reachable = {r.dest_machine for r in plan.forward if r.source_machine == m.name} | {m.name}
        for record in m.dns:
            if record.type == "A" and not record.name.startswith("host."):
                assert record.name.split(".")[0] in reachable
    spec = DomainSpec.from_plan(plan.to_json())
    assert domain_ruleset(spec).count("policy drop") == 3


@FUZZ
@given(data=definitions)
def test_random_declarations_parse_or_fail_clearly_and_compile_to_a_sound_plan(data: dict[str, Any]) -> None:
    _check_plan(data)


@st.composite
def consistent(draw: st.DrawFn) -> dict[str, Any]:
    """Definitions whose references resolve by construction (the plan invariants need paths that parse)."""
    pool = ["app", "db", "cache", "web", "worker", "queue"]
    chosen = draw(st.lists(st.sampled_from(pool), min_size=2, max_size=6, unique=True))
    machines: list[dict[str, Any]] = []
    for name in chosen:
        ports_ = draw(st.lists(st.integers(min_value=1, max_value=65535), max_size=3, unique=True))
        services = [
            {"name": f"s{i}", "port": port, "protocol": draw(st.sampled_from(["tcp", "udp"]))}
            for i, port in enumerate(ports_)
        ]
        machines.append(
            {"name": name, "profile": "developer", "driver": "fake", "image": "vz:default", "services": services}
        )
    nets = []
    if draw(st.booleans()):
        for i in range(draw(st.integers(min_value=1, max_value=3))):
            members = draw(st.lists(st.sampled_from(chosen), unique=True))
            nets.append({"name": f"n{i}", "machines": members})
    paths = []
    for _ in range(draw(st.integers(min_value=0, max_value=8))):
        src, dst = draw(st.sampled_from(chosen)), draw(st.sampled_from(chosen))
        target = next(m for m in machines if m["name"] == dst)
        if src == dst or not target["services"]:
            continue
        svc = draw(st.sampled_from(target["services"]))
        path = {"from": src, "to": dst, "service": svc["name"]}
        if path not in paths:
            paths.append(path)
    data: dict[str, Any] = {"version": 2, "project_id": "fuzz", "machines": machines, "paths": paths}
    if nets:
        data["networks"] = nets
    return data


@FUZZ
@given(data=consistent())
def test_consistent_declarations_compile_to_exactly_their_paths(data: dict[str, Any]) -> None:
    _check_plan(data)


def test_the_consistent_strategy_reaches_plans_with_forwarding() -> None:
    seen = {"forwarding": 0}

    @settings(max_examples=100, derandomize=True, database=None, deadline=None)
    @given(data=consistent())
    def probe(data: dict[str, Any]) -> None:
        try:
            plan = compile_topology(parse_definition(data), ENV)
        except DefinitionError:
            return
        seen["forwarding"] += bool(plan.forward)

    probe()
    assert seen["forwarding"] >= 10, seen


VALID: dict[str, Any] = {
    "version": 2,
    "project_id": "fuzz",
    "machines": [
        {
            "name": "app",
            "profile": "developer",
            "driver": "fake",
            "image": "vz:default",
            "services": [{"name": "http", "port": 8080}],
            "egress": {"allow": ["10.0.0.0/8", "example.com"]},
        },
        {
            "name": "db",
            "profile": "developer",
            "driver": "fake",
            "image": "vz:default",
            "services": [{"name": "pg", "port": 5432, "protocol": "tcp"}],
        },
    ],
    "networks": [{"name": "front", "machines": ["app", "db"], "subnet": "10.89.3.0/24"}],
    "paths": [{"from": "app", "to": "db", "service": "pg"}],
    "exports": [{"machine": "app", "service": "http", "host_port": 3000}],
    "imports": [{"machine": "app", "host_port": 11434, "host_address": "127.0.0.1", "protocol": "tcp", "port": 80}],
}


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += _paths(value, (*prefix, index))
    return out


PATHS = [p for p in _paths(VALID)[1:] if p[0] != "version"]
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**40), max_value=2**40),
        st.text(max_size=12),
        st.sampled_from(["app", "db", "pg", "http", "udp", "127.0.0.1", "::", "10.0.0.0/8", "a.b", ""]),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


@FUZZ
@given(where=st.sampled_from(PATHS), value=json_values)
def test_a_valid_definition_with_one_network_field_replaced(where: tuple[Any, ...], value: Any) -> None:
    data = json.loads(json.dumps(VALID))
    node = data
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    try:
        _check_plan(data)
    except UserError as exc:  # pragma: no cover - _check_plan handles DefinitionError; any other is a bug
        raise AssertionError(f"unexpected {type(exc).__name__}: {exc}") from exc


def test_the_valid_base_really_is_valid() -> None:
    plan = compile_topology(parse_definition(VALID), ENV)
    assert len(plan.forward) == 1 and plan.imports[0].port == 80
