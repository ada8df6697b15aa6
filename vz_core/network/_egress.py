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
  uplink (``vzu*``), the host's directly connected networks (read when the table is written), link-local,
  loopback, multicast, reserved and the whole pool is dropped; nothing new is forwarded into the uplink;
* ``postrouting``: the domain's address is masqueraded behind the host's address on the way out.

The domain's own table already admits only what each Machine's egress allows (``_rules``); this table holds
even if a domain's rules were wrong. Forwarding is enabled on ``vzu<id12>`` only (IPv6 off there); a host with
IPv4 forwarding off (``net.ipv4.ip_forward=0``) is refused with that name rather than changed. The host's other
tables still apply: a forward policy of drop elsewhere (e.g. a container engine's) stops egress too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import os
import re
import weakref
from collections.abc import Mapping
from typing import Any

from vz_core.errors import FailedPreconditionError, InvalidArgumentError, RuntimeFailureError, UnavailableError
from vz_core.network._domain import NetworkTools, Uplink, _require_root, _run, ensure_domain, uplink_name
from vz_core.network._rules import NEVER
from vz_core.network._spec import DomainSpec, domain_for

__all__ = [
    "DEFAULT_POOL",
    "POOL_ENV",
    "ensure_egress",
    "host_egress_ruleset",
    "host_table",
    "needs_uplink",
    "remove_host_egress",
]

DEFAULT_POOL = "10.254.0.0/16"
POOL_ENV = "VZ_NETWORK_UPLINK_POOL"
_TABLE_RE = re.compile(r"vz_[0-9a-z]{12}")
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


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


def host_egress_ruleset(
    environment_id: str,
    uplink: Uplink,
    connected: list[ipaddress.IPv4Network],
    pool: ipaddress.IPv4Network | None = None,
) -> str:
    """The host table ``inet vz_<id12>`` for the Environment's uplink (pure); ``pool`` (every uplink's range)
    joins the destinations never forwarded to."""
    table = host_table(environment_id)
    dev = uplink_name(environment_id)
    never = sorted(
        ipaddress.collapse_addresses(
            [*(ipaddress.IPv4Network(n) for n in NEVER), uplink.network, *([pool] if pool is not None else [])]
        ),
        key=lambda n: (int(n.network_address), n.prefixlen),
    )
    nets = sorted(ipaddress.collapse_addresses(connected), key=lambda n: (int(n.network_address), n.prefixlen))

    def elements(items: list[ipaddress.IPv4Network]) -> str:
        return f"    elements = {{ {', '.join(str(n) for n in items)} }}\n" if items else ""

    return (
        f"table inet {table} {{\n"
        "  set never {\n"
        "    type ipv4_addr\n"
        "    flags interval\n"
        f"{elements(never)}"
        "  }\n"
        "  set connected {\n"
        "    type ipv4_addr\n"
        "    flags interval\n"
        f"{elements(nets)}"
        "  }\n"
        "  chain input {\n"
        "    type filter hook input priority filter - 5; policy accept;\n"
        f'    iifname "{dev}" drop\n'
        "  }\n"
        "  chain forward {\n"
        "    type filter hook forward priority filter - 5; policy accept;\n"
        f'    iifname "{dev}" meta nfproto != ipv4 drop\n'
        f'    iifname "{dev}" ip saddr != {uplink.domain_address} drop\n'
        f'    iifname "{dev}" oifname "vzu*" drop\n'
        f'    iifname "{dev}" ip daddr @never drop\n'
        f'    iifname "{dev}" ip daddr @connected drop\n'
        f'    oifname "{dev}" ct state established,related accept\n'
        f'    oifname "{dev}" drop\n'
        "  }\n"
        "  chain postrouting {\n"
        "    type nat hook postrouting priority srcnat; policy accept;\n"
        f'    ip saddr {uplink.domain_address} oifname != "vzu*" masquerade\n'
        "  }\n"
        "}\n"
    )


async def _json(tools: NetworkTools, *argv: str) -> list[dict[str, Any]]:
    data = json.loads(await _run([tools.ip, "-j", "-4", *argv], what=f"ip {' '.join(argv)}") or "[]")
    return [d for d in data if isinstance(d, dict)]


async def _host_networks(tools: NetworkTools, pool: ipaddress.IPv4Network) -> list[ipaddress.IPv4Network]:
    """The host's directly connected networks and its addresses (uplinks aside: those are the pool)."""
    nets: list[ipaddress.IPv4Network] = []
    for route in await _json(tools, "route", "show", "table", "all"):
        dst, dev = route.get("dst"), str(route.get("dev", ""))
        if dst in (None, "default") or "gateway" in route or route.get("type") not in (None, "unicast"):
            continue
        if dev.startswith("vzu"):
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
    return nets


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
    for item in await _json(tools, "addr", "show"):
        if item.get("ifname") == dev:
            for a in item.get("addr_info", []):
                if isinstance(a, dict) and a.get("family") == "inet":
                    net = ipaddress.IPv4Network(f"{a.get('local')}/{a.get('prefixlen')}", strict=False)
                    if net.prefixlen == 30 and net.subnet_of(pool):
                        return net  # what a previous `vz up` (or a killed one) allocated: kept
    taken: list[ipaddress.IPv4Network] = [*_resolvers()]
    for route in await _json(tools, "route", "show", "table", "all"):
        dst = route.get("dst")
        if dst in (None, "default") or route.get("dev") == dev:
            continue
        try:
            taken.append(ipaddress.IPv4Network(str(dst), strict=False))
        except ValueError:
            continue
    for item in await _json(tools, "addr", "show"):
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


async def _host_tables(tools: NetworkTools) -> list[str]:
    data = json.loads(await _run([tools.nft, "-j", "list", "tables", "inet"], what="list nft tables") or "{}")
    names = []
    for item in data.get("nftables", []) if isinstance(data, dict) else []:
        table = item.get("table") if isinstance(item, dict) else None
        if isinstance(table, dict) and table.get("family") == "inet" and _TABLE_RE.fullmatch(str(table.get("name"))):
            names.append(str(table["name"]))
    return names


async def remove_host_egress(environment_id: str, *, tools: NetworkTools | None = None) -> bool:
    """Remove the host half of the Environment's egress (its table, a leftover ``vzu<id12>``); whether any."""
    _require_root()
    tools = tools or NetworkTools.find()
    table = host_table(environment_id)
    found = False
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
        uplink = Uplink.of(f"/proc/{os.getpid()}/ns/net", str(await _allocate(env_id, network, tools)))
        await ensure_domain(plan, uplink=uplink, tools=tools)
    dev = uplink_name(env_id)
    await _run(
        [tools.sysctl, "-q", "-w", f"net.ipv4.conf.{dev}.forwarding=1", f"net.ipv6.conf.{dev}.disable_ipv6=1"],
        what=f"forwarding on {dev}",
    )
    table = host_table(env_id)
    script = f"table inet {table}\ndelete table inet {table}\n" + host_egress_ruleset(
        env_id, uplink, await _host_networks(tools, network), network
    )
    await _run([tools.nft, "-f", "-"], script.encode(), what=f"nft table {table}")
    await _sweep(tools)
    return uplink
