"""The host half of egress: an Environment's uplink network, the host's forwarding and NAT, and its denials.

A route domain whose plan has a Machine with egress other than ``offline`` gets an uplink (``Uplink``: the veth
pair ``vzup`` in the domain, ``vzu<id12>`` in the host's namespace) on a /30 of the host pool (default
``10.254.0.0/16``, ``VZ_NETWORK_UPLINK_POOL`` to change it) that overlaps no route and no address of the host
(the default route aside) and none of its resolvers. The /30 is chosen from a start derived from the
environment id; the address on an existing ``vzu<id12>`` is kept (the kernel holds the allocation: nothing
else to record, and a killed `vz up` converges on the next one).

On the host side, the table ``inet vz_<id12>`` (one per Environment, named from its id):

* ``input``: everything arriving from ``vzu<id12>`` is dropped: egress never reaches the host itself, whichever
  of its addresses (loopback, LAN, the uplink's own) and whatever listens on 0.0.0.0;
* ``forward``: from ``vzu<id12>``, anything not IPv4 from the domain's uplink address, anything toward another
  uplink (``vzu*``), link-local, loopback, multicast, reserved and the whole pool is dropped, and so is anything
  toward the host's directly connected networks; nothing new is forwarded into the uplink;
* ``postrouting``: the domain's address is masqueraded behind the host's address on the way out.

Directly connected destinations are denied by the kernel's routing decision itself, not only by a list: a
packet is forwarded only when the route the host chose for it goes through a gateway (``rt ip nexthop`` is one
of the host's gateways, set ``gateways``) and its destination is not a gateway itself. A route without a gateway
(a directly connected network, one the host joined a moment ago included) has the destination as its next hop,
which is then either not in ``gateways`` or, being a gateway, refused by the second rule: so a stale
``gateways`` set can only refuse too much (a new gateway's routes until it is listed), never let a connected
destination through. Devices whose default route has no gateway (``default dev ppp0``, a WireGuard tunnel) are
the exception (set ``direct_out``: the next hop is the destination there); for them, and as a second layer
everywhere, the set ``connected`` lists the host's directly connected networks and addresses. The three sets are
read when the table is written and rewritten in one nft transaction, within a fraction of a second of each
change of the host's addresses, routes or links, by ``HostNetworkWatcher`` (a NETLINK_ROUTE socket in the
serving process's event loop; ``NetworkHost`` runs one) through ``refresh_host_networks``.

The domain's own table already admits only what each Machine's egress allows (``_rules``); this table holds
even if a domain's rules were wrong. Forwarding is enabled on ``vzu<id12>`` only (IPv6 off there); a host with
IPv4 forwarding off (``net.ipv4.ip_forward=0``) is refused with that name rather than changed. The host's other
tables still apply: a forward policy of drop elsewhere (e.g. a container engine's) stops egress too.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import ipaddress
import json
import logging
import os
import re
import socket
import sys
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vz_core.errors import FailedPreconditionError, InvalidArgumentError, RuntimeFailureError, UnavailableError
from vz_core.network._dns import host_resolvers
from vz_core.network._domain import Uplink, ensure_domain, uplink_name
from vz_core.network._ns import NetworkTools, in_namespace
from vz_core.network._ns import require_root as _require_root
from vz_core.network._ns import run as _run
from vz_core.network._rules import NEVER
from vz_core.network._spec import DomainSpec, domain_for

__all__ = [
    "DEFAULT_POOL",
    "POOL_ENV",
    "HostNetworkWatcher",
    "HostNetworks",
    "direct_egress_ruleset",
    "direct_table",
    "ensure_direct_egress",
    "ensure_egress",
    "host_egress_ruleset",
    "host_networks_script",
    "host_table",
    "needs_uplink",
    "read_host_networks",
    "refresh_host_networks",
    "remove_direct_egress",
    "remove_host_egress",
]

log = logging.getLogger("vz.network")

DEFAULT_POOL = "10.254.0.0/16"
POOL_ENV = "VZ_NETWORK_UPLINK_POOL"
_TABLE_RE = re.compile(r"vz_[0-9a-z]{12}")
_DIRECT_TABLE_RE = re.compile(r"vz(?:_[0-9]{1,3}){4}_[0-9]{1,2}")  # version 1 Machine links (``direct_table``)
_IFNAME_RE = re.compile(r"[A-Za-z0-9_.+@-]{1,15}")  # device names that may appear in a table's text
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
_reserved: dict[ipaddress.IPv4Network, str] = {}
"""Uplink networks allocated by this process (to the Environment named) whose address is not on the host yet."""
_written: dict[str, HostNetworks] = {}
"""The host networks this process last wrote into each Environment's host table (``inet vz_<id12>``; under the
lock): a refresh rewrites only the tables whose networks differ from the host's now. Without it every new
Environment's uplink (a link, an address, a route of the host) made the watcher rewrite every table: O(N) nft work
per Environment, O(N²) for N Environments coming up together, all under the lock each `vz up` also takes."""


def host_table(environment_id: str) -> str:
    """The host table of an Environment's egress: ``vz_`` + the id's 12 characters."""
    return "vz_" + domain_for(environment_id)[4:]


def needs_uplink(spec: DomainSpec) -> bool:
    """Whether any attached Machine of the plan may reach something outside the Environment."""
    attached = set(spec.machines)
    return any(e.mode != "offline" and e.machine in attached for e in spec.egress)


def pool_network(value: str | None = None) -> ipaddress.IPv4Network:
    """The uplink pool: ``value``, else ``VZ_NETWORK_UPLINK_POOL``, else ``10.254.0.0/16``; checked."""
    text = value if value is not None else os.environ.get(POOL_ENV) or DEFAULT_POOL
    try:
        net = ipaddress.IPv4Network(text)
    except (ValueError, TypeError):
        raise InvalidArgumentError(
            f"{POOL_ENV}={text!r} is not an IPv4 network (e.g. {DEFAULT_POOL}); set it to a private range "
            f"no host route uses"
        ) from None
    if net.prefixlen > 30 or not net.is_private or net.is_loopback or net.is_link_local:
        raise InvalidArgumentError(
            f"{POOL_ENV}={text!r}: the uplink pool must be a private IPv4 network of at least one /30 "
            f"(e.g. {DEFAULT_POOL})"
        )
    return net


@dataclass(frozen=True)
class HostNetworks:
    """What the host table needs to know of the host's routing (read by ``read_host_networks``).

    ``connected``: the host's directly connected networks and its addresses' networks (collapsed; uplinks aside);
    ``gateways``: the gateway address of every route that has one; ``direct_out``: devices whose default route
    has no gateway (point-to-point links, tunnels)."""

    connected: tuple[ipaddress.IPv4Network, ...] = ()
    gateways: tuple[ipaddress.IPv4Address, ...] = ()
    direct_out: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        connected: Iterable[ipaddress.IPv4Network] = (),
        gateways: Iterable[ipaddress.IPv4Address] = (),
        direct_out: Iterable[str] = (),
    ) -> HostNetworks:
        """Normalized: networks collapsed (an interval set refuses overlapping elements) and sorted, gateways
        and device names deduplicated and sorted, device names that could not be written in nft text dropped."""
        nets = sorted(ipaddress.collapse_addresses(connected), key=lambda n: (int(n.network_address), n.prefixlen))
        return cls(
            tuple(nets),
            tuple(sorted(set(gateways), key=int)),
            tuple(sorted({d for d in direct_out if _IFNAME_RE.fullmatch(d)})),
        )

    def elements(self) -> dict[str, str]:
        """Each set's elements in nft syntax (empty text for an empty set)."""
        return {
            "connected": ", ".join(str(n) for n in self.connected),
            "gateways": ", ".join(str(g) for g in self.gateways),
            "direct_out": ", ".join(f'"{d}"' for d in self.direct_out),
        }


