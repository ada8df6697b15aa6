"""Cross-references of the network declarations (version 2; docs/network.md): what one field's validator cannot
see. ``network_problems`` lists every problem as (JSON path, message); ``unreachable_problems`` adds what no
driver of the Machines named could honour."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vz_core.env._fields import AUTO_POOL, AUTO_ROOM, MAX_ATTACHMENTS, NETWORK_FIELDS, RESERVED_PORTS
from vz_core.env._machines import EgressAllowlist, Machine, Service
from vz_core.env._topology import compile_topology
from vz_core.network.label import MAX_LABEL, machine_slice

if TYPE_CHECKING:
    from vz_core.env._definition import ProjectDefinition

__all__ = ["network_problems", "unreachable_problems"]

Problems = list[tuple[str, str]]

_V2_HINT = 'set "version": 2 (docs/network.md says what changes from version 1)'


def _spelled(item: Service) -> str:
    return f"{item.name} {item.protocol}/{item.port}"


def _services_text(machine: Machine) -> str:
    return ", ".join(_spelled(s) for s in machine.services) or "none declared"


@dataclass
class _Scope:
    """What the checks of one version 2 definition share: its Machines, the networks each attaches to, the host
    ports its exports take, and the problems found so far."""

    definition: ProjectDefinition
    machines: dict[str, Machine]
    out: Problems = field(default_factory=list)
    attached: dict[str, set[str]] = field(default_factory=dict)
    subnets: list[tuple[ipaddress.IPv4Network, int]] = field(default_factory=list)
    host_ports: dict[tuple[str, int], int] = field(default_factory=dict)

    def unknown(self, name: str) -> str:
        return f"unknown Machine {name!r} (machines: {', '.join(self.machines)})"

    def add(self, path: str, message: str) -> None:
        self.out.append((path, message))


def network_problems(definition: ProjectDefinition) -> Problems:
    """Every problem of the network declarations as (JSON path, message); empty when they are consistent.

    Version 1: the version 2 fields are refused (never ignored) and egress is ``allow`` or ``deny``. Version 2:
    names unique, every reference resolves (Machines, services, networks), paths go to declared ports of
    Machines sharing a network, exports do not overlap, imports reach host loopback only."""
    if definition.version == 1:
        return _version1_problems(definition)
    scope = _Scope(definition, {m.name: m for m in definition.machines})
    scope.attached = {name: set() for name in scope.machines}
    _machine_problems(scope)
    _declared_networks(scope)
    _network_capacity(scope)
    _path_problems(scope)
    _export_problems(scope)
    _attachment_problems(scope)
    _import_problems(scope)
    if not scope.out:
        scope.out.extend(_label_problems(definition))
    return scope.out


def _version1_problems(definition: ProjectDefinition) -> Problems:
    out: Problems = []
    for key in NETWORK_FIELDS:
        if key in definition.model_fields_set:
            out.append((f"$.{key}", f"{key} needs version 2 of vz.json; {_V2_HINT}"))
    for i, m in enumerate(definition.machines):
        if "services" in m.model_fields_set:
            out.append((f"$.machines[{i}].services", f"services need version 2 of vz.json; {_V2_HINT}"))
        if isinstance(m.egress_declared, EgressAllowlist) or m.egress_declared in ("offline", "allowed"):
            shown = "an allowlist" if isinstance(m.egress_declared, EgressAllowlist) else repr(m.egress_declared)
            out.append(
                (
                    f"$.machines[{i}].egress",
                    f"{shown} is version 2 egress; version 1 reads 'allow' or 'deny' ({_V2_HINT})",
                )
            )
    return out


def _machine_problems(scope: _Scope) -> None:
    for i, m in enumerate(scope.definition.machines):
        where = f"$.machines[{i}]"
        if m.name == "host":
            scope.add(
                f"{where}.name",
                "'host' is reserved in version 2: host.vz.internal is the Environment's relay of the host's "
                "imports; give the Machine another name",
            )
        if m.egress_declared in ("allow", "deny"):
            new = "allowed" if m.egress_declared == "allow" else "offline"
            scope.add(
                f"{where}.egress",
                f"{m.egress_declared!r} is the version 1 spelling; version 2 reads {new!r} "
                '("offline", the default, "allowed" or {"allow": [CIDRs, domain names]})',
            )
        names: dict[str, int] = {}
        ports: dict[tuple[str, int], int] = {}
        for j, svc in enumerate(m.services):
            if svc.name in names:
                scope.add(f"{where}.services[{j}].name", f"service {svc.name!r} is already services[{names[svc.name]}]")
            names.setdefault(svc.name, j)
            port_key = (svc.protocol, svc.port)
            if port_key in ports:
                scope.add(
                    f"{where}.services[{j}].port", f"{svc.protocol}/{svc.port} is already services[{ports[port_key]}]"
                )
            ports.setdefault(port_key, j)


def _declared_networks(scope: _Scope) -> None:
    """Network names unique, members known and unrepeated, subnets disjoint and large enough."""
    seen_networks: dict[str, int] = {}
    for i, net in enumerate(scope.definition.networks):
        where = f"$.networks[{i}]"
        if net.name in seen_networks:
            scope.add(f"{where}.name", f"network {net.name!r} is already networks[{seen_networks[net.name]}]")
        seen_networks.setdefault(net.name, i)
        members: dict[str, int] = {}
        for j, name in enumerate(net.machines):
            if name not in scope.machines:
                scope.add(f"{where}.machines[{j}]", scope.unknown(name))
            elif name in members:
                scope.add(f"{where}.machines[{j}]", f"{name!r} is already machines[{members[name]}]")
            else:
                scope.attached[name].add(net.name)
            members.setdefault(name, j)
        if net.subnet is not None:
            subnet = ipaddress.IPv4Network(net.subnet)
            for other, k in scope.subnets:
                if subnet.overlaps(other):
                    scope.add(f"{where}.subnet", f"{subnet} overlaps networks[{k}].subnet {other}")
            scope.subnets.append((subnet, i))
            room = subnet.num_addresses - 3  # network, gateway, broadcast
            if len(members) > room:
                scope.add(f"{where}.subnet", f"{subnet} has room for {room} Machines, {len(members)} attach")
    if not scope.definition.networks:
        for name in scope.attached:
            scope.attached[name].add("default")
        if len(scope.machines) > AUTO_ROOM:
            scope.add(
                "$.machines",
                f"{len(scope.machines)} Machines on the automatic network 'default' (a /24 of {AUTO_POOL}, room for "
                f"{AUTO_ROOM}); declare $.networks with a larger 'subnet'",
            )


def _network_capacity(scope: _Scope) -> None:
    """Attachments per Machine bounded, automatic subnets large enough and still free in the pool."""
    memberships: dict[str, int] = {}
    for i, net in enumerate(scope.definition.networks):
        for j, name in enumerate(dict.fromkeys(net.machines)):
            if name not in scope.machines:
                continue
            memberships[name] = memberships.get(name, 0) + 1
            if memberships[name] == MAX_ATTACHMENTS + 1:
                scope.add(
                    f"$.networks[{i}].machines[{j}]",
                    f"{name!r} would attach to more than {MAX_ATTACHMENTS} networks (each is an interface of the "
                    "Machine); attach it to fewer",
                )
        if net.subnet is None and len(set(net.machines)) > AUTO_ROOM:
            scope.add(
                f"$.networks[{i}].machines",
                f"{len(set(net.machines))} Machines on network {net.name!r}, whose automatic subnet (a /24 of "
                f"{AUTO_POOL}) has room for {AUTO_ROOM}; declare a larger 'subnet'",
            )
    automatic = sorted((net.name, i) for i, net in enumerate(scope.definition.networks) if net.subnet is None)
    if automatic:
        declared = [s for s, _ in scope.subnets]
        free = sum(1 for block in AUTO_POOL.subnets(new_prefix=24) if not any(block.overlaps(d) for d in declared))
        for name, i in automatic[free:]:  # allocation goes by name: the last ones would find no /24 left
            scope.add(
                f"$.networks[{i}].subnet",
                f"network {name!r} has no 'subnet' and the declared subnets leave no free /24 of {AUTO_POOL} "
                "for it; declare its 'subnet'",
            )


def _path_problems(scope: _Scope) -> None:
    seen_paths: dict[tuple[str, str, str, int], int] = {}
    for i, path in enumerate(scope.definition.paths):
        where = f"$.paths[{i}]"
        source, dest = scope.machines.get(path.source), scope.machines.get(path.to)
        if source is None:
            scope.add(f"{where}.from", scope.unknown(path.source))
        if dest is None:
            scope.add(f"{where}.to", scope.unknown(path.to))
        if path.source == path.to:
            scope.add(f"{where}.to", f"{path.to!r} reaches its own services on loopback; a path joins two Machines")
            continue
        if path.protocol is not None and path.port is None:
            scope.add(f"{where}.protocol", "protocol goes with port (or name the service)")
        if (path.service is None) == (path.port is None):
            scope.add(where, "name the destination service with 'service' or with 'port' (and 'protocol'), not both")
            continue
        if dest is None or source is None:
            continue
        target = _path_target(scope, where, path.to, dest, path.service, path.protocol, path.port)
        if target is None:
            continue
        if not scope.attached[path.source] & scope.attached[path.to]:
            scope.add(
                where, f"{path.source!r} and {path.to!r} share no network; attach both to one network in $.networks"
            )
        path_key = (path.source, path.to, target.protocol, target.port)
        if path_key in seen_paths:
            scope.add(where, f"the same path as paths[{seen_paths[path_key]}]")
        seen_paths.setdefault(path_key, i)


def _path_target(
    scope: _Scope, where: str, to: str, dest: Machine, service: str | None, protocol: str | None, port: int | None
) -> Service | None:
    """The service a path names (by name, or by protocol and port), or None with the problem recorded."""
    if service is not None:
        try:
            return dest.service(service)
        except KeyError:
            scope.add(f"{where}.service", f"{to!r} declares no service {service!r} ({_services_text(dest)})")
            return None
    protocol = protocol or "tcp"
    target = next((s for s in dest.services if (s.protocol, s.port) == (protocol, port)), None)
    if target is None:
        scope.add(
            f"{where}.port",
            f"{to!r} declares no {protocol} service on port {port} ({_services_text(dest)}); "
            f"declare it in machines[].services first",
        )
    return target


def _export_problems(scope: _Scope) -> None:
    exported: dict[tuple[str, str], int] = {}
    host_ports = scope.host_ports
    implicit: list[tuple[int, str, int]] = []
    for i, export in enumerate(scope.definition.exports):
        where = f"$.exports[{i}]"
        owner = scope.machines.get(export.machine)
        if owner is None:
            scope.add(f"{where}.machine", scope.unknown(export.machine))
            continue
        try:
            svc = owner.service(export.service)
        except KeyError:
            scope.add(
                f"{where}.service",
                f"{export.machine!r} declares no service {export.service!r} ({_services_text(owner)})",
            )
            continue
        export_key = (export.machine, export.service)
        if export_key in exported:
            first = exported[export_key]
            scope.add(where, f"{export.machine} {export.service} is already exported by exports[{first}]")
        exported.setdefault(export_key, i)
        if export.host_port is not None:
            port_key = (svc.protocol, export.host_port)
            if port_key in host_ports:
                scope.add(
                    f"{where}.host_port",
                    f"{svc.protocol}/{export.host_port} on the host is already exports[{host_ports[port_key]}]",
                )
            host_ports.setdefault(port_key, i)
        elif svc.port >= 1024:
            implicit.append((i, svc.protocol, svc.port))
    # An export without host_port prefers its service port: another export preferring the same port makes the
    # outcome depend on the order they start in, so it is refused like two declared host ports.
    for i, svc_protocol, svc_port in implicit:
        earlier = host_ports.get((svc_protocol, svc_port))
        if earlier is not None:
            scope.add(
                f"$.exports[{i}]",
                f"prefers {svc_protocol}/{svc_port} on the host (its service port, no host_port given), which "
                f"exports[{earlier}] also prefers; give it a host_port of its own",
            )
        host_ports.setdefault((svc_protocol, svc_port), i)


def _attachment_problems(scope: _Scope) -> None:
    """Exports and imports of Machines attached to no network: both live in the Environment's route domain."""
    attached = scope.attached
    for i, export in enumerate(scope.definition.exports):
        if export.machine in attached and not attached[export.machine]:
            scope.add(
                f"$.exports[{i}].machine",
                f"{export.machine!r} is attached to no network; an export reaches it through the Environment's "
                "route domain: attach it in $.networks",
            )
    for i, item in enumerate(scope.definition.imports):
        if item.machine in attached and not attached[item.machine]:
            scope.add(
                f"$.imports[{i}].machine",
                f"{item.machine!r} is attached to no network; an import's relay lives in the Environment's route "
                "domain: attach it in $.networks",
            )


