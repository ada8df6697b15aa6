"""What `vz up` refuses before anything changes: the bind-source policy, what each Machine asks of its driver
(target, profile, egress, workspace projection, mounts, volumes, resource limits), what the host can give,
local image sources, and read-write sharing of one worktree."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from vz_core._types import EgressPolicy, MountType
from vz_core.env._drivers import DriverFacts
from vz_core.env._progress import Progress
from vz_core.env._store import EnvironmentRecord, Store
from vz_core.errors import UserError
from vz_core.rules import host_task_limit, max_pids

if TYPE_CHECKING:
    from vz_core.env._definition import Machine, ProjectDefinition

__all__ = [
    "bind_source",
    "check_bind_source",
    "check_host_resources",
    "check_local_image",
    "check_machine",
    "check_shared_workspace",
    "check_worktree_writers",
    "host_architecture",
]


def check_bind_source(progress: Progress, source: Path, worktree: Path, where: str) -> None:
    """The bind-source policy (docs/user-guide.md): '/' is refused; the home directory itself and anything
    outside the project directory are allowed with a warning, since the Machine can read (or write) them."""
    resolved = source.resolve()
    if resolved == Path("/"):
        raise UserError(
            f"{where}: the host root directory '/' cannot be bind-mounted into a Machine (it would expose the whole "
            "host); mount the directories the Machine needs instead"
        )
    home = Path.home().resolve()
    project = worktree.resolve()
    if resolved == home:
        progress.note(
            "warning",
            f"warning: {where}: bind-mounts your whole home directory {home} into the Machine (keys, tokens and "
            "shell history included); mount only what it needs",
            field=where,
        )
    elif resolved != project and project not in resolved.parents:
        progress.note(
            "warning",
            f"warning: {where}: {resolved} is outside the project directory {project}; the Machine can reach it",
            field=where,
        )


def check_machine(
    machine: Machine,
    facts: DriverFacts,
    native_arch: str,
    worktree: Path,
    where: str,
    progress: Progress,
    version: int = 1,
) -> None:
    """Refuse what the driver did not advertise, naming the field and what to do."""
    _check_target(machine, facts, native_arch, where)
    _check_egress(machine, facts, where, version)
    _check_storage(machine, facts, worktree, where)
    _check_limits(machine, facts, where)


def _check_target(machine: Machine, facts: DriverFacts, native_arch: str, where: str) -> None:
    """The target OS, architecture and profile the driver runs."""
    driver = f"driver {facts.name!r}"
    if machine.target.os not in facts.target_os:
        raise UserError(
            f"{where}.target.os: {driver} cannot run {machine.target.os} Machines on this host (it runs: "
            f"{', '.join(facts.target_os) or 'nothing'}); choose another driver (`vz driver list`)"
        )
    from vz_core.capability_matrix import current_host_os, lookup

    entry = lookup(facts.name, current_host_os(), machine.target.os)
    if entry is not None and entry.status == "PLANNED":
        raise UserError(
            f"{where}: {driver} running {machine.target.os} Machines on a {entry.host_os} host is planned, not "
            "implemented yet (see docs/capability-matrix.md)"
        )
    if machine.target.arch is not None and machine.target.arch != native_arch:
        raise UserError(
            f"{where}.target.arch: {driver} runs {native_arch} Machines on this host, not {machine.target.arch}; "
            f"remove target.arch or set it to {native_arch!r} (vz never substitutes another target)"
        )
    if machine.profile != "developer" and machine.profile not in facts.profiles:
        raise UserError(
            f"{where}.profile: {driver} does not offer the {machine.profile!r} profile (it offers: "
            f"{', '.join(facts.profiles) or 'none'}); choose a driver that does, or use profile 'developer'"
        )


def _check_egress(machine: Machine, facts: DriverFacts, where: str, version: int) -> None:
    driver = f"driver {facts.name!r}"
    ext = facts.extensions
    if machine.egress == "deny" and (ext is None or EgressPolicy.DENY not in ext.egress_policies):
        if version == 2:
            raise UserError(
                f"{where}.egress: {driver} cannot isolate the Machine's network (version 2 egress needs a driver "
                "that enforces 'deny'; docs/network.md)"
            )
        raise UserError(
            f"{where}.egress: {driver} cannot deny outbound traffic (it advertises no 'deny' egress policy); "
            "use egress 'allow' or a driver that enforces 'deny'"
        )


def _check_storage(machine: Machine, facts: DriverFacts, worktree: Path, where: str) -> None:
    """The workspace projection, mounts and volumes the driver supports."""
    driver = f"driver {facts.name!r}"
    caps = facts.info.capabilities
    mount_types = set(caps.mount_types) if caps else set()
    ext = facts.extensions
    projection = machine.workspace.projection
    if projection in ("read-write", "read-only") and MountType.BIND not in mount_types:
        raise UserError(
            f"{where}.workspace.projection: {driver} cannot project the workspace {projection} (it supports no "
            f"bind mounts); set workspace.projection to 'none'" + (" or 'snapshot'" if ext and ext.snapshots else "")
        )
    if projection == "snapshot" and not (ext and ext.snapshots):
        raise UserError(
            f"{where}.workspace.projection: {driver} does not support 'snapshot' workspaces; use 'read-write', "
            "'read-only' or 'none'"
        )
    for index, mount in enumerate(machine.mounts):
        wanted = MountType.BIND if mount.type == "bind" else MountType.TMPFS
        if wanted not in mount_types:
            raise UserError(f"{where}.mounts[{index}]: {driver} does not support {mount.type} mounts; remove it")
        if mount.type == "bind":
            source = bind_source(worktree, mount.source or "")
            if not source.exists():
                raise UserError(f"{where}.mounts[{index}].source: {source} does not exist on this host")
    if machine.volumes and MountType.VOLUME not in mount_types:
        raise UserError(f"{where}.volumes: {driver} does not support named volumes; remove them")


def _check_limits(machine: Machine, facts: DriverFacts, where: str) -> None:
    """The resource limits the driver enforces."""
    driver = f"driver {facts.name!r}"
    ext = facts.extensions
    res = machine.resources
    if (res.cpus is not None or res.memory is not None) and not (ext and ext.resource_limits):
        raise UserError(
            f"{where}.resources: {driver} cannot enforce CPU or memory limits (extensions.resource_limits is "
            "false); remove resources.cpus / resources.memory"
        )
    if res.disk is not None and not (ext and ext.storage_limits):
        raise UserError(
            f"{where}.resources.disk: {driver} cannot enforce a disk size (extensions.storage_limits is false): a "
            'Machine can fill the disk that holds VZ_HOME; remove resources.disk (docs/security.md, "Resource '
            'limits")'
        )
    if res.pids is not None and not (ext and ext.pids_limits):
        raise UserError(
            f"{where}.resources.pids: {driver} does not enforce a pids limit (extensions.pids_limits is false"
            + (
                "; its Machines have their own kernel, so their processes never use the host's PIDs"
                if ext and ext.accelerator not in ("", "none")
                else ""
            )
            + "); remove resources.pids"
        )


def host_architecture() -> str:
    """This host's CPU architecture in Runtime Protocol terms ("amd64" | "arm64")."""
    import platform

    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _host_memory() -> int | None:
    from vz_core.platform.files import physical_memory

    return physical_memory()