_SET_TYPES = {"connected": "ipv4_addr\n    flags interval", "gateways": "ipv4_addr", "direct_out": "ifname"}


def _never(*extra: ipaddress.IPv4Network | None) -> list[ipaddress.IPv4Network]:
    """``NEVER`` and ``extra`` collapsed and sorted (the elements of an interval set)."""
    nets = [*(ipaddress.IPv4Network(n) for n in NEVER), *(n for n in extra if n is not None)]
    return sorted(ipaddress.collapse_addresses(nets), key=lambda n: (int(n.network_address), n.prefixlen))


def _guard_ruleset(
    table: str,
    *,
    dev: str,
    source: str,
    never: list[ipaddress.IPv4Network],
    facts: HostNetworks,
    masquerade: str,
    extra_sets: str = "",
    dns: bool = False,
) -> str:
    """The host table guarding the host from what arrives on the links ``dev`` (nft: ``"vzu…"`` or ``@links``):
    the same rules for a version 2 uplink and for version 1 Machine links. ``source``: the condition (after
    ``iifname {dev}``) a packet with a source it may not use matches; ``dns``: DNS to the host's resolvers (set
    ``resolvers``) is admitted before the denials."""
    sets = "".join(
        f"  set {name} {{\n    type {_SET_TYPES[name]}\n"
        + (f"    elements = {{ {items} }}\n" if items else "")
        + "  }\n"
        for name, items in facts.elements().items()
    )
    resolver = f"    iifname {dev} ip daddr @resolvers meta l4proto {{ tcp, udp }} th dport 53 accept\n" if dns else ""
    return (
        f"table inet {table} {{\n"
        "  set never {\n"
        "    type ipv4_addr\n"
        "    flags interval\n"
        f"    elements = {{ {', '.join(str(n) for n in never)} }}\n"
        "  }\n"
        f"{sets}{extra_sets}"
        "  chain input {\n"
        "    type filter hook input priority filter - 5; policy accept;\n"
        f"{resolver}"
        f"    iifname {dev} drop\n"
        "  }\n"
        "  chain forward {\n"
        "    type filter hook forward priority filter - 5; policy accept;\n"
        f"    iifname {dev} meta nfproto != ipv4 drop\n"
        f"    iifname {dev} {source} drop\n"
        f"{resolver}"
        f'    iifname {dev} oifname "vzu*" drop\n'
        f"    iifname {dev} ip daddr @never drop\n"
        # Directly connected destinations, decided by the route the kernel chose (exact, whatever the lists say):
        f"    iifname {dev} ip daddr @gateways drop\n"
        f"    iifname {dev} oifname != @direct_out rt ip nexthop != @gateways drop\n"
        f"    iifname {dev} ip daddr @connected drop\n"
        f"    oifname {dev} ct state established,related accept\n"
        f"    oifname {dev} drop\n"
        "  }\n"
        "  chain postrouting {\n"
        "    type nat hook postrouting priority srcnat; policy accept;\n"
        f"    {masquerade} masquerade\n"
        "  }\n"
        "}\n"
    )


