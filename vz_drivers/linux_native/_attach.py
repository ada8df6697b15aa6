"""A version 2 Machine's attachment to its Environment's route domain (docs/network.md, "linux_native attachment").

The Environment layer compiles the topology plan, creates the route domain (``vz_core.network.ensure_domain``)
and passes each Machine its slice of the plan as the RunImage label ``vz.network``: the compact JSON of a plan
holding only that Machine (so ``DomainSpec.from_plan`` and ``attach_machine`` read it unchanged)::

    {"format": 1, "environment_id": "env_…", "route_domain": "vzd-…",
     "networks": [{"name", "subnet", "gateway", "machines": [m]}, …],          # the Machine's networks only
     "machines": [{"name": m, "attachments": [{"network", "address", "prefixlen", "gateway",
                                               "machine_ifname", "domain_ifname"}, …],
                   "dns_server": "10.89.242.1", "search": ["vz.internal"], "egress": {…}}],
     "forward": [], "input": []}

The driver advertises that it reads the label with the Extensions fact ``topology`` (``FACT_KEY``). A Machine
with the label is, between ``runc create`` and ``runc start`` (its namespace exists, its process has not run
yet), joined to the domain by ``vz_core.network.attach_machine`` on ``/proc/<pid>/ns/net`` instead of getting the
driver's own ``allow``/``deny`` networking (``_network.setup_network``), and its ``/etc/resolv.conf`` names the
plan's DNS server. Every start re-attaches (the container, and so its namespace, is new at each start: the
pair is created again, idempotently); releasing a start (stop, delete, a failed start) detaches it, so no
domain end outlives its Machine. The kernel of the domain, not the Machine, decides what connects: a Machine
with the label has no link but its attachments (no route to the host, no host-wide pool, no masquerade).

The label is read and checked whole (``network_slice``: ``vz_core.network.label.parse_machine_slice``, shared by
the drivers) when RunImage is validated, before anything is created: a damaged label is refused naming what is
wrong. At every start the Machine is attached with its **current** slice (``vz_core.network.label.current_slice``:
the one ``vz up`` recorded when the Machine's attachments changed after its creation, else the label's), which is
noted for ``vz up`` (``note_attached``); a Machine whose current slice has no attachment gets the isolated
``deny`` networking (loopback only), never the version 1 ``allow``.
"""

from __future__ import annotations

from collections.abc import Mapping

from vz_core.errors import InvalidArgumentError
from vz_core.network import attach_machine, detach_machine
from vz_core.network.label import FACT_KEY, LABEL, MachineSlice, current_slice, note_attached, parse_machine_slice
from vz_drivers.linux_native._network import NetworkConfig, setup_network

__all__ = [
    "FACT",
    "FACT_KEY",
    "LABEL",
    "MachineSlice",
    "connect_machine",
    "disconnect_machine",
    "network_slice",
    "resolv_conf_for",
]

FACT = (
    "route-domain attachment: a RunImage label vz.network=<the Machine's topology plan slice as JSON> joins the "
    "Machine to the Environment's route domain (vz_core.network; created by the caller before RunImage) instead "
    "of the driver's egress networking; resolv.conf names the plan's DNS server (docs/network.md)"
)


def network_slice(labels: Mapping[str, str]) -> MachineSlice | None:
    """The Machine's slice from its labels (None: no ``vz.network`` label, the driver's own networking), checked
    whole by ``vz_core.network.label.parse_machine_slice`` (the parser every driver shares); InvalidArgumentError
    naming the problem otherwise."""
    return parse_machine_slice(labels)


async def connect_machine(cfg: NetworkConfig, *, pid: int, key: str, egress: str, labels: Mapping[str, str]) -> None:
    """Network of the created, not yet started container whose init is ``pid``.

    With a ``vz.network`` label: its attachments to the route domain (which must exist; the Environment layer
    creates it before RunImage and before every start). Without: the driver's own ``allow``/``deny`` networking.
    """
    found = current_slice(labels)
    if found is None:
        # No attachment now: version 1 networking, or (a version 2 Machine whose networks were all removed) the
        # isolated "deny" one: a version 2 Machine's driver-level egress is always "deny".
        await setup_network(cfg, pid=pid, key=key, egress="deny" if LABEL in labels else egress)
    else:
        await attach_machine(found.plan, found.machine, f"/proc/{pid}/ns/net")
    note_attached(labels, found)


async def disconnect_machine(labels: Mapping[str, str]) -> None:
    """Remove a released Machine's domain ends, the current slice's and the label's (idempotent; nothing for a
    Machine without either)."""
    try:
        current = current_slice(labels)
    except InvalidArgumentError:  # a damaged recorded slice never keeps a Machine from stopping: the label's
        current = None
    done: list[dict[str, object]] = []
    for found in (current, network_slice(labels)):
        if found is not None and found.plan not in done:
            done.append(found.plan)
            await detach_machine(found.plan, found.machine)


def resolv_conf_for(labels: Mapping[str, str], default: str) -> str:
    """The Machine's /etc/resolv.conf: the current slice's DNS server and search domain, else ``default``."""
    found = current_slice(labels)
    return default if found is None else found.resolv_conf()
