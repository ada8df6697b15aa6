"""Host-side network realization: an Environment's route domain in the Linux kernel (docs/network.md).

Input is a topology plan in its JSON form (``vz_core.env`` compiles it from vz.json and the environment id).

* ``ensure_domain(plan, uplink=KEEP)``: the Environment's own network namespace ``vzd-<id>``, its sysctls and its
  nft table (deny first; exactly the declared paths forwarded; egress per Machine through the uplink, if any);
* ``ensure_egress(plan)`` / ``remove_host_egress(environment_id)``: the host half of egress (the uplink's /30
  from the host pool, forwarding on its host end, the host table ``inet vz_<id12>`` masquerading it and
  dropping anything toward the host, its connected networks, link-local and the other uplinks);
  ``HostNetworkWatcher`` / ``refresh_host_networks()``: those tables follow the host's networks as they change;
* ``ensure_direct_egress(subnet, links)`` / ``remove_direct_egress(subnet)``: the same host guard for version 1
  Machines' own links on the host (linux_native's ``allow``), plus DNS to the host's resolvers;
* ``attach_machine(plan, machine, netns)`` / ``detach_machine(plan, machine)``: a Machine's namespace joined to
  (or removed from) the domain through routed veth pairs;
* ``remove_domain(environment_id)``: everything of that Environment, nothing of another;
* ``domain_ruleset(DomainSpec.from_plan(plan))``: the nft table as text (pure);
* ``DnsServer(plan)``: the Environment's DNS responder on each gateway (each Machine resolves only the names its
  plan lets it see; names beyond the Environment are forwarded to the host's resolvers as its egress allows,
  an allowlist's answers admitted in the domain for their TTL); ``dns_answer(DnsView.from_plan(plan), source,
  query)`` is its pure core;
* ``ExportListener(plan, machine, service)`` / ``ImportRelay(plan, index)``: TCP relays between 127.0.0.1 on the
  host and a Machine's service (export), or a Machine's gateway port and a host loopback port (import);
* ``NetworkHost``: those long-lived parts of every running Environment in one process (the daemon), keyed by
  environment id: ``ensure(plan, ports=...)`` -> its ``Endpoint``s, ``stop``, ``remove``.

All of it is async (asyncio subprocesses), idempotent and keyed by the environment id.
"""

from __future__ import annotations

from vz_core.network._dns import DnsServer, DnsView, forwardable, host_resolvers, name_matches
from vz_core.network._dns import answer as dns_answer
from vz_core.network._domain import (
    KEEP,
    NETNS_DIR,
    NetworkTools,
    Uplink,
    attach_machine,
    detach_machine,
    domain_exists,
    ensure_domain,
    list_domains,
    uplink_name,
)
from vz_core.network._egress import (
    DEFAULT_POOL,
    POOL_ENV,
    HostNetworks,
    HostNetworkWatcher,
    direct_egress_ruleset,
    direct_table,
    ensure_direct_egress,
    ensure_egress,
    host_egress_ruleset,
    host_networks_script,
    host_table,
    needs_uplink,
    read_host_networks,
    refresh_host_networks,
    remove_direct_egress,
    remove_host_egress,
)
from vz_core.network._host import Endpoint, NetworkHost
from vz_core.network._relay import ExportListener, ImportRelay
from vz_core.network._rules import TABLE, domain_ruleset
from vz_core.network._spec import AttachmentSpec, DomainSpec, ForwardSpec, InputSpec, PlanError, domain_for
from vz_core.network._teardown import remove_domain

__all__ = [
    "DEFAULT_POOL",
    "KEEP",
    "NETNS_DIR",
    "POOL_ENV",
    "TABLE",
    "AttachmentSpec",
    "DnsServer",
    "DnsView",
    "DomainSpec",
    "Endpoint",
    "ExportListener",
    "ForwardSpec",
    "HostNetworkWatcher",
    "HostNetworks",
    "ImportRelay",
    "InputSpec",
    "NetworkHost",
    "NetworkTools",
    "PlanError",
    "Uplink",
    "attach_machine",
    "detach_machine",
    "direct_egress_ruleset",
    "direct_table",
    "dns_answer",
    "domain_exists",
    "domain_for",
    "domain_ruleset",
    "ensure_direct_egress",
    "ensure_domain",
    "ensure_egress",
    "forwardable",
    "host_egress_ruleset",
    "host_networks_script",
    "host_resolvers",
    "host_table",
    "list_domains",
    "name_matches",
    "needs_uplink",
    "read_host_networks",
    "refresh_host_networks",
    "remove_direct_egress",
    "remove_domain",
    "remove_host_egress",
    "uplink_name",
]
