"""A version 2 Machine's attachment to its Environment's route domain (docs/network.md, "linux_native attachment").

The Environment layer compiles the topology plan, creates the route domain (``vz_core.network.ensure_domain``)
and passes each Machine its slice of the plan as the RunImage label ``vz.network``: the compact JSON of a plan
holding only that Machine (so ``DomainSpec.from_plan`` and ``attach_machine`` read it unchanged)::

    {"format": 1, "environment_id": "env_…", "route_domain": "vzd-…",
     "networks": [{"name", "subnet", "gateway", "machines": [m]}, …],          # the Machine's networks only
     "machines": [{"name": m, "attachments": [{"network", "address", "prefixlen", "gateway",
                                               "machine_ifname", "domain_ifname"}, …],
                   "dns_server": "10.89.242.1", "search": ["vz.internal"], "egress": {…}}],
     "forward": [], "input": []}

The driver advertises that it reads the label with the Extensions fact ``topology`` (``FACT_KEY``). A Machine
with the label is, between ``runc create`` and ``runc start`` (its namespace exists, its process has not run
yet), joined to the domain by ``vz_core.network.attach_machine`` on ``/proc/<pid>/ns/net`` instead of getting the
driver's own ``allow``/``deny`` networking (``_network.setup_network``), and its ``/etc/resolv.conf`` names the
plan's DNS server. Every start re-attaches (the container, and so its namespace, is new at each start: the
pair is created again, idempotently); releasing a start (stop, delete, a failed start) detaches it, so no
domain end outlives its Machine. The kernel of the domain, not the Machine, decides what connects: a Machine
with the label has no link but its attachments (no route to the host, no host-wide pool, no masquerade).

The label is read and checked whole (``network_slice``) when RunImage is validated, before anything is
created: a damaged label is refused naming what is wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vz_core.errors import InvalidArgumentError
from vz_core.network import DomainSpec, PlanError, attach_machine, detach_machine
from vz_drivers.linux_native._network import NetworkConfig, setup_network

__all__ = [
    "FACT",
    "FACT_KEY",
    "LABEL",
    "NetworkSlice",
    "connect_machine",
    "disconnect_machine",
    "network_slice",
    "resolv_conf_for",
]

LABEL = "vz.network"
FACT_KEY = "topology"
FACT = (
    "route-domain attachment: a RunImage label vz.network=<the Machine's topology plan slice as JSON> joins the "
    "Machine to the Environment's route domain (vz_core.network; created by the caller before RunImage) instead "
    "of the driver's egress networking; resolv.conf names the plan's DNS server (docs/network.md)"
)
MAX_LABEL = 8192
_ENV_LABEL = "dev.vz.environment"
_SEARCH_RE = re.compile(r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def _bad(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"label {LABEL}: {message}", details={"field": "labels", "label": LABEL})


@dataclass(frozen=True)
class NetworkSlice:
    """One Machine's part of its Environment's topology plan, as carried by the ``vz.network`` label."""

    plan: dict[str, Any]
    spec: DomainSpec
    machine: str
    dns_server: str
    search: tuple[str, ...]

    def resolv_conf(self) -> str:
        return f"nameserver {self.dns_server}\nsearch {' '.join(self.search)}\n"


def network_slice(labels: Mapping[str, str]) -> NetworkSlice | None:
    """The Machine's slice from its labels (None: no ``vz.network`` label, the driver's own networking).

    Checked whole, with the checks ``vz_core.network`` applies to any plan plus the slice's own (one Machine,
    attached, no rules, its DNS server one of its gateways); InvalidArgumentError naming the problem otherwise."""
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
    name = entry["name"]
    if not spec.attachments:
        raise _bad(f"$.machines[0].attachments: {name!r} has none (a Machine attached to no network gets no label)")
    if data["forward"] or data["input"]:
        raise _bad("$.forward/$.input: a slice carries no rules (the route domain holds them)")
    environment_id = data["environment_id"]
    if _ENV_LABEL in labels and labels[_ENV_LABEL] != environment_id:
        raise _bad(f"$.environment_id: {environment_id!r} is not the Machine's Environment ({labels[_ENV_LABEL]!r})")
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
    return NetworkSlice(data, spec, name, str(dns), tuple(search))


async def connect_machine(cfg: NetworkConfig, *, pid: int, key: str, egress: str, labels: Mapping[str, str]) -> None:
    """Network of the created, not yet started container whose init is ``pid``.

    With a ``vz.network`` label: its attachments to the route domain (which must exist; the Environment layer
    creates it before RunImage and before every start). Without: the driver's own ``allow``/``deny`` networking.
    """
    found = network_slice(labels)
    if found is None:
        await setup_network(cfg, pid=pid, key=key, egress=egress)
        return
    await attach_machine(found.plan, found.machine, f"/proc/{pid}/ns/net")


async def disconnect_machine(labels: Mapping[str, str]) -> None:
    """Remove a released Machine's domain ends (idempotent; nothing for a Machine without the label)."""
    found = network_slice(labels)
    if found is not None:
        await detach_machine(found.plan, found.machine)


def resolv_conf_for(labels: Mapping[str, str], default: str) -> str:
    """The Machine's /etc/resolv.conf: the plan's DNS server and search domain, else ``default``."""
    found = network_slice(labels)
    return default if found is None else found.resolv_conf()
