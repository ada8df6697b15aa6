"""The nftables table of one route domain, as text (pure: the same spec gives the same script).

Deny first: the table ``inet vz`` lives inside the domain's own namespace, so it never meets another
Environment's rules or the host's. Three sets carry the declaration:

* ``sources`` (domain interface . IPv4 source): the only (interface, address) pairs a packet may arrive with.
  Anything else (a Machine using another Machine's address, IPv6, a stray protocol) is dropped in prerouting.
* ``paths`` (source . out-interface . destination . protocol . port): new flows allowed through the domain:
  exactly the declared paths (the source is bound to its interface by ``sources``; nft concatenations hold five
  fields at most). Replies ride conntrack (established, related).
* ``local`` (interface . source . gateway . protocol . port): new flows allowed to the domain's own address
  (its DNS resolver, import relays).

Every other forwarded or local packet is rejected (TCP reset, ICMP administratively prohibited), so refused
connects fail fast and never reach their destination.
"""

from __future__ import annotations

import ipaddress

from vz_core.network._spec import DomainSpec

__all__ = ["DNS_SET", "LAN", "NEVER", "TABLE", "UPLINK", "domain_ruleset", "replace_script"]

TABLE = "vz"
UPLINK = "vzup"
"""The domain's end of its uplink (a domain-local name; the other end is ``vzu<id12>`` upstream)."""
NEVER = ("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4")
"""Destinations egress never reaches (the uplink's own network is added: upstream is the host)."""
DNS_SET = "egress_dns"
"""(Machine address . resolved address) pairs an allowlist's domain names admit, added by the Environment's
resolver with a timeout (the answer's TTL, clamped): they expire, and ``replace_script`` keeps live ones."""
LAN = ("10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16")
"""Private ranges: ``allowed`` egress does not reach them; an allowlist may name them explicitly."""


def _elements(items: list[str]) -> str:
    return f"    elements = {{ {', '.join(items)} }}\n" if items else ""


def domain_ruleset(spec: DomainSpec, uplink: ipaddress.IPv4Network | None = None) -> str:
    """The ``table inet vz`` definition for ``spec`` (every name in it was checked by ``DomainSpec``).

    ``uplink`` is the network of the domain's uplink, if it has one (it joins the ``never`` set)."""
    addresses: dict[str, list[str]] = {}
    for a in spec.attachments:
        addresses.setdefault(a.machine, []).append(str(a.address))
    egress_all = sorted({ip for e in spec.egress if e.mode == "allowed" for ip in addresses.get(e.machine, [])})
    egress_cidrs = sorted(
        {
            f"{ip} . {net}"
            for e in spec.egress
            if e.mode == "allowlist"
            for ip in addresses.get(e.machine, [])
            for net in ipaddress.collapse_addresses(e.cidrs)  # an interval set refuses overlapping elements
        }
    )
    never = [*NEVER, *([str(uplink)] if uplink is not None else [])]
    sources = sorted({f'"{a.domain_ifname}" . {a.address}' for a in spec.attachments})
    paths = sorted(
        {f'{r.source_address} . "{r.dest_ifname}" . {r.dest_address} . {r.protocol} . {r.port}' for r in spec.forward}
    )
    local = sorted({f'"{r.ifname}" . {r.address} . {r.gateway} . {r.protocol} . {r.port}' for r in spec.input})
    return (
        f"table inet {TABLE} {{\n"
        "  set sources {\n"
        "    type ifname . ipv4_addr\n"
        f"{_elements(sources)}"
        "  }\n"
        "  set paths {\n"
        "    type ipv4_addr . ifname . ipv4_addr . inet_proto . inet_service\n"
        f"{_elements(paths)}"
        "  }\n"
        "  set local {\n"
        "    type ifname . ipv4_addr . ipv4_addr . inet_proto . inet_service\n"
        f"{_elements(local)}"
        "  }\n"
        "  set egress_all {\n"
        "    type ipv4_addr\n"
        f"{_elements(egress_all)}"
        "  }\n"
        "  set egress_cidrs {\n"
        "    type ipv4_addr . ipv4_addr\n"
        "    flags interval\n"
        f"{_elements(egress_cidrs)}"
        "  }\n"
        f"  set {DNS_SET} {{\n"
        "    type ipv4_addr . ipv4_addr\n"
        "    flags timeout\n"
        "  }\n"
        "  set never {\n"
        "    type ipv4_addr\n"
        "    flags interval\n"
        f"{_elements(never)}"
        "  }\n"
        "  set lan {\n"
        "    type ipv4_addr\n"
        "    flags interval\n"
        f"{_elements(list(LAN))}"
        "  }\n"
        "  chain prerouting {\n"
        "    type filter hook prerouting priority raw; policy drop;\n"
        '    iifname "lo" accept\n'
        f'    iifname "{UPLINK}" meta nfproto ipv4 accept\n'
        "    meta nfproto ipv4 iifname . ip saddr @sources accept\n"
        "  }\n"
        "  chain forward {\n"
        "    type filter hook forward priority filter; policy drop;\n"
        "    ct state established,related accept\n"
        "    ct state invalid drop\n"
        "    ct state new ip saddr . oifname . ip daddr . meta l4proto . th dport @paths accept\n"
        f'    ct state new oifname "{UPLINK}" ip daddr != @never ip saddr @egress_all ip daddr != @lan accept\n'
        f'    ct state new oifname "{UPLINK}" ip daddr != @never ip saddr . ip daddr @egress_cidrs accept\n'
        f'    ct state new oifname "{UPLINK}" ip daddr != @never ip saddr . ip daddr @{DNS_SET} accept\n'
        "    meta l4proto tcp reject with tcp reset\n"
        "    reject with icmpx admin-prohibited\n"
        "  }\n"
        "  chain input {\n"
        "    type filter hook input priority filter; policy drop;\n"
        '    iifname "lo" accept\n'
        "    ct state established,related accept\n"
        "    ct state invalid drop\n"
        "    ct state new iifname . ip saddr . ip daddr . meta l4proto . th dport @local accept\n"
        "    meta l4proto tcp reject with tcp reset\n"
        "    reject with icmpx admin-prohibited\n"
        "  }\n"
        "  chain postrouting {\n"
        "    type nat hook postrouting priority srcnat; policy accept;\n"
        f'    oifname "{UPLINK}" masquerade\n'
        "  }\n"
        "}\n"
    )


def replace_script(
    spec: DomainSpec,
    uplink: ipaddress.IPv4Network | None = None,
    resolved: list[tuple[ipaddress.IPv4Address, ipaddress.IPv4Address, int]] | None = None,
) -> str:
    """One nft transaction replacing the table whole (never a moment with half the rules, never duplicates).

    ``resolved``: live (Machine address, resolved address, seconds left) entries of the old table's
    ``egress_dns`` set; those whose Machine is still an allowlist Machine of ``spec`` are kept with the time
    they had left (a `vz up` does not make an allowlist forget what its resolver admitted)."""
    keep: list[str] = []
    if uplink is not None:
        allowlisted = {
            a.address for a in spec.attachments for e in spec.egress if e.machine == a.machine and e.mode == "allowlist"
        }
        keep = sorted(
            {f"{src} . {dst} timeout {max(1, left)}s" for src, dst, left in resolved or () if src in allowlisted}
        )
    elements = f"add element inet {TABLE} {DNS_SET} {{ {', '.join(keep)} }}\n" if keep else ""
    return f"table inet {TABLE}\ndelete table inet {TABLE}\n{domain_ruleset(spec, uplink)}{elements}"
