"""The part of a topology plan the kernel realization needs, read and checked before anything is touched.

The plan arrives as JSON (``vz_core.env`` compiles it; the daemon will keep it): every name and address that
ends up in an ``ip`` batch or an nftables script is checked against a strict pattern here, so a damaged or
hostile plan is refused with a message instead of reaching the kernel tools.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vz_core.errors import InvalidArgumentError

__all__ = ["AttachmentSpec", "DomainSpec", "EgressSpec", "ForwardSpec", "InputSpec", "PlanError", "domain_for"]

DOMAIN_RE = re.compile(r"vzd-[0-9a-z]{12}")
ENV_ID_RE = re.compile(r"env_[0-9a-z]{12}")
DOMAIN_IFNAME_RE = re.compile(r"v[0-9a-f]{10}")
MACHINE_IFNAME_RE = re.compile(r"eth[0-9]{1,2}")
NAME_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")
PROTOCOLS = ("tcp", "udp")


class PlanError(InvalidArgumentError):
    """The plan cannot be realized as given (named field, what is wrong); raised before anything is touched."""


def domain_for(environment_id: str) -> str:
    """The route domain (network namespace) name of an Environment: ``vzd-`` + the id's 12 characters."""
    if not isinstance(environment_id, str) or not ENV_ID_RE.fullmatch(environment_id):
        raise PlanError(f"{environment_id!r} is not an environment id (env_ followed by 12 characters)")
    return "vzd-" + environment_id[4:]


def _get(data: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, Mapping) or key not in data:
        raise PlanError(f"{where}.{key}: missing from the topology plan")
    return data[key]


