"""The shared layer of drivers whose Machines run the vz guest agent (linux_native, qemu; vfkit, hyperv next).

``AgentMachineDriver`` implements the ``vz_core.Driver`` contract once: records, per-Machine locks, Find,
ReusePreflight, RunImage's order, Start/Stop/Delete, readiness on a signal (the agent answers or the backend
process dies), Exec and Logs through the agent. A driver is a ``Backend`` (what differs: plan/boot/connect/
shutdown and facts) and a thin ``AgentMachineDriver`` subclass that builds it from its options::

    class VfkitDriver(AgentMachineDriver[VfkitRecord, VfkitPaths]):
        def __init__(self, **options: Any) -> None:
            super().__init__(VfkitBackend(**options))

The host side of every agent channel is opened with ``open_agent_socket``: never through a link, and only
when the process the record names listens on it.
"""

from __future__ import annotations

import sys

from vz_drivers._files import atomic_write, host_write_error, read_chunks_nofollow
from vz_drivers._machine._book import (
    MachinePaths,
    MachineRecord,
    MountRecord,
    RecordBook,
    machine_key,
    subpath,
    volume_key,
)
from vz_drivers._machine._driver import (
    AgentKeys,
    AgentLink,
    AgentMachineDriver,
    Backend,
    ImageSource,
    MachinePlan,
    ResolvedImage,
    checked_executable,
    chown_tree,
    no_input,
    now,
    record_fields,
    tail,
)
from vz_drivers._machine._identity import ResolvedUser, check_user_syntax, resolve_user

if sys.platform != "win32":  # network namespaces (Linux) and the Unix-socket agent channel: not on Windows
    from vz_drivers._machine._channel import open_agent_socket, peer_pid
    from vz_drivers._machine._network import (
        NetworkConfig,
        check_subnet,
        host_routes,
        host_table_name,
        remove_host_link,
        remove_host_table,
        setup_network,
    )
from vz_drivers._machine._procs import kill_process, proc_start_time, wait_gone
from vz_drivers._machine._sockets import SOCKET_LIMIT, private_dir, socket_dir
from vz_drivers._machine._validate import (
    KNOWN_PROFILES,
    RESERVED_TARGETS,
    CommonRequest,
    Rules,
    check_target,
    check_workspace_id,
    validate_common,
)

__all__ = [
    "KNOWN_PROFILES",
    "RESERVED_TARGETS",
    "SOCKET_LIMIT",
    "AgentKeys",
    "AgentLink",
    "AgentMachineDriver",
    "Backend",
    "CommonRequest",
    "ImageSource",
    "MachinePaths",
    "MachinePlan",
    "MachineRecord",
    "MountRecord",
    "NetworkConfig",
    "RecordBook",
    "ResolvedImage",
    "ResolvedUser",
    "Rules",
    "atomic_write",
    "check_subnet",
    "check_target",
    "check_user_syntax",
    "check_workspace_id",
    "checked_executable",
    "chown_tree",
    "host_routes",
    "host_table_name",
    "host_write_error",
    "kill_process",
    "machine_key",
    "no_input",
    "now",
    "open_agent_socket",
    "peer_pid",
    "private_dir",
    "proc_start_time",
    "read_chunks_nofollow",
    "record_fields",
    "remove_host_link",
    "remove_host_table",
    "resolve_user",
    "setup_network",
    "socket_dir",
    "subpath",
    "tail",
    "validate_common",
    "volume_key",
    "wait_gone",
]
