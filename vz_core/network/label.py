"""The ``vz.network`` RunImage label: one Machine's slice of its Environment's topology plan (docs/network.md).

The Environment layer gives each Machine of a driver that advertises the Extensions fact ``topology`` the label
``vz.network=<compact JSON>``; the drivers (linux_native: veth pairs; qemu: tap devices) read it with
``parse_machine_slice``, so both refuse exactly the same labels with the same messages. The slice is itself a
plan holding only that Machine, so ``DomainSpec.from_plan`` and ``attach_machine`` read it unchanged::

    {"format": 1, "environment_id": "env_…", "route_domain": "vzd-…",
     "networks": [{"name", "subnet", "gateway", "machines": [m]}, …],          # the Machine's networks only
     "machines": [{"name": m, "attachments": [{"network", "address", "prefixlen", "gateway",
                                               "machine_ifname", "domain_ifname"}, …],
                   "dns_server": "10.89.242.1", "search": ["vz.internal"], "egress": {…}}],
     "forward": [], "input": []}
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vz_core.errors import InvalidArgumentError
from vz_core.network._spec import AttachmentSpec, DomainSpec, PlanError

__all__ = ["FACT_KEY", "LABEL", "MAX_LABEL", "MachineSlice", "machine_slice", "parse_machine_slice"]

LABEL = "vz.network"
FACT_KEY = "topology"
"""The Extensions fact a driver advertises when it reads the label (the Environment layer passes it only then)."""
MAX_LABEL = 8192
ENVIRONMENT_LABEL = "dev.vz.environment"
_SEARCH_RE = re.compile(r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class MachineSlice:
    """One Machine's part of its Environment's topology plan, as carried by the ``vz.network`` label."""

    plan: dict[str, Any]
    spec: DomainSpec
    machine: str
    dns_server: str
    search: tuple[str, ...]

    @property
    def attachments(self) -> tuple[AttachmentSpec, ...]:
        return self.spec.machine(self.machine)

    def resolv_conf(self) -> str:
        return f"nameserver {self.dns_server}\nsearch {' '.join(self.search)}\n"


def machine_slice(plan: Mapping[str, Any], machine: str) -> str | None:
    """The ``vz.network`` label value of ``machine``: its slice of the plan (JSON form) as compact JSON; None for
    a Machine attached to no network (it gets no label)."""
    entries = [m for m in plan.get("machines", []) if isinstance(m, Mapping) and m.get("name") == machine]
    if len(entries) != 1:
        raise PlanError(f"{machine!r} is not a Machine of this plan")
    entry = entries[0]
    if not entry["attachments"]:
        return None
    names = {a["network"] for a in entry["attachments"]}
    piece = {
        "format": plan["format"],
        "environment_id": plan["environment_id"],
        "route_domain": plan["route_domain"],
        "networks": [
            {"name": n["name"], "subnet": n["subnet"], "gateway": n["gateway"], "machines": [machine]}
            for n in plan["networks"]
            if n["name"] in names
        ],
        "machines": [
            {
                "name": machine,
                "attachments": entry["attachments"],
                "dns_server": entry["dns_server"],
                "search": entry["search"],
                "egress": entry["egress"],
            }
        ],
        "forward": [],
        "input": [],
    }
    return json.dumps(piece, sort_keys=True, separators=(",", ":"))


def _bad(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"label {LABEL}: {message}", details={"field": "labels", "label": LABEL})


def parse_machine_slice(labels: Mapping[str, str]) -> MachineSlice | None:
    """The Machine's slice from its labels (None: no ``vz.network`` label, the driver's own networking).

    Checked whole, with the checks ``vz_core.network`` applies to any plan plus the slice's own (one Machine,
    attached, no rules, its DNS server one of its gateways, search domains, the Machine's Environment when the
    ownership label says it); InvalidArgumentError naming the problem otherwise, before anything is touched."""
    text = labels.get(LABEL)
    if text is None:
        return None
    if len(text) > MAX_LABEL:
        raise _bad(f"{len(text)} characters is longer than {MAX_LABEL}; it carries one Machine's slice of the plan")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _bad(f"not JSON ({exc}); it is the Machine's slice of the topology plan (docs/network.md)") from None
    if not isinstance(data, dict):
        raise _bad("expected a JSON object (the Machine's slice of the topology plan)")
    try:
        spec = DomainSpec.from_plan(data)
    except PlanError as exc:
        raise _bad(exc.message) from None
    machines = data["machines"]
    if len(machines) != 1:
        raise _bad(f"$.machines: {len(machines)} Machines; a slice holds exactly the one Machine it is given to")
    entry = machines[0]
    name = str(entry["name"])
    if not spec.attachments:
        raise _bad(f"$.machines[0].attachments: {name!r} has none (a Machine attached to no network gets no label)")
    for i, net in enumerate(data["networks"]):
        if net.get("machines") != [name]:
            raise _bad(f"$.networks[{i}].machines: {net.get('machines')!r}; a slice's networks list only {name!r}")
    if data["forward"] or data["input"]:
        raise _bad("$.forward/$.input: a slice carries no rules (the route domain holds them)")
    environment_id = data["environment_id"]
    if ENVIRONMENT_LABEL in labels and labels[ENVIRONMENT_LABEL] != environment_id:
        raise _bad(
            f"$.environment_id: {environment_id!r} is not the Machine's Environment ({labels[ENVIRONMENT_LABEL]!r})"
        )
    dns = entry.get("dns_server")
    if dns not in {str(a.gateway) for a in spec.attachments}:
        raise _bad(f"$.machines[0].dns_server: {dns!r} is not a gateway of the Machine's attachments")
    search = entry.get("search")
    if (
        not isinstance(search, list)
        or not search
        or not all(isinstance(x, str) and _SEARCH_RE.fullmatch(x) for x in search)
    ):
        raise _bad(f"$.machines[0].search: {search!r} is not a non-empty list of domain names")
    return MachineSlice(data, spec, name, str(dns), tuple(search))
