"""The topology plan: a project definition + an Environment id compiled into the network it must have.

``compile_topology(definition, environment_id)`` is pure and deterministic (the same input gives the same plan,
byte for byte in its JSON form) and does no I/O. The plan says, for one Environment:

* its **route domain** (``vzd-<12 characters of the environment id>``): the kernel object that isolates the
  Environment (a network namespace on Linux, ``vz_core.network``). Every Environment has its own, so address
  ranges may overlap between Environments;
* each **network**: its subnet (declared, or a /24 of 10.89.0.0/16 chosen from the network's name) and its
  gateway, the Environment's own address on that network (its DNS resolver and import relays live there);
* each **Machine**: its attachments (network, address, interface names on both ends), its DNS server and the
  DNS records it may see (itself, the Machines it has a path to and their services, ``host.vz.internal`` when it
  imports something), the inbound services and from which sources, its egress policy;
* the **forward rules** (source interface + address → destination interface + address, protocol, port: exactly
  the declared paths) and the **input rules** (what a Machine may send to the gateway: DNS, its imports);
* **exports** with the ordered host ports to try on 127.0.0.1 (stable for one Environment) and **imports**.

Addresses and interface names are derived from names with a hash and linear probing in sorted order, so adding
a Machine or a network does not move the others. A version 1 definition has no route domain: its plan has
``route_domain`` null and only the egress of each Machine (the drivers keep their version 1 networking).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from vz_core.env._ids import ENV_ID_RE

if TYPE_CHECKING:
    from vz_core.env._definition import ProjectDefinition
    from vz_core.env._machines import EgressPolicy, Machine, NetworkPath, Service

__all__ = [
    "DEFAULT_POOL",
    "DNS_ZONE",
    "PLAN_FORMAT",
    "Attachment",
    "DnsRecord",
    "ExportPlan",
    "ForwardRule",
    "ImportPlan",
    "InboundService",
    "InputRule",
    "MachinePlan",
    "NetworkPlan",
    "Source",
    "TopologyPlan",
    "compile_topology",
    "domain_name",
]

PLAN_FORMAT = 1
"""Version of the plan's JSON form (independent of the vz.json version)."""
DEFAULT_POOL = ipaddress.IPv4Network("10.89.0.0/16")
"""Where networks without a declared subnet get their /24 (inside the route domain only: never on the host)."""
DNS_ZONE = "vz.internal"
HOST_NAMES = ("host.vz.internal", "host.docker.internal")
"""Names of the host's imports relay; they exist only for Machines that declared an import."""
FALLBACK_PORTS = range(20000, 32768)
"""Host ports an export falls back to, below Linux's ephemeral range (32768-60999)."""
FALLBACK_COUNT = 4