def host_egress_ruleset(
    environment_id: str,
    uplink: Uplink,
    connected: list[ipaddress.IPv4Network] | HostNetworks,
    pool: ipaddress.IPv4Network | None = None,
) -> str:
    """The host table ``inet vz_<id12>`` for the Environment's uplink (pure); ``pool`` (every uplink's range)
    joins the destinations never forwarded to. ``connected``: the host's networks (``HostNetworks``; a bare list
    of connected networks means a host with no gateway: nothing but the uplink's replies is forwarded)."""
    facts = connected if isinstance(connected, HostNetworks) else HostNetworks.of(connected)
    return _guard_ruleset(
        host_table(environment_id),
        dev=f'"{uplink_name(environment_id)}"',
        source=f"ip saddr != {uplink.domain_address}",
        never=_never(uplink.network, pool),
        facts=facts,
        masquerade=f'ip saddr {uplink.domain_address} oifname != "vzu*"',
    )


# --- version 1 Machines: their own links on the host, the same guard ------------------------------------------


def direct_table(subnet: ipaddress.IPv4Network) -> str:
    """The host table guarding the version 1 Machine links of ``subnet`` (``vz_10_231_0_0_16``)."""
    return "vz_" + str(subnet).replace(".", "_").replace("/", "_")


def direct_egress_ruleset(
    subnet: ipaddress.IPv4Network,
    links: Mapping[str, ipaddress.IPv4Address],
    facts: HostNetworks,
    *,
    resolvers: Iterable[ipaddress.IPv4Address] = (),
    pool: ipaddress.IPv4Network | None = None,
) -> str:
    """The host table ``inet vz_<subnet>`` of version 1 Machines (pure): ``links`` maps each Machine's host end
    (``vz<key12>``) to the Machine's address on it. The rules are an uplink's (``host_egress_ruleset``): nothing
    to the host (any address, whatever listens on 0.0.0.0), to another Machine or uplink (``subnet`` and the
    ``pool`` are never forwarded to), link-local, or the host's directly connected networks; only IPv4 from the
    Machine's own address on its own link; masqueraded on the way out. The one addition: DNS (tcp and udp 53)
    to the host's ``resolvers`` (the ``nameserver`` lines its Machines' resolv.conf copies), which are often the
    LAN's router or the host itself."""
    for name in links:
        if not _IFNAME_RE.fullmatch(name):
            raise InvalidArgumentError(f"{name!r} is not a link name")
    names = ", ".join(f'"{n}"' for n in sorted(links))
    pairs = ", ".join(f'"{n}" . {links[n]}' for n in sorted(links))
    found = sorted({ipaddress.IPv4Address(a) for a in resolvers if not ipaddress.IPv4Address(a).is_loopback}, key=int)
    extra = (
        "  set links {\n    type ifname\n" + (f"    elements = {{ {names} }}\n" if names else "") + "  }\n"
        "  set sources {\n    type ifname . ipv4_addr\n"
        + (f"    elements = {{ {pairs} }}\n" if pairs else "")
        + "  }\n"
        "  set resolvers {\n    type ipv4_addr\n"
        + (f"    elements = {{ {', '.join(str(a) for a in found)} }}\n" if found else "")
        + "  }\n"
    )
    return _guard_ruleset(
        direct_table(subnet),
        dev="@links",
        source="iifname . ip saddr != @sources",
        never=_never(subnet, pool),
        facts=facts,
        masquerade=f"ip saddr {subnet} ip daddr != {subnet}",
        extra_sets=extra,
        dns=True,
    )


