"""The fake driver's route-domain attachment: a Machine given the ``vz.network`` label runs in a network namespace.

The model of what linux_native does with runc: each start of such a Machine creates its namespace
``vzf-<10 hex of the Machine key>`` (``/run/netns``), joins it to the Environment's route domain with
``vz_core.network.attach_machine`` (veth pairs created directly between the two namespaces) and writes its
``/etc/resolv.conf`` (``/etc/netns/<name>/resolv.conf``, which ``ip netns exec`` binds over the host's for every
process of the Machine). The Machine's main process and every exec run through ``ip netns exec <name>``: they
have ``lo`` and their ``ethN`` only. Stop, Delete and recreation release it: ``detach_machine``, then the
namespace and its resolv.conf are removed (the namespace of a stopped container is gone too). The label is
checked whole (``vz_core.network.label.parse_machine_slice``) when RunImage is validated, before anything is
created. Needs root and ``ip``; the route domain must exist (the host creates it before RunImage and Start).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from vz_core.errors import FailedPreconditionError, RuntimeFailureError
from vz_core.network import attach_machine, detach_machine, domain_exists
from vz_core.network.label import FACT_KEY, LABEL, MachineSlice, current_slice, note_attached, parse_machine_slice

__all__ = ["FACT", "FACT_KEY", "LABEL", "attach", "namespace_for", "release", "validate"]

FACT = (
    "route-domain attachment: a RunImage label vz.network=<the Machine's topology plan slice> runs the Machine's "
    "processes in a network namespace joined to the Environment's route domain (vz_core.network), resolv.conf "
    "naming the plan's DNS server; needs root"
)
NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")


def namespace_for(key: str) -> str:
    """The network namespace of the Machine stored under ``key`` (15 characters at most)."""
    return "vzf-" + hashlib.sha256(key.encode()).hexdigest()[:10]


def validate(labels: Mapping[str, str]) -> MachineSlice | None:
    """The Machine's slice, checked whole; a host that cannot attach it is refused before anything is created."""
    found = parse_machine_slice(labels)
    if found is None:
        return None
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise FailedPreconditionError(
            f"label {LABEL}: the fake driver attaches Machines to route domains with network namespaces, which "
            "needs root and ip (iproute2); run the driver as root",
            details={"field": "labels", "label": LABEL},
        )
    if not domain_exists(str(found.plan["environment_id"])):
        raise FailedPreconditionError(
            f"label {LABEL}: the route domain {found.plan['route_domain']} does not exist; "
            "create it (vz up, vz_core.network.ensure_domain) before creating or starting the Machine",
            details={"field": "labels", "label": LABEL},
        )
    return found


async def _ip(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "ip", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeFailureError(f"ip {' '.join(args)} failed: {err.decode(errors='replace').strip()}")


async def attach(key: str, labels: Mapping[str, str], *, resolv: bool = True, join: bool = True) -> str | None:
    """Create the Machine's namespace and join it to its route domain; its name (None: no label).

    The attachment is the Machine's current slice (``current_slice``: the one ``vz up`` recorded when its
    attachments changed after creation, else its label's), noted once made (``note_attached``), as linux_native
    and qemu do. ``resolv``/``join`` False leave out the resolv.conf / the attachment (fault modes only)."""
    if validate(labels) is None:
        return None
    found = current_slice(labels)
    name = namespace_for(key)
    if not (NETNS_DIR / name).exists():
        await _ip("netns", "add", name)
    etc = ETC_NETNS / name
    etc.mkdir(parents=True, exist_ok=True)
    resolv_conf = etc / "resolv.conf"
    if resolv and found is not None:
        resolv_conf.write_text(found.resolv_conf())
    else:
        resolv_conf.unlink(missing_ok=True)
    if join and found is not None:
        await attach_machine(found.plan, found.machine, str(NETNS_DIR / name))
    if join:
        note_attached(labels, found)
    return name


async def release(key: str, labels: Mapping[str, str]) -> None:
    """Remove the Machine's domain ends, its namespace and its resolv.conf (idempotent)."""
    if parse_machine_slice(labels) is None:
        return
    found = current_slice(labels)
    name = namespace_for(key)
    if found is not None and domain_exists(str(found.plan["environment_id"])):
        await detach_machine(found.plan, found.machine)
    if (NETNS_DIR / name).exists():
        await _ip("netns", "del", name)
    shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
