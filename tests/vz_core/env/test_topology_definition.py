"""vz.json version 2: the network declarations, their validation, and how version 1 files keep their meaning."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from vz_core.env import DefinitionError
from vz_core.env._definition import (
    EgressPolicy,
    definition_json_schema,
    migrate_definition,
    parse_definition,
)

ROOT = Path(__file__).resolve().parents[3]


def machine(name: str = "app", **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": name, "profile": "developer", "driver": "fake", "image": "vz:default"}
    base.update(overrides)
    return base


def v2(*machines: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"version": 2, "project_id": "shop", "machines": list(machines) or [machine()], **top}


def shop(**top: Any) -> dict[str, Any]:
    """Two Machines with services, a path, an export and an import: valid as it is."""
    data = v2(
        machine("app", services=[{"name": "http", "port": 8080}]),
        machine("db", services=[{"name": "pg", "port": 5432}, {"name": "stats", "port": 8125, "protocol": "udp"}]),
        paths=[{"from": "app", "to": "db", "service": "pg"}],
        exports=[{"machine": "app", "service": "http", "host_port": 3000}],
        imports=[{"machine": "app", "host_port": 11434}],
    )
    data.update(top)
    return data


def problems(data: object) -> dict[str, str]:
    with pytest.raises(DefinitionError) as info:
        parse_definition(data)
    return dict(info.value.problems)


def test_a_version_2_machine_is_offline_unless_it_says_otherwise() -> None:
    definition = parse_definition(shop())
    app = definition.machine("app")
    assert app.egress_policy == EgressPolicy("offline")
    assert app.egress == "deny"  # the driver-level label never grants more than the declaration
    assert definition.effective_networks()[0].name == "default"
    assert definition.effective_networks()[0].machines == ["app", "db"]


@pytest.mark.parametrize(
    ("egress", "policy", "driver_label"),
    [
        ("offline", EgressPolicy("offline"), "deny"),
        ("allowed", EgressPolicy("allowed"), "deny"),
        (
            {"allow": ["example.com", "10.0.0.0/8", "192.0.2.7", "*.Pypi.org."]},
            EgressPolicy("allowlist", ("10.0.0.0/8", "192.0.2.7/32"), ("*.pypi.org", "example.com")),
            "deny",
        ),
    ],
    ids=["offline", "allowed", "allowlist"],
)
def test_version_2_egress(egress: object, policy: EgressPolicy, driver_label: str) -> None:
    m = parse_definition(v2(machine(egress=egress))).machines[0]
    assert m.egress_policy == policy
    assert m.egress == driver_label


def test_version_1_keeps_its_meaning_and_its_recorded_form() -> None:
    data = {"version": 1, "project_id": "demo", "machines": [machine("web"), machine("db", egress="deny")]}
    definition = parse_definition(data)
    web, db = definition.machines
    assert (web.egress, web.egress_policy.mode) == ("allow", "allowed")
    assert (db.egress, db.egress_policy.mode) == ("deny", "offline")
    # The state store's form of a version 1 Machine is what vz recorded before version 2 existed: no drift.
    assert web.recorded() == {
        "name": "web",
        "target": {"os": "linux", "arch": None},
        "profile": "developer",
        "driver": "fake",
        "driver_options": {},
        "image": "vz:default",
        "resources": {"cpus": None, "memory": None, "disk": None},
        "workspace": {"projection": "read-write", "target": "/workspace"},
        "mounts": [],
        "volumes": [],
        "environment": {},
        "egress": "allow",
    }


def test_services_are_topology_not_a_creation_time_setting() -> None:
    with_services = parse_definition(shop()).machine("db").recorded()
    without = parse_definition(v2(machine("db"))).machine("db").recorded()
    assert "services" not in with_services
    assert with_services == without


@pytest.mark.parametrize(
    ("data", "path", "needle"),
    [
        ({"networks": [{"name": "n", "machines": ["app"]}]}, "$.networks", "needs version 2"),
        ({"paths": []}, "$.paths", "needs version 2"),
        ({"exports": []}, "$.exports", "needs version 2"),
        ({"imports": []}, "$.imports", "needs version 2"),
        ({"machines": [machine(services=[])]}, "$.machines[0].services", "need version 2"),
        ({"machines": [machine(egress="offline")]}, "$.machines[0].egress", "version 1 reads 'allow' or 'deny'"),
        ({"machines": [machine(egress="allowed")]}, "$.machines[0].egress", "version 1 reads 'allow' or 'deny'"),
        ({"machines": [machine(egress={"allow": ["10.0.0.0/8"]})]}, "$.machines[0].egress", "an allowlist"),
    ],
    ids=["networks", "paths", "exports", "imports", "services", "offline", "allowed", "allowlist"],
)
def test_version_1_refuses_version_2_fields_never_ignores_them(data: dict[str, Any], path: str, needle: str) -> None:
    base: dict[str, Any] = {"version": 1, "project_id": "demo", "machines": [machine()]}
    found = problems({**base, **data})
    assert needle in found[path], found


def _with(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(data))
    node: Any = copy
    parts = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value
    return copy


@pytest.mark.parametrize(
    ("dotted", "value", "path", "needle"),
    [
        ("machines.0.egress", "allow", "$.machines[0].egress", "version 1 spelling; version 2 reads 'allowed'"),
        ("machines.1.egress", "deny", "$.machines[1].egress", "version 2 reads 'offline'"),
        ("machines.0.egress", {"allow": []}, "$.machines[0].egress.allow", "at least 1"),
        ("machines.0.egress", {"allow": ["0.0.0.0/0"]}, "$.machines[0].egress.allow[0]", '"allowed"'),
        ("machines.0.egress", {"allow": ["127.0.0.1"]}, "$.machines[0].egress.allow[0]", "host loopback"),
        ("machines.0.egress", {"allow": ["169.254.169.254"]}, "$.machines[0].egress.allow[0]", "metadata"),
        ("machines.0.egress", {"allow": ["::1"]}, "$.machines[0].egress.allow[0]", "IPv4 destinations only"),
        ("machines.0.egress", {"allow": ["2001:db8::/32"]}, "$.machines[0].egress.allow[0]", "IPv6 is off"),
        ("machines.0.egress", {"allow": ["10.1.2.3/8"]}, "$.machines[0].egress.allow[0]", "network is 10.0.0.0/8"),
        ("machines.0.egress", {"allow": ["10.0.0.0/33"]}, "$.machines[0].egress.allow[0]", "not an IP address"),
        ("machines.0.egress", {"allow": ["intranet"]}, "$.machines[0].egress.allow[0]", "not a domain name"),
        ("machines.0.egress", {"allow": ["a_b.com"]}, "$.machines[0].egress.allow[0]", "not a domain name"),
        ("machines.0.egress", {"allow": ["db.vz.internal"]}, "$.machines[0].egress.allow[0]", "vz.internal"),
        ("machines.0.egress", {"allow": ["localhost"]}, "$.machines[0].egress.allow[0]", "not a domain name"),
        ("machines.0.egress", {"allow": ["x.localhost"]}, "$.machines[0].egress.allow[0]", "localhost"),
        ("machines.0.egress", {"allow": ["a.com", "A.com"]}, "$.machines[0].egress.allow", "repeated: a.com"),
        ("machines.0.egress", "sometimes", "$.machines[0].egress", "'offline' or 'allowed'"),
        ("machines.0.egress", 7, "$.machines[0].egress", '"offline", "allowed" or {"allow": [...]}'),
        (
            "machines.0.services",
            [{"name": "a", "port": 1}, {"name": "a", "port": 2}],
            "$.machines[0].services[1].name",
            "already services[0]",
        ),
        (
            "machines.0.services",
            [{"name": "a", "port": 1}, {"name": "b", "port": 1}],
            "$.machines[0].services[1].port",
            "tcp/1 is already",
        ),
        ("machines.0.services", [{"name": "a", "port": 0}], "$.machines[0].services[0].port", "greater than or equal"),
        (
            "machines.0.services",
            [{"name": "a", "port": 1, "protocol": "sctp"}],
            "$.machines[0].services[0].protocol",
            "'tcp' or 'udp'",
        ),
        ("paths.0.to", "dbx", "$.paths[0].to", "unknown Machine 'dbx' (machines: app, db)"),
        ("paths.0.from", "nope", "$.paths[0].from", "unknown Machine 'nope'"),
        ("paths.0.to", "app", "$.paths[0].to", "its own services on loopback"),
        ("paths.0.service", "redis", "$.paths[0].service", "declares no service 'redis' (pg tcp/5432, stats udp/8125)"),
        (
            "paths.0",
            {"from": "app", "to": "db", "port": 5433},
            "$.paths[0].port",
            "declares no tcp service on port 5433",
        ),
        ("paths.0", {"from": "app", "to": "db", "port": 8125}, "$.paths[0].port", "no tcp service on port 8125"),
        ("paths.0", {"from": "app", "to": "db"}, "$.paths[0]", "name the destination service"),
        ("paths.0", {"from": "app", "to": "db", "service": "pg", "port": 5432}, "$.paths[0]", "not both"),
        (
            "paths.0",
            {"from": "app", "to": "db", "service": "pg", "protocol": "udp"},
            "$.paths[0].protocol",
            "goes with port",
        ),
        ("paths.0", {"from": "app", "to": "db", "service": "pg", "via": "x"}, "$.paths[0].via", "unknown field"),
        ("exports.0.machine", "web", "$.exports[0].machine", "unknown Machine 'web'"),
        ("exports.0.service", "ssh", "$.exports[0].service", "declares no service 'ssh' (http tcp/8080)"),
        ("exports.0.host_port", 70000, "$.exports[0].host_port", "less than or equal to 65535"),
        ("exports.0.address", "0.0.0.0", "$.exports[0].address", "unknown field"),
        ("imports.0.host_address", "0.0.0.0", "$.imports[0].host_address", "not a loopback address"),
        ("imports.0.host_address", "192.168.1.10", "$.imports[0].host_address", "never a LAN or wildcard"),
        ("imports.0.host_address", "localhost", "$.imports[0].host_address", "not an IP address"),
        ("imports.0.host_port", 53, "$.imports[0].host_port", "Environment's DNS"),
        ("imports.0.machine", "ghost", "$.imports[0].machine", "unknown Machine 'ghost'"),
        ("networks", [{"name": "n", "machines": ["app", "ghost"]}], "$.networks[0].machines[1]", "unknown Machine"),
        ("networks", [{"name": "n", "machines": ["app", "app"]}], "$.networks[0].machines[1]", "already machines[0]"),
        (
            "networks",
            [{"name": "n", "machines": ["app", "db"]}, {"name": "n", "machines": []}],
            "$.networks[1].name",
            "already networks[0]",
        ),
        (
            "networks",
            [{"name": "n", "machines": ["app", "db"], "subnet": "8.8.8.0/24"}],
            "$.networks[0].subnet",
            "not inside a private range",
        ),
        (
            "networks",
            [{"name": "n", "machines": ["app", "db"], "subnet": "10.0.0.1/24"}],
            "$.networks[0].subnet",
            "has host bits set",
        ),
        (
            "networks",
            [{"name": "n", "machines": ["app", "db"], "subnet": "10.0.0.0/30"}],
            "$.networks[0].subnet",
            "/8 to /29",
        ),
        (
            "networks",
            [
                {"name": "n", "machines": ["app", "db"], "subnet": "10.0.0.0/16"},
                {"name": "m", "machines": [], "subnet": "10.0.3.0/24"},
            ],
            "$.networks[1].subnet",
            "overlaps networks[0].subnet",
        ),
        (
            "networks",
            [{"name": "a", "machines": ["app"]}, {"name": "b", "machines": ["db"]}],
            "$.paths[0]",
            "share no network",
        ),
        ("networks", [{"name": "a", "machines": ["db"]}], "$.exports[0].machine", "attached to no network"),
    ],
)
def test_bad_declarations_fail_naming_the_field(dotted: str, value: Any, path: str, needle: str) -> None:
    found = problems(_with(shop(), dotted, value))
    assert path in found, found
    assert needle in found[path], found


def test_every_problem_is_reported_in_one_pass() -> None:
    data = shop(
        paths=[{"from": "app", "to": "db", "port": 5433}, {"from": "app", "to": "dbx", "service": "pg"}],
        exports=[
            {"machine": "app", "service": "http", "host_port": 3000},
            {"machine": "db", "service": "pg", "host_port": 3000},
            {"machine": "app", "service": "http"},
        ],
        imports=[
            {"machine": "app", "host_port": 11434},
            {"machine": "app", "host_port": 11434},
            {"machine": "db", "host_port": 9000, "port": 11434},
        ],
    )
    found = problems(data)
    assert set(found) == {
        "$.paths[0].port",
        "$.paths[1].to",
        "$.exports[1].host_port",
        "$.exports[2]",
        "$.imports[1]",
        "$.imports[2].port",
    }, found
    assert "already exports[0]" in found["$.exports[1].host_port"]
    assert "already exported by exports[0]" in found["$.exports[2]"]
    assert "already imports tcp/11434" in found["$.imports[1]"]
    assert "already carries 127.0.0.1:11434" in found["$.imports[2].port"]


def test_paths_may_name_the_port_instead_of_the_service() -> None:
    by_port = parse_definition(_with(shop(), "paths.0", {"from": "app", "to": "db", "port": 8125, "protocol": "udp"}))
    assert by_port.paths[0].port == 8125
    duplicate = _with(
        shop(), "paths", [{"from": "app", "to": "db", "service": "pg"}, {"from": "app", "to": "db", "port": 5432}]
    )
    assert "the same path as paths[0]" in problems(duplicate)["$.paths[1]"]


def test_an_import_may_use_another_loopback_address_and_machine_port() -> None:
    data = _with(shop(), "imports.0", {"machine": "app", "host_address": "127.0.0.2", "host_port": 5000, "port": 80})
    item = parse_definition(data).imports[0]
    assert (item.host_address, item.host_port, item.machine_port) == ("127.0.0.2", 5000, 80)
    ipv6 = parse_definition(_with(shop(), "imports.0.host_address", "::1")).imports[0]
    assert ipv6.host_address == "::1"


def test_two_machines_may_import_the_same_host_port() -> None:
    data = _with(shop(), "imports", [{"machine": "app", "host_port": 11434}, {"machine": "db", "host_port": 11434}])
    assert len(parse_definition(data).imports) == 2


def test_a_version_2_file_is_never_mutated_by_parsing() -> None:
    data = shop()
    before = json.dumps(data, sort_keys=True)
    parse_definition(data)
    assert json.dumps(data, sort_keys=True) == before


def test_migration_from_version_1_keeps_every_machines_egress() -> None:
    old = {
        "version": 1,
        "project_id": "demo",
        "machines": [machine("web"), machine("db", egress="deny"), machine("cache", egress="allow")],
        "default_machine": "web",
    }
    new = migrate_definition(old)
    assert new["version"] == 2 and old["version"] == 1  # the input is left as it was
    before, after = parse_definition(old), parse_definition(new)
    assert [m.egress_policy for m in after.machines] == [m.egress_policy for m in before.machines]
    assert [m.egress_policy.mode for m in after.machines] == ["allowed", "offline", "allowed"]
    assert [m.recorded() | {"egress": None} for m in after.machines] == [
        m.recorded() | {"egress": None} for m in before.machines
    ]
    assert migrate_definition(new) == new
    with pytest.raises(DefinitionError):
        migrate_definition({"version": 1, "project_id": "demo", "machines": []})


def test_unsupported_versions_are_refused_naming_what_this_vz_reads() -> None:
    for version in (0, 3, "2", True):
        found = problems({**shop(), "version": version})
        assert "versions 1 and 2" in found["$.version"], found


def test_the_schema_says_what_each_version_allows() -> None:
    schema = definition_json_schema()
    assert schema["properties"]["version"]["enum"] == [1, 2]
    v1, v2_rule = schema["allOf"]
    assert v1["if"]["properties"]["version"] == {"const": 1}
    for key in ("networks", "paths", "exports", "imports"):
        assert key in schema["properties"]
        assert v1["then"]["properties"][key] is False
    v1_machine = v1["then"]["properties"]["machines"]["items"]["properties"]
    assert v1_machine["services"] is False and v1_machine["egress"]["enum"] == ["allow", "deny"]
    v2_egress = v2_rule["then"]["properties"]["machines"]["items"]["properties"]["egress"]
    assert v2_egress["default"] == "offline"
    assert v2_egress["oneOf"][0]["enum"] == ["offline", "allowed"]
    assert set(schema["$defs"]) >= {"Network", "NetworkPath", "Export", "Import", "Service", "EgressAllowlist"}
    assert set(schema["$defs"]["NetworkPath"]["properties"]) == {"from", "to", "service", "port", "protocol"}
    committed = json.loads((ROOT / "schemas" / "vz.schema.json").read_text())
    assert committed == schema


def _doc_definitions() -> list[str]:
    text = (ROOT / "docs" / "network.md").read_text()
    return [block for block in re.findall(r"```json\n(.*?)```", text, re.S) if '"project_id"' in block]


@pytest.mark.parametrize("block", _doc_definitions(), ids=lambda b: json.loads(b)["project_id"])
def test_the_examples_of_docs_network_are_valid(block: str) -> None:
    definition = parse_definition(json.loads(block))
    assert definition.version == 2


def _long_name(i: int) -> str:
    return f"n{i:02d}" + "x" * 37  # 40 characters: the longest name


@pytest.mark.parametrize(
    ("data", "path", "needle"),
    [
        (  # an export without host_port prefers its service port, which another export declares
            shop(
                exports=[
                    {"machine": "app", "service": "http"},
                    {"machine": "db", "service": "pg", "host_port": 8080},
                ]
            ),
            "$.exports[0]",
            "prefers tcp/8080 on the host (its service port, no host_port given), which exports[1] also prefers",
        ),
        (  # two exports preferring the same service port
            v2(
                machine("app", services=[{"name": "http", "port": 8080}]),
                machine("web", services=[{"name": "http", "port": 8080}]),
                exports=[{"machine": "app", "service": "http"}, {"machine": "web", "service": "http"}],
                default_machine="app",
            ),
            "$.exports[1]",
            "which exports[0] also prefers; give it a host_port of its own",
        ),
        (  # an import of the Environment's own export: a loop back into the Environment
            shop(imports=[{"machine": "db", "host_port": 3000}]),
            "$.imports[0].host_port",
            "127.0.0.1 tcp/3000 is where exports[0] listens",
        ),
        (
            v2(
                machine("app"),
                machine("db"),
                networks=[{"name": _long_name(i), "machines": ["app", "db"]} for i in range(17)],
                default_machine="app",
            ),
            "$.networks[16].machines[0]",
            "'app' would attach to more than 16 networks",
        ),
        (
            v2(*(machine(f"m{i}") for i in range(254)), default_machine="m0"),
            "$.machines",
            "254 Machines on the automatic network 'default' (a /24 of 10.89.0.0/16, room for 253)",
        ),
        (
            v2(
                *(machine(f"m{i}") for i in range(254)),
                networks=[{"name": "big", "machines": [f"m{i}" for i in range(254)]}],
                default_machine="m0",
            ),
            "$.networks[0].machines",
            "254 Machines on network 'big'",
        ),
        (
            v2(
                machine("app"),
                networks=[
                    {"name": "all", "machines": ["app"], "subnet": "10.89.0.0/16"},
                    {"name": "more", "machines": ["app"]},
                ],
            ),
            "$.networks[1].subnet",
            "network 'more' has no 'subnet' and the declared subnets leave no free /24",
        ),
        (
            v2(machine(egress={"allow": [f"h{i:03d}." + "d" * 60 + ".example.com" for i in range(150)]})),
            "$.machines[0]",
            "more than the 8192 its driver accepts; shorten its egress allowlist",
        ),
        (  # host.vz.internal names the import relay: a Machine of that name would be ambiguous in DNS
            v2(
                machine("host"), machine("app"), imports=[{"machine": "app", "host_port": 11434}], default_machine="app"
            ),
            "$.machines[0].name",
            "'host' is reserved in version 2",
        ),
    ],
    ids=[
        "implicit-vs-declared-export",
        "implicit-vs-implicit-export",
        "import-of-own-export",
        "too-many-networks",
        "default-network-full",
        "automatic-subnet-full",
        "no-automatic-subnet-left",
        "label-too-long",
        "machine-named-host",
    ],
)
def test_declarations_that_would_fail_when_machines_start_fail_before(
    data: dict[str, Any], path: str, needle: str
) -> None:
    """What used to fail only once `vz up` realized the topology (a second relay on a port, a Machine without
    an address, a label its driver refuses) is a definition problem naming the field."""
    found = problems(data)
    assert path in found, found
    assert needle in found[path], found[path]


def test_the_limits_themselves_are_accepted() -> None:
    """16 networks of the longest names, 253 Machines on an automatic /24, an export and an import on distinct
    ports: valid, and every Machine's label fits (the plan compiles and each slice is within the limit)."""
    from vz_core.env._topology import compile_topology
    from vz_core.network.label import MAX_LABEL, machine_slice

    wide = v2(
        machine("a" * 40, egress={"allow": [f"h{i:03d}.example.com" for i in range(40)]}),
        machine("db"),
        networks=[{"name": _long_name(i), "machines": ["a" * 40, "db"]} for i in range(16)],
        default_machine="db",
    )
    plan = compile_topology(parse_definition(wide), "env_0123456789ab").to_json()
    assert all(len(machine_slice(plan, m["name"]) or "") <= MAX_LABEL for m in plan["machines"])
    full = v2(*(machine(f"m{i}") for i in range(253)), default_machine="m0")
    plan = compile_topology(parse_definition(full), "env_0123456789ab").to_json()
    assert len({m["attachments"][0]["address"] for m in plan["machines"]}) == 253
    parse_definition(shop(imports=[{"machine": "app", "host_port": 3001}]))  # next to the export's 3000: fine


def test_declarations_of_machines_whose_driver_cannot_join_the_route_domain_are_named() -> None:
    """`vz up` refuses (before anything is created) a path, export or import of a Machine whose driver does not
    advertise the Extensions fact topology: it would run isolated and the declaration would never connect."""
    from vz_core.env._definition import unreachable_problems

    definition = parse_definition(shop())
    assert unreachable_problems(definition, {"app", "db"}) == []
    found = dict(unreachable_problems(definition, {"app"}))
    assert set(found) == {"$.paths[0].to"}, found
    assert "'db' runs on driver 'fake', which does not join Machines" in found["$.paths[0].to"]
    assert set(dict(unreachable_problems(definition, set()))) == {
        "$.paths[0].from",
        "$.paths[0].to",
        "$.exports[0].machine",
        "$.imports[0].machine",
    }
    version1 = parse_definition({"version": 1, "project_id": "shop", "machines": [machine()]})
    assert unreachable_problems(version1, set()) == []