async def ensure_direct_egress(
    subnet: ipaddress.IPv4Network, links: Mapping[str, ipaddress.IPv4Address], *, tools: NetworkTools | None = None
) -> None:
    """Write the host table of the version 1 Machine links ``links`` of ``subnet`` (``direct_egress_ruleset``)
    in one nft transaction, from the host's networks and resolvers now (the daemon's ``HostNetworkWatcher``
    keeps its host networks current as it does an uplink's); a masquerade-only table of an earlier vz (family
    ``ip``, same name) is removed in the same transaction. The caller serializes the writers of one subnet."""
    _require_root()
    tools = tools or NetworkTools.find()
    table = direct_table(subnet)
    resolvers = [ipaddress.IPv4Address(a) for a, _ in host_resolvers()]
    async with _lock():
        facts = await read_host_networks(tools=tools)
        script = (
            f"table ip {table}\ndelete table ip {table}\n"
            f"table inet {table}\ndelete table inet {table}\n"
            + direct_egress_ruleset(subnet, links, facts, resolvers=resolvers, pool=_pool_or_none())
        )
        await _run([tools.nft, "-f", "-"], script.encode(), what=f"nft table {table}")


async def remove_direct_egress(subnet: ipaddress.IPv4Network, *, tools: NetworkTools | None = None) -> None:
    """Remove the host table of ``subnet``'s version 1 Machine links (and an earlier vz's ``ip`` one)."""
    _require_root()
    tools = tools or NetworkTools.find()
    table = direct_table(subnet)
    script = f"table ip {table}\ndelete table ip {table}\ntable inet {table}\ndelete table inet {table}\n"
    await _run([tools.nft, "-f", "-"], script.encode(), what=f"remove the nft table {table}")


