"""Route domains on Linux: one network namespace per Environment, routed veth attachments, its own nft table.

Layout of the domain of Environment ``env_XXXXXXXXXXXX`` (namespace ``vzd-XXXXXXXXXXXX``):

* per Machine and network, a veth pair: the domain end ``v<10 hex>`` (named by the plan) holds the network's
  gateway address as a /32 and a /32 route to the Machine's address; the Machine end ``ethN`` holds the
  Machine's address as a /32, a link route to the gateway and the network's subnet via the gateway. Every
  packet between two Machines therefore crosses the domain's IPv4 forwarding, where ``table inet vz``
  (``vz_core.network._rules``) allows exactly the declared paths. (A bridge would switch Machine-to-Machine
  frames below the inet hooks; filtering them would need bridge-family conntrack or the host-wide
  br_netfilter switch.)
* IPv4 forwarding on, IPv6 off, ICMP redirects off: sysctls of the domain's namespace only.
* nothing connects the domain to the host (egress and the host-side relays are later steps: docs/network.md).

Every object is found by its name under the Environment's namespace: ``remove_domain`` deletes only
``vzd-<id>`` (its links first, then the nft table, then the namespace), never anything of another Environment.
All functions are idempotent. Needs root, ``ip`` (iproute2), ``nft`` (nftables) and ``nsenter`` (util-linux).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vz_core.errors import FailedPreconditionError, InvalidArgumentError, RuntimeFailureError
from vz_core.network._ns import NETNS_DIR, NetworkTools
from vz_core.network._ns import require_root as _require_root
from vz_core.network._ns import run as _run
from vz_core.network._rules import DNS_SET, TABLE, UPLINK, replace_script
from vz_core.network._spec import DOMAIN_RE, AttachmentSpec, DomainSpec, domain_for

__all__ = [
    "KEEP",
    "NETNS_DIR",
    "NetworkTools",
    "Uplink",
    "attach_machine",
    "detach_machine",
    "domain_exists",
    "ensure_domain",
    "list_domains",
    "uplink_name",
]

_DOMAIN_SYSCTLS = (
    ("net.ipv6.conf.all.disable_ipv6", "1"),
    ("net.ipv6.conf.default.disable_ipv6", "1"),
    ("net.ipv4.ip_forward", "1"),
    ("net.ipv4.conf.all.send_redirects", "0"),
    ("net.ipv4.conf.default.send_redirects", "0"),
)


def _netns_path(name: str) -> Path:
    return NETNS_DIR / name


def domain_exists(environment_id: str) -> bool:
    """Whether the Environment's route domain namespace exists."""
    return os.path.lexists(_netns_path(domain_for(environment_id)))


def list_domains() -> list[str]:
    """Every route domain namespace on the host (``vzd-...``), sorted."""
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if DOMAIN_RE.fullmatch(n))


@dataclass(frozen=True)
class Uplink:
    """Where a route domain's egress leaves: a veth pair to an upstream namespace (the host's, in service).

    ``network`` is a small network private to this Environment on the upstream side (e.g. a /30 the daemon
    allocates per Environment); the domain end takes ``domain_address``, the upstream end (``vzu<id12>``)
    ``upstream_address``. The domain masquerades Machine traffic behind its address; the upstream side is
    responsible for what happens after (the host's forwarding and NAT: docs/network.md)."""

    upstream_netns: str
    network: ipaddress.IPv4Network
    domain_address: ipaddress.IPv4Address
    upstream_address: ipaddress.IPv4Address

    @classmethod
    def of(cls, upstream_netns: str, network: str) -> Uplink:
        """The uplink on ``network`` (a /30 or larger): upstream end its first host, the domain end its second."""
        net = ipaddress.IPv4Network(network)
        hosts = list(net.hosts())[:2]
        if len(hosts) < 2:
            raise InvalidArgumentError(f"an uplink network needs two host addresses, {net} has {len(hosts)}")
        return cls(upstream_netns, net, hosts[1], hosts[0])


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()
"""``ensure_domain(plan)``'s default uplink: whatever the domain has now stays (none for a new domain)."""


def uplink_name(environment_id: str) -> str:
    """The upstream end of an Environment's uplink: ``vzu`` + the id's 12 characters (15: an ifname fits)."""
    return "vzu" + domain_for(environment_id)[4:]


