"""Names of the declarations that can make a case not applicable, and how to read them.

A name is what a report records next to a not-applicable outcome; ``declared`` answers whether the driver
declared it (the gate re-derives this from the Info recorded in the report).
"""

from __future__ import annotations

from vz_core import Capabilities, DriverInfo, EgressPolicy, Extensions, MountType, RecreateMode

__all__ = [
    "ALL",
    "EGRESS",
    "LOGS",
    "MOUNT_BIND",
    "MOUNT_TMPFS",
    "MOUNT_VOLUME",
    "PROVISIONING_PREFLIGHT",
    "RECREATE_ON_RUN",
    "RESOURCE_LIMITS",
    "REUSE_PREFLIGHT",
    "SAVE_STATE",
    "SERVICES",
    "STORAGE_LIMITS",
    "TERMINAL",
    "TOPOLOGY",
    "declared",
    "mount_capability",
]

PROVISIONING_PREFLIGHT = "capabilities.provisioning_preflight"
LOGS = "capabilities.logs"
REUSE_PREFLIGHT = "capabilities.reuse_preflight"
MOUNT_BIND = "capabilities.mount_types.bind"
MOUNT_VOLUME = "capabilities.mount_types.volume"
MOUNT_TMPFS = "capabilities.mount_types.tmpfs"
RECREATE_ON_RUN = "capabilities.recreate_mode.on_run"
EGRESS = "extensions.egress_policies.deny"
RESOURCE_LIMITS = "extensions.resource_limits"
STORAGE_LIMITS = "extensions.storage_limits"
TERMINAL = "extensions.terminal"
SAVE_STATE = "extensions.save_state"
SERVICES = "extensions.services"
"""SetServices, ServiceStates and ServiceLogs (vz.machine.v1): the Machine supervises long-running commands."""
TOPOLOGY = "extensions.facts.topology"
"""The Extensions fact ``topology``: the driver joins a Machine with the ``vz.network`` label to its route domain."""

ALL = (
    PROVISIONING_PREFLIGHT,
    LOGS,
    REUSE_PREFLIGHT,
    MOUNT_BIND,
    MOUNT_VOLUME,
    MOUNT_TMPFS,
    RECREATE_ON_RUN,
    EGRESS,
    RESOURCE_LIMITS,
    STORAGE_LIMITS,
    TERMINAL,
    TOPOLOGY,
    SAVE_STATE,
    SERVICES,
)

_MOUNTS = {MountType.BIND: MOUNT_BIND, MountType.VOLUME: MOUNT_VOLUME, MountType.TMPFS: MOUNT_TMPFS}


def mount_capability(kind: MountType) -> str:
    return _MOUNTS[kind]


def declared(
    name: str, info: DriverInfo, extensions: Extensions | None, on_run_mode: RecreateMode | int | None
) -> bool:
    """Whether the driver declared ``name``. ``on_run_mode`` is the recreate mode answered to a host that
    opted in to recreate-on-run."""
    caps = info.capabilities or Capabilities()
    ext = extensions
    if name == PROVISIONING_PREFLIGHT:
        return caps.provisioning_preflight
    if name == LOGS:
        return caps.logs
    if name == REUSE_PREFLIGHT:
        return caps.reuse_preflight
    for kind, cap in _MOUNTS.items():
        if name == cap:
            return kind in caps.mount_types
    if name == RECREATE_ON_RUN:
        return on_run_mode == RecreateMode.ON_RUN
    if name == EGRESS:
        return ext is not None and EgressPolicy.DENY in ext.egress_policies
    if name == RESOURCE_LIMITS:
        return ext is not None and ext.resource_limits
    if name == STORAGE_LIMITS:
        return ext is not None and ext.storage_limits
    if name == TERMINAL:
        return ext is not None and ext.terminal
    if name == SAVE_STATE:
        return ext is not None and ext.save_state
    if name == SERVICES:
        return ext is not None and ext.services
    if name == TOPOLOGY:
        return ext is not None and bool(ext.facts.get("topology"))
    raise KeyError(f"unknown capability name {name!r}; known: {', '.join(ALL)}")
