"""linux_native's version 1 networking: the shared per-Machine namespace networking of ``vz_drivers._machine``
(the container's namespace, found by its init's pid; see that module for the rules)."""

from __future__ import annotations

from vz_drivers._machine import (
    NetworkConfig,
    check_subnet,
    host_routes,
    host_table_name,
    remove_host_link,
    remove_host_table,
    setup_network,
)

__all__ = [
    "NetworkConfig",
    "check_subnet",
    "host_routes",
    "host_table_name",
    "remove_host_link",
    "remove_host_table",
    "setup_network",
]