def _match(value: Any, pattern: re.Pattern[str], where: str, what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise PlanError(f"{where}: {value!r} is not {what}")
    return value


def _ipv4(value: Any, where: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(value)
    except (ValueError, TypeError):
        raise PlanError(f"{where}: {value!r} is not an IPv4 address") from None


def _port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise PlanError(f"{where}: {value!r} is not a port (1..65535)")
    return value


def _protocol(value: Any, where: str) -> str:
    if value not in PROTOCOLS:
        raise PlanError(f"{where}: {value!r} is not tcp or udp")
    return str(value)


@dataclass(frozen=True)
class AttachmentSpec:
    machine: str
    network: str
    address: ipaddress.IPv4Address
    subnet: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    machine_ifname: str
    domain_ifname: str


@dataclass(frozen=True)
class ForwardSpec:
    source_ifname: str
    source_address: ipaddress.IPv4Address
    dest_ifname: str
    dest_address: ipaddress.IPv4Address
    protocol: str
    port: int


@dataclass(frozen=True)
class InputSpec:
    ifname: str
    address: ipaddress.IPv4Address
    gateway: ipaddress.IPv4Address
    protocol: str
    port: int


@dataclass(frozen=True)
class EgressSpec:
    """A Machine's egress as the domain enforces it: its addresses, the mode, the IPv4 CIDRs of an allowlist."""

    machine: str
    mode: str
    cidrs: tuple[ipaddress.IPv4Network, ...]


@dataclass(frozen=True)
class DomainSpec:
    """One Environment's route domain: its namespace name, attachments and allowed flows."""

    environment_id: str
    name: str
    attachments: tuple[AttachmentSpec, ...]
    forward: tuple[ForwardSpec, ...]
    input: tuple[InputSpec, ...]
    egress: tuple[EgressSpec, ...] = ()

    def machine(self, name: str) -> tuple[AttachmentSpec, ...]:
        found = tuple(a for a in self.attachments if a.machine == name)
        if not found and name not in self.machines:
            raise PlanError(f"{name!r} is not a Machine of this plan (machines: {', '.join(self.machines)})")
        return found

    @property
    def machines(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.machine for a in self.attachments))

    @classmethod
    def from_plan(cls, plan: Mapping[str, Any]) -> DomainSpec:
        """Read a topology plan's JSON form (``TopologyPlan.to_json()``); raise PlanError naming the field."""
        if not isinstance(plan, Mapping):
            raise PlanError("a topology plan is a JSON object")
        if plan.get("format") != 1:
            raise PlanError(f"$.format: {plan.get('format')!r} is not a plan format this vz reads (1)")
        environment_id = _get(plan, "environment_id", "$")
        name = domain_for(environment_id)
        domain = _get(plan, "route_domain", "$")
        if domain is None:
            raise PlanError("$.route_domain: a version 1 definition has no route domain (its drivers keep their own)")
        if domain != name:
            raise PlanError(f"$.route_domain: {domain!r} is not the route domain of {environment_id} ({name})")
        subnets: dict[str, tuple[ipaddress.IPv4Network, ipaddress.IPv4Address]] = {}
        networks = _get(plan, "networks", "$")
        if not isinstance(networks, list):
            raise PlanError("$.networks: expected a list")
        for i, net in enumerate(networks):
            where = f"$.networks[{i}]"
            net_name = _match(_get(net, "name", where), NAME_RE, f"{where}.name", "a network name")
            try:
                subnet = ipaddress.IPv4Network(_get(net, "subnet", where))
            except (ValueError, TypeError):
                raise PlanError(f"{where}.subnet: {net.get('subnet')!r} is not an IPv4 network") from None
            gateway = _ipv4(_get(net, "gateway", where), f"{where}.gateway")
            if gateway not in subnet:
                raise PlanError(f"{where}.gateway: {gateway} is outside {subnet}")
            subnets[net_name] = (subnet, gateway)
        attachments: list[AttachmentSpec] = []
        egress: list[EgressSpec] = []
        domain_ifnames: set[str] = set()
        machines = _get(plan, "machines", "$")
        if not isinstance(machines, list):
            raise PlanError("$.machines: expected a list")
        for i, machine in enumerate(machines):
            where = f"$.machines[{i}]"
            machine_name = _match(_get(machine, "name", where), NAME_RE, f"{where}.name", "a Machine name")
            items = _get(machine, "attachments", where)
            if not isinstance(items, list):
                raise PlanError(f"{where}.attachments: expected a list")
            egress.append(_egress(machine.get("egress"), machine_name, f"{where}.egress"))
            machine_ifnames: set[str] = set()
            for j, att in enumerate(items):
                here = f"{where}.attachments[{j}]"
                network = _get(att, "network", here)
                if network not in subnets:
                    raise PlanError(f"{here}.network: {network!r} is not a network of the plan")
                subnet, gateway = subnets[network]
                address = _ipv4(_get(att, "address", here), f"{here}.address")
                if address not in subnet or address in (subnet.network_address, subnet.broadcast_address, gateway):
                    raise PlanError(f"{here}.address: {address} is not a Machine address of {subnet}")
                gw = _ipv4(_get(att, "gateway", here), f"{here}.gateway")
                if gw != gateway:
                    raise PlanError(f"{here}.gateway: {gw} is not the gateway of network {network!r} ({gateway})")
                m_if = _match(_get(att, "machine_ifname", here), MACHINE_IFNAME_RE, f"{here}.machine_ifname", "ethN")
                d_if = _match(
                    _get(att, "domain_ifname", here), DOMAIN_IFNAME_RE, f"{here}.domain_ifname", "v + 10 hex digits"
                )
                if d_if in domain_ifnames or m_if in machine_ifnames:
                    raise PlanError(f"{here}: interface name used twice")
                domain_ifnames.add(d_if)
                machine_ifnames.add(m_if)
                attachments.append(AttachmentSpec(machine_name, network, address, subnet, gateway, m_if, d_if))
        by_ifname = {a.domain_ifname: a for a in attachments}

        def endpoint(ifname: Any, address: Any, where: str) -> tuple[str, ipaddress.IPv4Address]:
            att = by_ifname.get(ifname) if isinstance(ifname, str) else None
            if att is None:
                raise PlanError(f"{where}: {ifname!r} is not an attachment of the plan")
            addr = _ipv4(address, where)
            if addr != att.address:
                raise PlanError(f"{where}: {addr} is not the address of {ifname} ({att.address})")
            return att.domain_ifname, addr

        forward: list[ForwardSpec] = []
        rules = _get(plan, "forward", "$")
        if not isinstance(rules, list):
            raise PlanError("$.forward: expected a list")
        for i, rule in enumerate(rules):
            where = f"$.forward[{i}]"
            s_if, s_addr = endpoint(_get(rule, "source_ifname", where), _get(rule, "source_address", where), where)
            d_if, d_addr = endpoint(_get(rule, "dest_ifname", where), _get(rule, "dest_address", where), where)
            proto = _protocol(_get(rule, "protocol", where), f"{where}.protocol")
            forward.append(ForwardSpec(s_if, s_addr, d_if, d_addr, proto, _port(_get(rule, "port", where), where)))
        inputs: list[InputSpec] = []
        rules = _get(plan, "input", "$")
        if not isinstance(rules, list):
            raise PlanError("$.input: expected a list")
        for i, rule in enumerate(rules):
            where = f"$.input[{i}]"
            s_if, s_addr = endpoint(_get(rule, "ifname", where), _get(rule, "address", where), where)
            gateway = _ipv4(_get(rule, "gateway", where), f"{where}.gateway")
            if gateway != by_ifname[s_if].gateway:
                raise PlanError(f"{where}.gateway: {gateway} is not the gateway of {s_if}")
            proto = _protocol(_get(rule, "protocol", where), f"{where}.protocol")
            inputs.append(InputSpec(s_if, s_addr, gateway, proto, _port(_get(rule, "port", where), where)))
        return cls(environment_id, name, tuple(attachments), tuple(forward), tuple(inputs), tuple(egress))


def _egress(value: Any, machine: str, where: str) -> EgressSpec:
    if not isinstance(value, Mapping) or value.get("mode") not in ("offline", "allowed", "allowlist"):
        raise PlanError(f"{where}: expected {{'mode': offline|allowed|allowlist, 'cidrs': [...], 'domains': [...]}}")
    cidrs: list[ipaddress.IPv4Network] = []
    items = value.get("cidrs", [])
    if not isinstance(items, list):
        raise PlanError(f"{where}.cidrs: expected a list")
    for i, text in enumerate(items):
        try:
            net = ipaddress.ip_network(text)
        except (ValueError, TypeError):
            raise PlanError(f"{where}.cidrs[{i}]: {text!r} is not a CIDR") from None
        if isinstance(net, ipaddress.IPv4Network):  # IPv6 is off inside route domains
            cidrs.append(net)
    return EgressSpec(machine, str(value["mode"]), tuple(cidrs))