def _digest(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x00".join(parts).encode()).digest()[:8], "big")


def domain_name(environment_id: str) -> str:
    """The route domain of an Environment: ``vzd-`` + the 12 characters of its id (15 at most: an ifname fits)."""
    if not ENV_ID_RE.fullmatch(environment_id):
        raise ValueError(f"{environment_id!r} is not an environment id (env_ + 12 characters)")
    return "vzd-" + environment_id[4:]


@dataclass(frozen=True)
class NetworkPlan:
    name: str
    subnet: str
    gateway: str
    machines: tuple[str, ...]


@dataclass(frozen=True)
class Attachment:
    """One Machine on one network: its address, the interface inside the Machine and the domain's end."""

    network: str
    address: str
    prefixlen: int
    gateway: str
    machine_ifname: str
    domain_ifname: str


@dataclass(frozen=True)
class Source:
    machine: str
    network: str
    address: str


@dataclass(frozen=True)
class InboundService:
    service: str
    protocol: str
    port: int
    sources: tuple[Source, ...]
    exported: bool


@dataclass(frozen=True)
class DnsRecord:
    name: str
    type: Literal["A", "SRV"]
    address: str | None = None
    port: int | None = None
    target: str | None = None


@dataclass(frozen=True)
class MachinePlan:
    name: str
    attachments: tuple[Attachment, ...]
    dns_server: str | None
    search: tuple[str, ...]
    dns: tuple[DnsRecord, ...]
    inbound: tuple[InboundService, ...]
    egress: dict[str, Any]


@dataclass(frozen=True)
class ForwardRule:
    """One allowed new flow through the route domain: a declared path on one shared network."""

    source_machine: str
    source_ifname: str
    source_address: str
    dest_machine: str
    dest_ifname: str
    dest_address: str
    protocol: str
    port: int


@dataclass(frozen=True)
class InputRule:
    """One allowed new flow from a Machine to the route domain's own address (DNS, an import relay)."""

    machine: str
    ifname: str
    address: str
    gateway: str
    protocol: str
    port: int
    purpose: Literal["dns", "import"]


@dataclass(frozen=True)
class ExportPlan:
    machine: str
    service: str
    protocol: str
    port: int
    network: str
    machine_address: str
    host_address: str
    host_ports: tuple[int, ...]
    declared_host_port: int | None


@dataclass(frozen=True)
class ImportPlan:
    machine: str
    protocol: str
    host_address: str
    host_port: int
    port: int
    relay_addresses: tuple[str, ...]


@dataclass(frozen=True)
class TopologyPlan:
    environment_id: str
    project_id: str
    definition_version: int
    route_domain: str | None
    networks: tuple[NetworkPlan, ...]
    machines: tuple[MachinePlan, ...]
    forward: tuple[ForwardRule, ...]
    input: tuple[InputRule, ...]
    exports: tuple[ExportPlan, ...]
    imports: tuple[ImportPlan, ...]
    format: int = field(default=PLAN_FORMAT)

    def to_json(self) -> dict[str, Any]:
        """The plan as plain JSON values (what ``vz_core.network`` reads)."""
        data: dict[str, Any] = json.loads(json.dumps(asdict(self)))
        return data

    def dumps(self) -> str:
        """The canonical text of the plan: the same plan gives the same bytes."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def machine(self, name: str) -> MachinePlan:
        for m in self.machines:
            if m.name == name:
                return m
        raise KeyError(name)


# --- allocation ---------------------------------------------------------------------------------------------


def _subnets(definition: ProjectDefinition) -> dict[str, ipaddress.IPv4Network]:
    """Declared subnets as given; the others a /24 of DEFAULT_POOL from the name's hash, probing past taken ones."""
    networks = definition.effective_networks()
    out = {n.name: ipaddress.IPv4Network(n.subnet) for n in networks if n.subnet is not None}
    taken = list(out.values())
    blocks = list(DEFAULT_POOL.subnets(new_prefix=24))
    for net in sorted(n.name for n in networks if n.subnet is None):
        start = _digest("network", net) % len(blocks)
        for step in range(len(blocks)):
            block = blocks[(start + step) % len(blocks)]
            if not any(block.overlaps(t) for t in taken):
                out[net] = block
                taken.append(block)
                break
        else:  # pragma: no cover - 64 networks at most (the definition's limit) never fill 256 blocks
            raise ValueError(f"no free /24 left in {DEFAULT_POOL} for network {net!r}")
    return out


def _addresses(network: str, subnet: ipaddress.IPv4Network, members: list[str]) -> dict[str, str]:
    """Machine → address: gateway is the first host, Machines from the name's hash, probing in sorted order."""
    first = int(subnet.network_address) + 2
    room = subnet.num_addresses - 3
    used: set[int] = set()
    out: dict[str, str] = {}
    for name in sorted(members):
        start = _digest("address", network, name) % room
        for step in range(room):
            offset = (start + step) % room
            if offset not in used:
                used.add(offset)
                out[name] = str(ipaddress.IPv4Address(first + offset))
                break
    return out


def _ifnames(pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(machine, network) → the domain end's interface name: ``v`` + 10 hex digits, unique in the domain."""
    out: dict[tuple[str, str], str] = {}
    used: set[str] = set()
    for machine, network in sorted(pairs):
        salt = 0
        while True:
            name = "v" + hashlib.sha256(f"{machine}/{network}/{salt}".encode()).hexdigest()[:10]
            if name not in used:
                break
            salt += 1  # pragma: no cover - a 40-bit collision
        used.add(name)
        out[(machine, network)] = name
    return out


def _target(definition: ProjectDefinition, path: NetworkPath) -> Service:
    dest = definition.machine(path.to)
    if path.service is not None:
        return dest.service(path.service)
    protocol = path.protocol or "tcp"
    return next(s for s in dest.services if (s.protocol, s.port) == (protocol, path.port))


def _host_ports(environment_id: str, machine: str, service: Service, declared: int | None) -> tuple[int, ...]:
    preferred = declared if declared is not None else (service.port if service.port >= 1024 else None)
    out: list[int] = [preferred] if preferred is not None else []
    salt = 0
    while len(out) < FALLBACK_COUNT + (1 if preferred is not None else 0):
        digest = _digest("export", environment_id, machine, service.name, str(salt))
        port = FALLBACK_PORTS[digest % len(FALLBACK_PORTS)]
        if port not in out:
            out.append(port)
        salt += 1
    return tuple(out)


@dataclass
class _Layout:
    """Where each Machine sits: the networks' plans, each Machine's address and interface on each of its networks
    (``address`` and ``ifnames`` keyed by (machine, network)), its networks in definition order, its attachments."""

    networks: list[NetworkPlan]
    address: dict[tuple[str, str], str]
    ifnames: dict[tuple[str, str], str]
    member_of: dict[str, list[str]]
    attachments: dict[str, tuple[Attachment, ...]]

    def shared(self, a: str, b: str) -> list[str]:
        return [n for n in self.member_of[a] if n in self.member_of[b]]


@dataclass
class _Reach:
    """What the declared paths allow: the forward rules, each service's sources, and whom each Machine reaches."""

    forward: set[ForwardRule]
    sources: dict[tuple[str, str, int], set[Source]]
    reach: dict[str, dict[str, set[tuple[str, str, int]]]]


def compile_topology(definition: ProjectDefinition, environment_id: str) -> TopologyPlan:
    """The topology plan of one Environment of ``definition`` (already validated by ``parse_definition``)."""
    domain = domain_name(environment_id)
    if definition.version == 1:
        machines = tuple(
            MachinePlan(m.name, (), None, (), (), (), _egress(m.egress_policy)) for m in definition.machines
        )
        return TopologyPlan(environment_id, definition.project_id, 1, None, (), machines, (), (), (), ())
    layout = _layout(definition)
    reach = _reach(definition, layout)
    imports_of: dict[str, list[ImportPlan]] = {m.name: [] for m in definition.machines}
    import_plans: list[ImportPlan] = []
    for item in definition.imports:
        plan = ImportPlan(
            machine=item.machine,
            protocol=item.protocol,
            host_address=item.host_address,
            host_port=item.host_port,
            port=item.machine_port,
            relay_addresses=tuple(a.gateway for a in layout.attachments[item.machine]),
        )
        imports_of[item.machine].append(plan)
        import_plans.append(plan)
    exported = {(e.machine, e.service) for e in definition.exports}
    input_rules: set[InputRule] = set()
    machine_plans = [
        _machine_plan(m, layout, reach, imports_of[m.name], exported, input_rules) for m in definition.machines
    ]
    return TopologyPlan(
        environment_id=environment_id,
        project_id=definition.project_id,
        definition_version=definition.version,
        route_domain=domain,
        networks=tuple(layout.networks),
        machines=tuple(machine_plans),
        forward=tuple(sorted(reach.forward, key=_rule_key)),
        input=tuple(sorted(input_rules, key=lambda r: (r.ifname, r.protocol, r.port, r.purpose))),
        exports=tuple(_export_plans(definition, layout, environment_id)),
        imports=tuple(import_plans),
    )


def _layout(definition: ProjectDefinition) -> _Layout:
    networks = definition.effective_networks()
    subnets = _subnets(definition)
    net_plans: list[NetworkPlan] = []
    address: dict[tuple[str, str], str] = {}
    for net in networks:
        subnet = subnets[net.name]
        gateway = str(subnet.network_address + 1)
        for name, addr in _addresses(net.name, subnet, net.machines).items():
            address[(name, net.name)] = addr
        net_plans.append(NetworkPlan(net.name, str(subnet), gateway, tuple(net.machines)))
    gateways = {n.name: n.gateway for n in net_plans}
    ifnames = _ifnames(list(address))
    member_of: dict[str, list[str]] = {m.name: [] for m in definition.machines}
    for net in networks:  # definition order: the first network is eth0 and carries the DNS server
        for name in net.machines:
            member_of[name].append(net.name)
    attachments: dict[str, tuple[Attachment, ...]] = {}
    for m in definition.machines:
        attachments[m.name] = tuple(
            Attachment(
                network=net,
                address=address[(m.name, net)],
                prefixlen=subnets[net].prefixlen,
                gateway=gateways[net],
                machine_ifname=f"eth{i}",
                domain_ifname=ifnames[(m.name, net)],
            )
            for i, net in enumerate(member_of[m.name])
        )
    return _Layout(net_plans, address, ifnames, member_of, attachments)


def _reach(definition: ProjectDefinition, layout: _Layout) -> _Reach:
    address, ifnames = layout.address, layout.ifnames
    out = _Reach(set(), {}, {m.name: {} for m in definition.machines})
    for path in definition.paths:
        target = _target(definition, path)
        for via in layout.shared(path.source, path.to):
            src, dst = (path.source, via), (path.to, via)
            out.forward.add(
                ForwardRule(
                    path.source,
                    ifnames[src],
                    address[src],
                    path.to,
                    ifnames[dst],
                    address[dst],
                    target.protocol,
                    target.port,
                )
            )
            out.sources.setdefault((path.to, target.protocol, target.port), set()).add(
                Source(path.source, via, address[src])
            )
        out.reach[path.source].setdefault(path.to, set()).add((target.name, target.protocol, target.port))
    return out


def _machine_plan(
    m: Machine,
    layout: _Layout,
    reach: _Reach,
    imports: list[ImportPlan],
    exported: set[tuple[str, str]],
    input_rules: set[InputRule],
) -> MachinePlan:
    """One Machine's plan; its input rules (DNS, its imports' relays) are added to ``input_rules``."""
    own = layout.attachments[m.name]
    for att in own:
        for proto in ("udp", "tcp"):
            input_rules.add(InputRule(m.name, att.domain_ifname, att.address, att.gateway, proto, 53, "dns"))
        for imp in imports:
            input_rules.add(
                InputRule(m.name, att.domain_ifname, att.address, att.gateway, imp.protocol, imp.port, "import")
            )
    records: list[DnsRecord] = []
    if own:
        records.append(DnsRecord(f"{m.name}.{DNS_ZONE}", "A", address=own[0].address))
    for peer in sorted(reach.reach[m.name]):
        first_shared = layout.shared(m.name, peer)[0]
        fqdn = f"{peer}.{DNS_ZONE}"
        records.append(DnsRecord(fqdn, "A", address=layout.address[(peer, first_shared)]))
        for svc_name, proto, port in sorted(reach.reach[m.name][peer]):
            records.append(DnsRecord(f"_{svc_name}._{proto}.{fqdn}", "SRV", port=port, target=fqdn))
    if imports and own:
        records.extend(DnsRecord(name, "A", address=own[0].gateway) for name in HOST_NAMES)
    inbound = tuple(
        InboundService(
            service=s.name,
            protocol=s.protocol,
            port=s.port,
            sources=tuple(
                sorted(reach.sources.get((m.name, s.protocol, s.port), set()), key=lambda x: (x.machine, x.network))
            ),
            exported=(m.name, s.name) in exported,
        )
        for s in m.services
    )
    return MachinePlan(
        name=m.name,
        attachments=own,
        dns_server=own[0].gateway if own else None,
        search=(DNS_ZONE,) if own else (),
        dns=tuple(records),
        inbound=inbound,
        egress=_egress(m.egress_policy),
    )


def _export_plans(definition: ProjectDefinition, layout: _Layout, environment_id: str) -> list[ExportPlan]:
    export_plans: list[ExportPlan] = []
    for export in definition.exports:
        owner = definition.machine(export.machine)
        svc = owner.service(export.service)
        att = layout.attachments[export.machine][0]
        export_plans.append(
            ExportPlan(
                machine=export.machine,
                service=export.service,
                protocol=svc.protocol,
                port=svc.port,
                network=att.network,
                machine_address=att.address,
                host_address="127.0.0.1",
                host_ports=_host_ports(environment_id, export.machine, svc, export.host_port),
                declared_host_port=export.host_port,
            )
        )
    return export_plans


def _rule_key(rule: ForwardRule) -> tuple[str, str, str, int]:
    return (rule.source_ifname, rule.dest_ifname, rule.protocol, rule.port)


def _egress(policy: EgressPolicy) -> dict[str, Any]:
    return policy.to_json()