def _pool_or_none() -> ipaddress.IPv4Network | None:
    try:
        return pool_network()
    except InvalidArgumentError:
        return None


async def _json(tools: NetworkTools, *argv: str) -> list[dict[str, Any]]:
    data = json.loads(await _run([tools.ip, "-j", "-4", *argv], what=f"ip {' '.join(argv)}") or "[]")
    return [d for d in data if isinstance(d, dict)]


def _gateways_of(route: Mapping[str, Any]) -> list[ipaddress.IPv4Address]:
    """The IPv4 gateways of a route (its own, or each of a multipath route's next hops)."""
    hops = [route, *(h for h in route.get("nexthops", []) if isinstance(h, dict))]
    out = []
    for hop in hops:
        with contextlib.suppress(ValueError):
            if "gateway" in hop:
                out.append(ipaddress.IPv4Address(str(hop["gateway"])))
    return out


async def read_host_networks(
    pool: ipaddress.IPv4Network | None = None, *, tools: NetworkTools | None = None
) -> HostNetworks:
    """The host's routing as the host table needs it (``HostNetworks``), from the routes of every table and the
    addresses of every device; the uplinks (``vzu*``) and the pool are left out (``never`` has them)."""
    tools = tools or NetworkTools.find()
    pool = pool if pool is not None else pool_network()
    nets: list[ipaddress.IPv4Network] = []
    gateways: list[ipaddress.IPv4Address] = []
    direct_out: list[str] = []
    for route in await _json(tools, "route", "show", "table", "all"):
        dst, dev = route.get("dst"), str(route.get("dev", ""))
        if dev.startswith("vzu") or route.get("type") not in (None, "unicast"):
            continue
        found = _gateways_of(route)
        gateways.extend(found)
        if found or route.get("nexthops"):
            continue
        if dst in (None, "default", "0.0.0.0/0"):
            if dst is not None and dev and dev != "lo":
                direct_out.append(dev)
            continue
        try:
            net = ipaddress.IPv4Network(str(dst), strict=False)
        except ValueError:
            continue
        if not net.is_loopback and not net.subnet_of(pool):
            nets.append(net)
    for item in await _json(tools, "addr", "show"):
        if str(item.get("ifname", "")).startswith("vzu"):
            continue
        for a in item.get("addr_info", []):
            if isinstance(a, dict) and a.get("family") == "inet":
                try:
                    net = ipaddress.IPv4Network(f"{a.get('local')}/{a.get('prefixlen')}", strict=False)
                except ValueError:
                    continue
                if not net.is_loopback:
                    nets.append(net)
    return HostNetworks.of(nets, gateways, direct_out)


