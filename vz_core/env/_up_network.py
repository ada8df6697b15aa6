"""The route domain of a version 2 Environment during `vz up` (docs/network.md, "linux_native attachment"):
realized before any Machine is created or started, and a running Machine re-attached when its share changed."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vz_core.env._context import Context
from vz_core.env._drivers import DriverFacts, DriverPool
from vz_core.env._store import EnvironmentRecord, MachineRecord
from vz_core.errors import UserError

if TYPE_CHECKING:
    from vz_core.env._definition import ProjectDefinition

__all__ = ["attaches", "ensure_route_domain", "network_label", "reattach_if_changed"]


def attaches(facts: DriverFacts) -> bool:
    """Whether the driver joins a Machine to its route domain from the ``vz.network`` label (Extensions fact)."""
    from vz_core.network.label import FACT_KEY

    ext = facts.extensions
    return ext is not None and FACT_KEY in ext.facts


def network_label(plan: Mapping[str, Any], machine: str) -> str | None:
    """The ``vz.network`` label of one Machine: its topology plan slice (a plan holding only that Machine and its
    networks, no rules) as compact JSON; None for a Machine attached to no network."""
    from vz_core.network.label import machine_slice

    return machine_slice(plan, machine)


async def ensure_route_domain(
    ctx: Context,
    pool: DriverPool,
    definition: ProjectDefinition,
    env: EnvironmentRecord,
    recorded: list[MachineRecord] | None = None,
) -> dict[str, Any] | None:
    """Compile a version 2 Environment's plan and realize its route domain before any Machine is created or
    started (idempotent); the plan's JSON, or None when no Machine's driver attaches to route domains.

    Today this runs in the process running `vz up` (the daemon, since the CLI goes through it); the daemon is
    meant to own the domain and its long-lived parts (DNS, relays) once it keeps the plans it serves."""
    if definition.version != 2:
        return None
    attaching = False
    for machine in definition.machines:
        _, facts = await pool.get(machine.driver, machine.driver_options)
        attaching = attaching or attaches(facts)
    if not attaching:
        return None
    if sys.platform != "linux":  # route domains are Linux-only (vz_core.network): refused before anything exists
        raise UserError(
            f"this Environment's networks need route domains, which exist only on Linux hosts ({sys.platform} "
            "has none); run it on a Linux host, or remove its `networks` to use it here"
        )
    from vz_core.env._topology import compile_topology
    from vz_core.network import ensure_domain, ensure_egress

    plan = compile_topology(definition, env.env_id).to_json()
    fields = {"environment": env.name, "environment_id": env.env_id, "route_domain": plan["route_domain"]}
    with ctx.progress.step("network", f"preparing route domain {plan['route_domain']}", **fields):
        await ensure_domain(plan)
        await ensure_egress(plan)  # before the Machines start: their first start has their egress (idempotent)
        # The label is fixed at creation: each recorded Machine's current slice is what its driver attaches
        # with at its next start (vz_core.network.label.current_slice).
        import asyncio

        from vz_core.network.label import write_slices

        names = {m.name for m in definition.machines}
        await asyncio.to_thread(
            write_slices,
            env.env_id,
            {r.machine_id: network_label(plan, r.name) for r in recorded or [] if r.name in names},
        )
    return plan


async def reattach_if_changed(
    ctx: Context, driver: Any, record: MachineRecord, topology: Mapping[str, Any], env: EnvironmentRecord
) -> None:
    """A running Machine whose attachments changed since its last start is restarted (its data kept) so that
    its driver attaches it with its current slice: the domain ends are replaced, nothing else changes."""
    import asyncio

    from vz_core.network.label import LABEL, needs_reattach

    desired = network_label(topology, record.name)
    found = await driver.find(record.workspace_id)
    if found is None or found.state.status != "running":
        return
    created_with = found.config.labels.get(LABEL)
    if not await asyncio.to_thread(needs_reattach, env.env_id, record.machine_id, desired, created_with):
        return
    fields = {"environment": env.name, "environment_id": env.env_id, "machine": record.name}
    label = f"re-attaching machine {record.name} to its changed networks (restart)"
    with ctx.progress.step("reattach", label, machine_id=record.machine_id, **fields):
        await driver.stop(record.workspace_id)
        await driver.start(record.workspace_id)