def _import_problems(scope: _Scope) -> None:
    imported: dict[tuple[str, str, int], int] = {}
    relays: dict[tuple[str, int], tuple[str, int, int]] = {}
    for i, item in enumerate(scope.definition.imports):
        where = f"$.imports[{i}]"
        if item.machine not in scope.machines:
            scope.add(f"{where}.machine", scope.unknown(item.machine))
            continue
        port = item.machine_port
        if port in RESERVED_PORTS:
            key = "port" if item.port is not None else "host_port"
            scope.add(f"{where}.{key}", f"port {port} of host.vz.internal is the Environment's DNS; set another 'port'")
        import_key = (item.machine, item.protocol, port)
        if import_key in imported:
            scope.add(where, f"{item.machine} already imports {item.protocol}/{port} (imports[{imported[import_key]}])")
        imported.setdefault(import_key, i)
        relay = (item.protocol, port)
        host = (item.host_address, item.host_port, i)
        if relay in relays and relays[relay][:2] != host[:2]:
            first = relays[relay]
            scope.add(
                f"{where}.port",
                f"{item.protocol}/{port} at host.vz.internal already carries {first[0]}:{first[1]} "
                f"(imports[{first[2]}]); choose another 'port'",
            )
        relays.setdefault(relay, host)
        looped = scope.host_ports.get((item.protocol, item.host_port))
        if item.host_address == "127.0.0.1" and looped is not None:
            scope.add(
                f"{where}.host_port",
                f"127.0.0.1 {item.protocol}/{item.host_port} is where exports[{looped}] listens: the import would "
                "lead back into this Environment; declare a path to that Machine's service instead",
            )