def _resolvers() -> list[ipaddress.IPv4Network]:
    out = []
    try:
        with open("/etc/resolv.conf", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    try:
                        out.append(ipaddress.IPv4Network(parts[1]))
                    except ValueError:
                        continue
    except OSError:
        pass
    return out


async def _allocate(environment_id: str, pool: ipaddress.IPv4Network, tools: NetworkTools) -> ipaddress.IPv4Network:
    dev = uplink_name(environment_id)
    addresses = await _json(tools, "addr", "show")
    for item in addresses:
        if item.get("ifname") == dev:
            for a in item.get("addr_info", []):
                if isinstance(a, dict) and a.get("family") == "inet":
                    net = ipaddress.IPv4Network(f"{a.get('local')}/{a.get('prefixlen')}", strict=False)
                    if net.prefixlen == 30 and net.subnet_of(pool):
                        return net  # what a previous `vz up` (or a killed one) allocated: kept
    taken: list[ipaddress.IPv4Network] = [
        *_resolvers(),
        *(n for n, owner in _reserved.items() if owner != environment_id),
    ]
    for route in await _json(tools, "route", "show", "table", "all"):
        dst = route.get("dst")
        if dst in (None, "default") or route.get("dev") == dev:
            continue
        try:
            taken.append(ipaddress.IPv4Network(str(dst), strict=False))
        except ValueError:
            continue
    for item in addresses:
        if item.get("ifname") == dev:
            continue
        for a in item.get("addr_info", []):
            if isinstance(a, dict) and a.get("family") == "inet":
                with contextlib.suppress(ValueError):
                    taken.append(ipaddress.IPv4Network(f"{a.get('local')}/{a.get('prefixlen')}", strict=False))
    count = 1 << (30 - pool.prefixlen)
    start = int.from_bytes(hashlib.sha256(environment_id.encode()).digest()[:8], "big") % count
    base = int(pool.network_address)
    for step in range(count):
        candidate = ipaddress.IPv4Network((base + ((start + step) % count) * 4, 30))
        if not any(candidate.overlaps(t) for t in taken):
            return candidate
    raise UnavailableError(
        f"no free /30 left in the uplink pool {pool} (every one overlaps a host route, address or another "
        f"Environment's uplink); set {POOL_ENV} to a larger private range no host route uses"
    )


async def _host_tables(tools: NetworkTools, *, direct: bool = False) -> list[str]:
    """The Environments' host tables (``vz_<id12>``), and with ``direct`` the version 1 Machine links' too."""
    data = json.loads(await _run([tools.nft, "-j", "list", "tables", "inet"], what="list nft tables") or "{}")
    names = []
    for item in data.get("nftables", []) if isinstance(data, dict) else []:
        table = item.get("table") if isinstance(item, dict) else None
        if (
            isinstance(table, dict)
            and table.get("family") == "inet"
            and (
                _TABLE_RE.fullmatch(str(table.get("name")))
                or (direct and _DIRECT_TABLE_RE.fullmatch(str(table.get("name"))))
            )
        ):
            names.append(str(table["name"]))
    return names


async def remove_host_egress(environment_id: str, *, tools: NetworkTools | None = None) -> bool:
    """Remove the host half of the Environment's egress (its table, a leftover ``vzu<id12>``); whether any."""
    _require_root()
    tools = tools or NetworkTools.find()
    table = host_table(environment_id)
    found = False
    _written.pop(table, None)
    if table in await _host_tables(tools):
        await _run([tools.nft, "delete", "table", "inet", table], what=f"remove the nft table {table}")
        found = True
    dev = uplink_name(environment_id)
    if any(item.get("ifname") == dev for item in await _json(tools, "link", "show")):
        try:
            await _run([tools.ip, "link", "del", dev], what=f"remove the uplink end {dev}")
        except RuntimeFailureError:
            if any(item.get("ifname") == dev for item in await _json(tools, "link", "show")):
                raise
        found = True
    return found


async def _sweep(tools: NetworkTools) -> None:
    """Host tables of Environments whose route domain is gone (a removal that was killed half way)."""
    for name in await _host_tables(tools):
        if not await asyncio.to_thread(os.path.lexists, f"/run/netns/vzd-{name[3:]}"):
            await remove_host_egress("env_" + name[3:], tools=tools)


def _lock() -> asyncio.Lock:
    loop = asyncio.get_running_loop()
    lock = _locks.get(loop)
    if lock is None:
        lock = _locks[loop] = asyncio.Lock()
    return lock


async def ensure_egress(
    plan: Mapping[str, Any], *, pool: str | None = None, tools: NetworkTools | None = None
) -> Uplink | None:
    """Converge both halves of the Environment's egress from its plan (the route domain must exist).

    With a Machine whose egress is not ``offline``: its uplink (allocated, or the one it has), the domain's
    table and uplink (``ensure_domain(plan, uplink=...)``), forwarding on the host end and the host table;
    returns the ``Uplink``. Otherwise the uplink and the host table are removed; returns None. Idempotent; run
    by the process serving the host (the vz daemon), which is in the host's network namespace."""
    spec = DomainSpec.from_plan(plan)
    _require_root()
    tools = tools or NetworkTools.find()
    env_id = spec.environment_id
    if not await asyncio.to_thread(os.path.lexists, f"/run/netns/{spec.name}"):
        raise FailedPreconditionError(f"the route domain {spec.name} of {env_id} does not exist; `vz up` creates it")
    if not needs_uplink(spec):
        await ensure_domain(plan, uplink=None, tools=tools)
        await remove_host_egress(env_id, tools=tools)
        return None
    network = pool_network(pool)
    forwarding = await _run([tools.sysctl, "-n", "net.ipv4.ip_forward"], what="read net.ipv4.ip_forward")
    if forwarding.strip() != "1":
        raise FailedPreconditionError(
            "egress needs the host to forward IPv4 (net.ipv4.ip_forward is 0; vz does not change it for you): "
            "`sysctl -w net.ipv4.ip_forward=1`, or give the Environment's Machines egress 'offline'"
        )
    async with _lock():
        allocated = await _allocate(env_id, network, tools)
        _reserved[allocated] = env_id
    # Realized outside the lock (several ip and nft runs: under it, N Environments coming up together waited for
    # each other's); until the uplink's address is on the host, the reservation keeps others from taking it.
    try:
        uplink = Uplink.of(f"/proc/{os.getpid()}/ns/net", str(allocated))
        await ensure_domain(plan, uplink=uplink, tools=tools)
    finally:
        if _reserved.get(allocated) == env_id:
            del _reserved[allocated]
    dev = uplink_name(env_id)
    await _run(
        [tools.sysctl, "-q", "-w", f"net.ipv4.conf.{dev}.forwarding=1", f"net.ipv6.conf.{dev}.disable_ipv6=1"],
        what=f"forwarding on {dev}",
    )
    table = host_table(env_id)
    async with _lock():  # not between a watcher's read of the host's networks and its write of the sets
        facts = await read_host_networks(network, tools=tools)
        ruleset = host_egress_ruleset(env_id, uplink, facts, network)
        script = f"table inet {table}\ndelete table inet {table}\n" + ruleset
        _written.pop(table, None)
        await _run([tools.nft, "-f", "-"], script.encode(), what=f"nft table {table}")
        _remember([table], facts)
    await _sweep(tools)
    return uplink


def host_networks_script(tables: Iterable[str], facts: HostNetworks, *, only: str | None = None) -> str:
    """One nft transaction replacing the ``connected``, ``gateways`` and ``direct_out`` sets (or set ``only``) of
    each host table (pure): a packet sees either the old sets or the new ones, never a flushed set."""
    lines = []
    for table in tables:
        for name, items in facts.elements().items():
            if only is not None and name != only:
                continue
            lines.append(f"flush set inet {table} {name}")
            if items:
                lines.append(f"add element inet {table} {name} {{ {items} }}")
    return "".join(line + "\n" for line in lines)


async def _has_connected_set(tools: NetworkTools, table: str) -> bool:
    try:
        await _run([tools.nft, "list", "set", "inet", table, "connected"], what=f"the set connected of {table}")
    except RuntimeFailureError:
        return False
    return True


def _remember(tables: Iterable[str], facts: HostNetworks) -> None:
    for table in tables:
        if _TABLE_RE.fullmatch(table):
            _written[table] = facts


async def refresh_host_networks(*, tools: NetworkTools | None = None) -> list[str]:
    """Rewrite the host's networks in every Environment's host table (``inet vz_<id12>``, and in the version 1
    Machine links' tables, ``direct_table``) from the host's routing now; the tables written. One transaction
    for all; should it fail (a table removed meanwhile), each table on its own, those still there."""
    _require_root()
    tools = tools or NetworkTools.find()
    async with _lock():
        listed = await _host_tables(tools, direct=True)
        if not listed:
            _written.clear()
            return []
        facts = await read_host_networks(tools=tools)
        for gone in set(_written) - set(listed):
            del _written[gone]
        # A version 1 links' table is written by the driver's process too: always rewritten (one per subnet).
        tables = [t for t in listed if _DIRECT_TABLE_RE.fullmatch(t) or _written.get(t) != facts]
        if not tables:
            return []
        try:
            await _run([tools.nft, "-f", "-"], host_networks_script(tables, facts).encode(), what="host networks")
            _remember(tables, facts)
            return tables
        except RuntimeFailureError:
            pass
        done, failed = [], []
        error = RuntimeFailureError("no attempt")
        for table in await _host_tables(tools, direct=True):
            # A table of an earlier vz has the ``connected`` set only: that one is still kept current.
            for script in (
                host_networks_script([table], facts),
                host_networks_script([table], facts, only="connected"),
            ):
                try:
                    await _run([tools.nft, "-f", "-"], script.encode(), what=f"the host networks of {table}")
                except RuntimeFailureError as exc:
                    error = exc
                    continue
                done.append(table)
                _remember([table] if script == host_networks_script([table], facts) else [], facts)
                break
            else:
                if table in await _host_tables(tools, direct=True) and await _has_connected_set(tools, table):
                    failed.append(f"{table}: {error.message}")
                # else: removed meanwhile, or a table with no such set (not written by vz): nothing to keep
        if failed:
            raise RuntimeFailureError("the host networks of the nft tables " + "; ".join(failed))
        return done


# rtnetlink multicast groups (linux/rtnetlink.h): links, IPv4 addresses, IPv4 routes.
_RTMGRP_LINK, _RTMGRP_IPV4_IFADDR, _RTMGRP_IPV4_ROUTE = 0x1, 0x10, 0x40


def _netlink_socket() -> socket.socket:
    if sys.platform != "linux":  # vz_core.network is Linux-only: never reached elsewhere
        raise OSError("rtnetlink exists only on Linux")
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.bind((0, _RTMGRP_LINK | _RTMGRP_IPV4_IFADDR | _RTMGRP_IPV4_ROUTE))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class HostNetworkWatcher:
    """Keeps every host table's view of the host's networks current (``refresh_host_networks``).

    A NETLINK_ROUTE socket subscribed to the host's link, IPv4 address and IPv4 route changes, read in the event
    loop (no child process); each burst of changes is followed, ``settle`` seconds after its first message, by
    one refresh of every host table (changes arriving during a refresh cause another). A refresh that fails is
    logged and tried again a second later. ``start()`` refreshes once (what changed before it subscribed);
    ``close()`` closes the socket and the task, after a refresh in progress finished (each refresh runs ``ip``
    and ``nft`` a few times; no process of the watcher outlives it). The socket is made in the namespace of the
    process's main thread (the host's, for the daemon)."""

    def __init__(self, *, tools: NetworkTools | None = None, settle: float = 0.1) -> None:
        self._tools = tools
        self._settle = settle
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[list[str]] | None = None
        self._changed = asyncio.Event()
        self.refreshes = 0
        """How many refreshes completed (for diagnostics)."""

    @property
    def running(self) -> bool:
        return self._sock is not None

    async def start(self) -> None:
        if self._sock is not None:
            return
        _require_root()
        self._tools = self._tools or NetworkTools.find()
        sock = await asyncio.to_thread(in_namespace, f"/proc/{os.getpid()}/ns/net", _netlink_socket)
        loop = asyncio.get_running_loop()
        self._sock = sock
        loop.add_reader(sock.fileno(), self._readable)
        self._changed.set()
        self._task = asyncio.create_task(self._run(), name="vz-host-networks")

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while True:
            try:
                if not sock.recv(65536):
                    break
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:  # ENOBUFS: messages lost, and a refresh reads everything anyway
                    log.warning("host network changes: %s", exc)
                    self._changed.set()
                    break
            self._changed.set()

    async def _run(self) -> None:
        while True:
            await self._changed.wait()
            await asyncio.sleep(self._settle)
            self._changed.clear()
            # Shielded: a close() meanwhile lets the refresh finish (its ip/nft children reaped), then returns.
            self._refresh = asyncio.ensure_future(refresh_host_networks(tools=self._tools))
            try:
                await asyncio.shield(self._refresh)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("the host's networks were not refreshed in the egress tables: %s", exc)
                await asyncio.sleep(1.0)
                self._changed.set()
                continue
            self.refreshes += 1

    async def close(self) -> None:
        sock, task = self._sock, self._task
        self._sock, self._task = None, None
        if sock is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        refresh, self._refresh = self._refresh, None
        if refresh is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await refresh
