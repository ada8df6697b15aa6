"""A damaged or hostile plan is refused, naming the field, before any kernel tool runs (no root needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vz_core.env._definition import parse_definition
from vz_core.env._topology import compile_topology
from vz_core.network import DomainSpec, PlanError, attach_machine, domain_for, ensure_domain

ENV = "env_0123456789ab"


def _plan() -> dict[str, Any]:
    m = {"profile": "developer", "driver": "fake", "image": "vz:default"}
    data = {
        "version": 2,
        "project_id": "p",
        "machines": [
            {"name": "app", **m},
            {"name": "db", **m, "services": [{"name": "pg", "port": 5432}]},
        ],
        "paths": [{"from": "app", "to": "db", "service": "pg"}],
        "imports": [{"machine": "app", "host_port": 9000}],
    }
    return compile_topology(parse_definition(data), ENV).to_json()


def _set(plan: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(plan))
    node = copy
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return copy


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (["format"], 2, "$.format"),
        (["environment_id"], "env_x", "not an environment id"),
        (["route_domain"], "vzd-aaaaaaaaaaaa", "is not the route domain of env_0123456789ab"),
        (["route_domain"], "vzd-0123456789ab; rm -rf /", "is not the route domain"),
        (["networks", 0, "subnet"], "10.89.0.0/33", "$.networks[0].subnet"),
        (["networks", 0, "gateway"], "192.168.0.1", "outside"),
        (["networks", 0, "name"], 'x" accept', "a network name"),
        (["machines", 0, "attachments", 0, "domain_ifname"], 'v0"; flush', "v + 10 hex digits"),
        (["machines", 0, "attachments", 0, "domain_ifname"], "eth0", "v + 10 hex digits"),
        (["machines", 0, "attachments", 0, "machine_ifname"], "lo", "ethN"),
        (["machines", 0, "attachments", 0, "address"], "8.8.8.8", "is not a Machine address"),
        (["machines", 0, "attachments", 0, "address"], "not-an-ip", "is not an IPv4 address"),
        (["machines", 0, "attachments", 0, "network"], "elsewhere", "is not a network of the plan"),
        (["forward", 0, "protocol"], "icmp", "is not tcp or udp"),
        (["forward", 0, "port"], 0, "is not a port"),
        (["forward", 0, "port"], True, "is not a port"),
        (["forward", 0, "dest_ifname"], "vffffffffff", "is not an attachment of the plan"),
        (["forward", 0, "source_address"], "10.89.0.250", "is not the address of"),
        (["input", 0, "gateway"], "10.1.1.1", "$.input[0].gateway"),
    ],
)
def test_a_tampered_plan_is_refused(path: list[Any], value: Any, needle: str) -> None:
    plan = _plan()
    with pytest.raises(PlanError) as info:
        DomainSpec.from_plan(_set(plan, path, value))
    assert needle in str(info.value)


def test_the_compiled_plan_is_accepted_and_duplicated_interfaces_are_not() -> None:
    plan = _plan()
    spec = DomainSpec.from_plan(plan)
    assert spec.name == domain_for(ENV) == "vzd-0123456789ab"
    assert spec.machines == ("app", "db")
    clash = _set(
        plan, ["machines", 1, "attachments", 0, "domain_ifname"], plan["machines"][0]["attachments"][0]["domain_ifname"]
    )
    with pytest.raises(PlanError, match="interface name used twice"):
        DomainSpec.from_plan(clash)
    with pytest.raises(PlanError, match="not a Machine of this plan"):
        spec.machine("ghost")


async def test_kernel_functions_check_the_plan_before_touching_anything() -> None:
    bad = _set(_plan(), ["forward", 0, "protocol"], "icmp")
    with pytest.raises(PlanError):
        await ensure_domain(bad)
    with pytest.raises(PlanError):
        await attach_machine(bad, "app", "/proc/self/ns/net")
    with pytest.raises(PlanError, match="not a Machine of this plan"):
        await attach_machine(_plan(), "ghost", "/proc/self/ns/net")