def check_host_resources(machine: Machine, where: str) -> None:
    """Resources this host cannot give at all are refused before anything is created or removed."""
    res = machine.resources
    cpus = os.cpu_count()
    if res.cpus is not None and cpus is not None and res.cpus > cpus:
        raise UserError(
            f"{where}.resources.cpus: {res.cpus} CPUs asked for, this host has {cpus}; lower resources.cpus "
            f"(at most {cpus}) or remove it"
        )
    memory = _host_memory()
    if res.memory is not None and memory is not None and res.memory > memory:
        raise UserError(
            f"{where}.resources.memory: {res.memory} bytes asked for, this host has {memory}; lower resources.memory "
            "or remove it"
        )
    if res.pids is not None:
        host_limit = host_task_limit()
        most = max_pids(host_limit)
        if res.pids > most:
            raise UserError(
                f"{where}.resources.pids: {res.pids} asked for, more than half of the {host_limit} tasks this host "
                f"can have (kernel.pid_max, kernel.threads-max); lower resources.pids to at most {most}, or remove it "
                "for the default"
            )


def check_local_image(image: str, where: str) -> None:
    """A local image source (an OCI layout directory, a docker-archive file) must exist before anything changes."""
    if image.startswith("oci:"):
        rest = image[4:]
        if "@" in rest:
            rest = rest.rpartition("@")[0]
        else:
            head, _, last = rest.rpartition("/")
            if ":" in last:
                rest = f"{head}/{last.partition(':')[0]}"
        if not (Path(rest) / "index.json").is_file():
            raise UserError(f"{where}: {rest} is not an OCI image layout directory (no index.json there)")
    elif image.startswith("docker-archive:"):
        archive = image[len("docker-archive:") :].partition(":")[0]
        if not Path(archive).is_file():
            raise UserError(f"{where}: the docker-archive file {archive} does not exist")


def check_shared_workspace(definition: ProjectDefinition, where: str) -> None:
    """Two Machines projecting one worktree read-write must declare how they share it."""
    writers = [m for m in definition.machines if m.workspace.projection == "read-write"]
    if len(writers) > 1:
        undeclared = [m.name for m in writers if m.workspace.sharing != "shared"]
        if undeclared:
            names = ", ".join(m.name for m in writers)
            raise UserError(
                f"{where}: machines {names} all project the worktree read-write, and {', '.join(undeclared)} "
                'declare(s) no consistency contract; set workspace.sharing to "shared" on each (they then write '
                "the same files concurrently, with no locking or ordering between Machines beyond what the files "
                "themselves provide), or make all but one read-only, snapshot or none"
            )


def check_worktree_writers(
    store: Store, definition: ProjectDefinition, env: EnvironmentRecord | None, worktree: str
) -> None:
    """Another Environment's Machine already projects this worktree read-write: without the declared "shared"
    contract on this definition's read-write Machines, a second writer is refused before anything changes."""
    target_tree = env.worktree if env is not None else worktree
    writers = [m for m in definition.machines if m.workspace.projection == "read-write"]
    if not writers or all(m.workspace.sharing == "shared" for m in writers):
        return
    for other in store.environments(definition.project_id):
        if (env is not None and other.env_id == env.env_id) or other.worktree != target_tree:
            continue
        for record in store.machines(other.env_id):
            workspace = record.spec.get("workspace")
            if isinstance(workspace, dict) and workspace.get("projection", "read-write") == "read-write":
                names = ", ".join(m.name for m in writers)
                raise UserError(
                    f"$.machines: machine {record.name} of Environment {other.label()} already projects "
                    f"{target_tree} read-write, and {names} would too with no consistency contract declared; set "
                    'workspace.sharing to "shared" on them (concurrent writers, no ordering or locking between '
                    "Machines), make them read-only, snapshot or none, or delete that Environment first; nothing "
                    "was changed"
                )


def bind_source(worktree: Path, source: str) -> Path:
    path = Path(os.path.expanduser(source))
    return path if path.is_absolute() else (worktree / path).resolve()