class Domain:
    def __init__(self, tools: NetworkTools, name: str) -> None:
        self.tools = tools
        self.name = name
        self.path = str(_netns_path(name))

    async def exists(self) -> bool:
        return await asyncio.to_thread(os.path.lexists, self.path)

    def inside(self, *argv: str) -> list[str]:
        return [self.tools.nsenter, f"--net={self.path}", "--", *argv]

    async def links(self) -> list[dict[str, Any]]:
        out = await _run(self.inside(self.tools.ip, "-j", "link", "show"), what=f"list links of {self.name}")
        data = json.loads(out or "[]")
        return [d for d in data if isinstance(d, dict)]


async def ensure_domain(
    plan: Mapping[str, Any], *, uplink: Uplink | _Keep | None = KEEP, tools: NetworkTools | None = None
) -> DomainSpec:
    """Create or converge the Environment's route domain from its topology plan (JSON form).

    The plan is checked whole before anything is touched. Afterwards the namespace exists with the domain
    sysctls and exactly the plan's nft table (replaced in one transaction; the live entries the resolver added
    for allowlisted names are kept). Attachments of Machines that the plan no longer has are removed; present
    ones are kept (``attach_machine`` adds or repairs them). ``uplink``: an ``Uplink`` is created or converged;
    ``None`` removes the domain's uplink; ``KEEP`` (the default) leaves whatever the domain has (the host side
    of egress, ``vz_core.network.ensure_egress``, is the one that adds or removes it)."""
    spec = DomainSpec.from_plan(plan)
    _require_root()
    tools = tools or NetworkTools.find()
    domain = Domain(tools, spec.name)
    existed = await domain.exists()
    if not existed:
        try:
            await _run([tools.ip, "netns", "add", spec.name], what=f"create namespace {spec.name}")
        except RuntimeFailureError:
            if not await domain.exists():  # not a concurrent creation of the same domain: a real failure
                raise
    await _run(
        domain.inside(tools.sysctl, "-q", "-w", *(f"{k}={v}" for k, v in _DOMAIN_SYSCTLS)),
        what=f"sysctls of {spec.name}",
    )
    await _run(domain.inside(tools.ip, "link", "set", "lo", "up"), what=f"loopback of {spec.name}")
    if isinstance(uplink, _Keep):
        network = await _uplink_network(domain) if existed else None
    else:
        network = uplink.network if uplink is not None else None
    resolved = await _resolved(domain) if existed and network is not None else []
    script = replace_script(spec, network, resolved)
    await _run(domain.inside(tools.nft, "-f", "-"), script.encode(), what=f"nft table of {spec.name}")
    if isinstance(uplink, Uplink):
        await _ensure_uplink(domain, spec, uplink)
    wanted = {a.domain_ifname for a in spec.attachments} | ({UPLINK} if network is not None else set())
    for link in await domain.links():
        ifname = link.get("ifname")
        if link.get("link_type") != "loopback" and isinstance(ifname, str) and ifname not in wanted:
            await delete_link(domain, ifname)
    return spec


async def _uplink_network(domain: Domain) -> ipaddress.IPv4Network | None:
    """The network of the domain's uplink as configured now (None: no uplink)."""
    argv = domain.inside(domain.tools.ip, "-j", "-4", "addr", "show")
    for item in json.loads(await _run(argv, what=f"addresses of {domain.name}") or "[]"):
        if isinstance(item, dict) and item.get("ifname") == UPLINK:
            for a in item.get("addr_info", []):
                if isinstance(a, dict) and a.get("family") == "inet":
                    try:
                        return ipaddress.IPv4Network(f"{a.get('local')}/{a.get('prefixlen')}", strict=False)
                    except ValueError:
                        return None
    return None


