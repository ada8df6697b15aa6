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

from vz_core.network._spec import DomainSpec

__all__ = ["TABLE", "domain_ruleset", "replace_script"]

TABLE = "vz"


def _elements(items: list[str]) -> str:
    return f"    elements = {{ {', '.join(items)} }}\n" if items else ""


def domain_ruleset(spec: DomainSpec) -> str:
    """The ``table inet vz`` definition for ``spec`` (every name in it was checked by ``DomainSpec``)."""
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
        "  chain prerouting {\n"
        "    type filter hook prerouting priority raw; policy drop;\n"
        '    iifname "lo" accept\n'
        "    meta nfproto ipv4 iifname . ip saddr @sources accept\n"
        "  }\n"
        "  chain forward {\n"
        "    type filter hook forward priority filter; policy drop;\n"
        "    ct state established,related accept\n"
        "    ct state invalid drop\n"
        "    ct state new ip saddr . oifname . ip daddr . meta l4proto . th dport @paths accept\n"
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
        "}\n"
    )


def replace_script(spec: DomainSpec) -> str:
    """One nft transaction replacing the table whole (never a moment with half the rules, never duplicates)."""
    return f"table inet {TABLE}\ndelete table inet {TABLE}\n{domain_ruleset(spec)}"
