"""The ``vz.network`` label (vz_core.network.label): one Machine's slice of the plan, produced and read back.

Pure (no kernel objects): the slice of every Machine of a plan with two networks reads back as exactly that
Machine's attachments, DNS server and search; a Machine attached to no network gets no label; every way a label
can be wrong is refused naming it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from vz_core.env import compile_topology
from vz_core.env._definition import parse_definition
from vz_core.errors import InvalidArgumentError
from vz_core.network import DomainSpec
from vz_core.network.label import LABEL, MAX_LABEL, machine_slice, parse_machine_slice

ENV = "env_0123456789ab"


def _plan() -> dict[str, Any]:
    m = {"profile": "developer", "driver": "linux_native", "image": "vz:default"}
    definition = {
        "version": 2,
        "project_id": "label",
        "machines": [
            {"name": "web", **m, "services": [{"name": "http", "port": 8000}]},
            {"name": "api", **m, "services": [{"name": "grpc", "port": 9000}]},
            {"name": "store", **m},
            {"name": "lonely", **m},
        ],
        "networks": [
            {"name": "front", "machines": ["web", "api"]},
            {"name": "back", "machines": ["api", "store"], "subnet": "10.89.7.0/24"},
        ],
        "paths": [{"from": "web", "to": "api", "service": "grpc"}],
    }
    return compile_topology(parse_definition(definition), ENV).to_json()


def test_each_slice_reads_back_as_its_machine() -> None:
    plan = _plan()
    whole = DomainSpec.from_plan(plan)
    for entry in plan["machines"]:
        name = entry["name"]
        label = machine_slice(plan, name)
        if not entry["attachments"]:
            assert label is None  # attached to no network: no label, nothing to join
            continue
        assert label is not None and len(label) < MAX_LABEL
        found = parse_machine_slice({LABEL: label, "dev.vz.environment": ENV})
        assert found is not None
        assert found.machine == name and found.attachments == whole.machine(name)
        assert found.dns_server == entry["dns_server"] and list(found.search) == entry["search"]
        assert found.resolv_conf() == f"nameserver {entry['dns_server']}\nsearch vz.internal\n"
        data = json.loads(label)
        assert [n["name"] for n in data["networks"]] == [a["network"] for a in entry["attachments"]]
        assert data["forward"] == [] and data["input"] == [] and len(data["machines"]) == 1
    assert parse_machine_slice({}) is None
    assert parse_machine_slice({"vz.egress": "deny"}) is None


def test_the_environment_layer_produces_the_same_label() -> None:
    from vz_core.env import _up

    producer = getattr(_up, "network_label", None)
    if producer is None:
        pytest.fail("vz_core.env._up.network_label is gone: the Environment layer must produce this label")
    plan = _plan()
    for entry in plan["machines"]:
        assert producer(plan, entry["name"]) == machine_slice(plan, entry["name"])


def _good() -> dict[str, Any]:
    label = machine_slice(_plan(), "api")
    assert label is not None
    data: dict[str, Any] = json.loads(label)
    return data


def _with_machine(**fields: Any) -> str:
    data = _good()
    data["machines"] = [dict(data["machines"][0], **fields)]
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "labels", "fragment"),
    [
        ("{nope", {}, "not JSON"),
        ("[1]", {}, "JSON object"),
        ("x" * (MAX_LABEL + 1), {}, "longer than"),
        (json.dumps(dict(_good(), format=2)), {}, "$.format"),
        (json.dumps(dict(_good(), machines=[])), {}, "0 Machines"),
        (_with_machine(attachments=[]), {}, "has none"),
        (_with_machine(dns_server="1.1.1.1"), {}, "dns_server"),
        (_with_machine(search=[]), {}, "search"),
        (_with_machine(search=["vz.internal\nnameserver 1.1.1.1"]), {}, "search"),
        (_with_machine(name="web"), {}, "web"),
        (json.dumps(_good()), {"dev.vz.environment": "env_zzzzzzzzzzzz"}, "not the Machine's Environment"),
    ],
)
def test_a_bad_label_is_refused_naming_what_is_wrong(text: str, labels: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        parse_machine_slice({LABEL: text, **labels})
    assert caught.value.message.startswith(f"label {LABEL}: ")
    assert fragment in caught.value.message


def test_a_slice_with_rules_is_refused() -> None:
    data = _good()
    att = data["machines"][0]["attachments"][0]
    rule = {"ifname": att["domain_ifname"], "address": att["address"], "gateway": att["gateway"]}
    data["input"] = [dict(rule, protocol="udp", port=53)]
    with pytest.raises(InvalidArgumentError, match="carries no rules"):
        parse_machine_slice({LABEL: json.dumps(data)})
