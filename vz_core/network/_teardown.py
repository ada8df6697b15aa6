"""Removing an Environment's route domain: the host half of its egress, then its links, nft table and namespace
(above both ``_domain`` and ``_egress``, which it takes apart in that order)."""

from __future__ import annotations

from vz_core.network._domain import Domain, delete_link
from vz_core.network._egress import remove_host_egress
from vz_core.network._ns import NetworkTools, require_root, run
from vz_core.network._rules import TABLE
from vz_core.network._spec import domain_for

__all__ = ["remove_domain"]


async def remove_domain(environment_id: str, *, tools: NetworkTools | None = None) -> bool:
    """Remove the Environment's route domain: its links (and so the Machine ends), its nft table, the namespace.

    Returns whether there was one. Touches nothing but ``vzd-<id>``."""
    name = domain_for(environment_id)
    require_root()
    tools = tools or NetworkTools.find()
    domain = Domain(tools, name)
    await remove_host_egress(environment_id, tools=tools)  # the host half of its egress (a leftover one too)
    if not await domain.exists():
        return False
    # Links and table first: even if some process still holds the namespace open, nothing is connected any more.
    for link in await domain.links():
        ifname = link.get("ifname")
        if link.get("link_type") != "loopback" and isinstance(ifname, str):
            await delete_link(domain, ifname)
    script = f"table inet {TABLE}\ndelete table inet {TABLE}\n".encode()
    await run(domain.inside(tools.nft, "-f", "-"), script, what=f"remove the nft table of {name}")
    await run([tools.ip, "netns", "del", name], what=f"remove namespace {name}")
    return True