async def _resolved(domain: Domain) -> list[tuple[ipaddress.IPv4Address, ipaddress.IPv4Address, int]]:
    """The live entries of the domain's ``egress_dns`` set: (Machine, resolved address, seconds left)."""
    argv = domain.inside(domain.tools.nft, "-j", "list", "set", "inet", TABLE, DNS_SET)
    try:
        data = json.loads(await _run(argv, what=f"resolved names of {domain.name}") or "{}")
    except (RuntimeFailureError, ValueError):
        return []  # no table yet (or one without the set): nothing to keep
    out = []
    for item in data.get("nftables", []) if isinstance(data, dict) else []:
        elements = item.get("set", {}).get("elem", []) if isinstance(item, dict) else []
        for element in elements if isinstance(elements, list) else []:
            inner = element.get("elem", {}) if isinstance(element, dict) else {}
            pair = inner.get("val", {}).get("concat") if isinstance(inner.get("val"), dict) else None
            left = inner.get("expires")
            if isinstance(pair, list) and len(pair) == 2 and isinstance(left, int) and left > 0:
                try:
                    out.append((ipaddress.IPv4Address(pair[0]), ipaddress.IPv4Address(pair[1]), left))
                except ValueError:
                    continue
    return out


async def _ensure_uplink(domain: Domain, spec: DomainSpec, uplink: Uplink) -> None:
    tools = domain.tools
    upstream = uplink_name(spec.environment_id)
    inner = await _link(tools, domain.path, UPLINK)
    outer = await _link(tools, uplink.upstream_netns, upstream)
    paired = (
        inner is not None
        and outer is not None
        and inner.get("link_index") == outer.get("ifindex")
        and outer.get("link_index") == inner.get("ifindex")
    )
    if not paired:
        if inner is not None:
            await delete_link(domain, UPLINK)
        if await _link(tools, uplink.upstream_netns, upstream) is not None:
            await _run(
                [tools.nsenter, f"--net={uplink.upstream_netns}", "--", tools.ip, "link", "del", upstream],
                what=f"remove the stale uplink {upstream}",
            )
        await _run(
            domain.inside(
                tools.ip,
                "link",
                "add",
                UPLINK,
                "type",
                "veth",
                "peer",
                "name",
                upstream,
                "netns",
                uplink.upstream_netns,
            ),
            what=f"uplink of {spec.name}",
        )
    prefix = uplink.network.prefixlen
    inside = (
        f"link set {UPLINK} up\n"
        f"addr replace {uplink.domain_address}/{prefix} dev {UPLINK}\n"
        f"route replace default via {uplink.upstream_address} dev {UPLINK}\n"
    )
    await _run(domain.inside(tools.ip, "-batch", "-"), inside.encode(), what=f"domain end of the uplink of {spec.name}")
    outside = f"link set {upstream} up\naddr replace {uplink.upstream_address}/{prefix} dev {upstream}\n"
    await _run(
        [tools.nsenter, f"--net={uplink.upstream_netns}", "--", tools.ip, "-batch", "-"],
        outside.encode(),
        what=f"upstream end {upstream}",
    )


async def delete_link(domain: Domain, ifname: str) -> None:
    try:
        await _run(domain.inside(domain.tools.ip, "link", "del", ifname), what=f"remove {ifname} from {domain.name}")
    except RuntimeFailureError:
        if any(link.get("ifname") == ifname for link in await domain.links()):
            raise


def _check_netns(path: str) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InvalidArgumentError(f"the Machine's network namespace {path} cannot be opened: {exc.strerror}") from None
    if not os.path.isabs(path) or not stat.S_ISREG(st.st_mode):
        raise InvalidArgumentError(f"{path} is not a network namespace (a /run/netns entry or /proc/<pid>/ns/net)")


async def _link(tools: NetworkTools, netns: str, ifname: str) -> dict[str, Any] | None:
    argv = [tools.nsenter, f"--net={netns}", "--", tools.ip, "-j", "link", "show"]
    for item in json.loads(await _run(argv, what=f"links of {netns}") or "[]"):
        if isinstance(item, dict) and item.get("ifname") == ifname:
            return item
    return None