_PLACEHOLDER_ID = "env_000000000000"


def unreachable_problems(definition: ProjectDefinition, attaching: set[str]) -> list[tuple[str, str]]:
    """Network declarations no driver could honour: a path, export or import naming a Machine whose driver does
    not join Machines to route domains (``attaching`` holds the names of the Machines whose driver advertises
    the Extensions fact ``topology``). Such a Machine runs isolated (its driver's ``deny``), so the declaration
    would silently never connect; ``vz up`` refuses it before anything is created."""
    if definition.version != 2:
        return []
    drivers = {m.name: m.driver for m in definition.machines}

    def why(name: str) -> str:
        return (
            f"{name!r} runs on driver {drivers[name]!r}, which does not join Machines to the Environment's route "
            "domain (no Extensions fact 'topology'): nothing could ever connect it; use a driver that does "
            "(linux_native, qemu) or remove the declaration"
        )

    out: list[tuple[str, str]] = []
    for i, path in enumerate(definition.paths):
        for key, name in (("from", path.source), ("to", path.to)):
            if name in drivers and name not in attaching:
                out.append((f"$.paths[{i}].{key}", why(name)))
    targets = [("exports", i, e.machine) for i, e in enumerate(definition.exports)]
    targets += [("imports", i, e.machine) for i, e in enumerate(definition.imports)]
    for key, i, name in targets:
        if name in drivers and name not in attaching:
            out.append((f"$.{key}[{i}].machine", why(name)))
    return out


def _label_problems(definition: ProjectDefinition) -> list[tuple[str, str]]:
    """Each Machine's share of the topology must fit its ``vz.network`` label. The label's length does not depend
    on the Environment (ids have one length; addresses and interface names come from the definition alone), so
    it is measured once here, with a placeholder id, instead of failing when that Machine is created."""
    plan = compile_topology(definition, _PLACEHOLDER_ID).to_json()
    out: list[tuple[str, str]] = []
    for i, m in enumerate(definition.machines):
        label = machine_slice(plan, m.name)
        if label is not None and len(label) > MAX_LABEL:
            out.append(
                (
                    f"$.machines[{i}]",
                    f"{m.name!r}'s share of the Environment's network (its networks and egress) is {len(label)} "
                    f"characters, more than the {MAX_LABEL} its driver accepts; shorten its egress allowlist or "
                    "attach it to fewer networks",
                )
            )
    return out