async def attach_machine(
    plan: Mapping[str, Any], machine: str, netns: str, *, tools: NetworkTools | None = None
) -> tuple[AttachmentSpec, ...]:
    """Connect a Machine's network namespace (``/run/netns/NAME`` or ``/proc/PID/ns/net``) to its route domain.

    One veth pair per attachment of the plan, created directly in the two namespaces (never in the host's), the
    addresses and routes of both ends set. Idempotent: an existing pair joining exactly these two ends is
    reconfigured in place; a stale domain end (its Machine gone or replaced) is replaced. The domain must exist
    (``ensure_domain``)."""
    spec = DomainSpec.from_plan(plan)
    attachments = spec.machine(machine)
    _require_root()
    _check_netns(netns)
    tools = tools or NetworkTools.find()
    domain = Domain(tools, spec.name)
    if not await domain.exists():
        raise FailedPreconditionError(f"the route domain {spec.name} does not exist; ensure_domain(plan) creates it")
    for index, att in enumerate(attachments):
        first = index == 0
        outer = await _link(tools, domain.path, att.domain_ifname)
        inner = await _link(tools, netns, att.machine_ifname)
        paired = (
            outer is not None
            and inner is not None
            and outer.get("link_index") == inner.get("ifindex")
            and inner.get("link_index") == outer.get("ifindex")
        )
        if not paired:
            if outer is not None:  # a stale domain end: its Machine end (if any) goes with it
                await delete_link(domain, att.domain_ifname)
                inner = await _link(tools, netns, att.machine_ifname)
            if inner is not None:
                raise FailedPreconditionError(
                    f"the Machine's namespace {netns} already has an interface {att.machine_ifname} that is not its "
                    f"route-domain attachment; remove it or give the Machine a fresh namespace"
                )
            await _run(
                domain.inside(
                    tools.ip,
                    "link",
                    "add",
                    att.domain_ifname,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    att.machine_ifname,
                    "netns",
                    netns,
                ),
                what=f"veth {att.domain_ifname} for {machine}",
            )
        outside = (
            f"link set {att.domain_ifname} up\n"
            f"addr replace {att.gateway}/32 dev {att.domain_ifname}\n"
            f"route replace {att.address}/32 dev {att.domain_ifname} scope link src {att.gateway}\n"
        )
        await _run(domain.inside(tools.ip, "-batch", "-"), outside.encode(), what=f"domain end of {machine}")
        stale = [
            f"addr del {a['local']}/{a['prefixlen']} dev {att.machine_ifname}\n"
            for a in await _addresses(tools, netns, att.machine_ifname)
            if a.get("family") == "inet" and (a.get("local"), a.get("prefixlen")) != (str(att.address), 32)
        ]
        inside = (
            "link set lo up\n"
            f"link set {att.machine_ifname} up\n"
            + "".join(stale)
            + f"addr replace {att.address}/32 dev {att.machine_ifname}\n"
            f"route replace {att.gateway}/32 dev {att.machine_ifname} scope link src {att.address}\n"
            f"route replace {att.subnet} via {att.gateway} dev {att.machine_ifname} src {att.address}\n"
            # Everything else goes to the domain too, which forwards only what the Machine's egress allows.
            + (f"route replace default via {att.gateway} dev {att.machine_ifname} src {att.address}\n" if first else "")
        )
        machine_ns = [tools.nsenter, f"--net={netns}", "--", tools.ip, "-batch", "-"]
        await _run(machine_ns, inside.encode(), what=f"interface {att.machine_ifname} of {machine}")
    return attachments


async def _addresses(tools: NetworkTools, netns: str, ifname: str) -> list[dict[str, Any]]:
    argv = [tools.nsenter, f"--net={netns}", "--", tools.ip, "-j", "addr", "show", "dev", ifname]
    out: list[dict[str, Any]] = []
    for item in json.loads(await _run(argv, what=f"addresses of {ifname}") or "[]"):
        if isinstance(item, dict):
            out.extend(a for a in item.get("addr_info", []) if isinstance(a, dict))
    return out


async def detach_machine(plan: Mapping[str, Any], machine: str, *, tools: NetworkTools | None = None) -> None:
    """Remove a Machine's attachments from its route domain (each pair's Machine end goes with it)."""
    spec = DomainSpec.from_plan(plan)
    attachments = spec.machine(machine)
    _require_root()
    tools = tools or NetworkTools.find()
    domain = Domain(tools, spec.name)
    if not await domain.exists():
        return
    present = {link.get("ifname") for link in await domain.links()}
    for att in attachments:
        if att.domain_ifname in present:
            await delete_link(domain, att.domain_ifname)
