"""The RunImage request `vz up` sends for one Machine: labels, workspace projection, mounts, volumes, host
requirements and the Machine's environment."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from vz_core._types import EgressPolicy, HostRequirements, Mount, MountType, RunImageRequest
from vz_core.env._context import LABEL_ENVIRONMENT, LABEL_MACHINE, LABEL_PROJECT
from vz_core.env._drivers import DriverFacts
from vz_core.env._ids import workspace_id
from vz_core.env._store import EnvironmentRecord
from vz_core.env._up_checks import bind_source

if TYPE_CHECKING:
    from vz_core.env._definition import Machine

__all__ = ["run_request", "volume_name"]


def volume_name(env_id: str, machine_id: str, volume: str) -> str:
    return f"vz-{env_id}-{machine_id}-{volume}"


def run_request(
    *,
    project_id: str,
    env: EnvironmentRecord,
    machine_id: str,
    machine: Machine,
    facts: DriverFacts,
    native_arch: str,
    environment: Mapping[str, str],
    allow_recreate: bool = False,
    network: str | None = None,
) -> RunImageRequest:
    labels = [
        f"{LABEL_PROJECT}={project_id}",
        f"{LABEL_ENVIRONMENT}={env.env_id}",
        f"{LABEL_MACHINE}={machine_id}",
    ]
    if machine.profile in facts.profiles:
        labels.append(f"vz.profile={machine.profile}")
    ext = facts.extensions
    if ext is not None and EgressPolicy[machine.egress.upper()] in ext.egress_policies:
        labels.append(f"vz.egress={machine.egress}")
    if network is not None:
        labels.append(f"vz.network={network}")
    if machine.resources.pids is not None:
        labels.append(f"vz.pids={machine.resources.pids}")
    worktree = Path(env.worktree)
    workspace_mount = None
    projection = machine.workspace.projection
    if projection != "none":
        workspace_mount = Mount(
            MountType.BIND, str(worktree), machine.workspace.target, read_only=projection == "read-only"
        )
        if projection == "snapshot":
            labels.append("vz.workspace=snapshot")
    mounts: list[Mount] = []
    for mount in machine.mounts:
        if mount.type == "bind":
            mounts.append(
                Mount(MountType.BIND, str(bind_source(worktree, mount.source or "")), mount.target, mount.read_only)
            )
        else:
            mounts.append(Mount(MountType.TMPFS, "", mount.target, mount.read_only))
    for volume in machine.volumes:
        name = volume_name(env.env_id, machine_id, volume.name)
        mounts.append(Mount(MountType.VOLUME, name, volume.target, volume.read_only))
    res = machine.resources
    requirements = (
        HostRequirements(cpus=res.cpus or 0, memory_bytes=res.memory or 0, storage_bytes=res.disk or 0)
        if res.requested()
        else None
    )
    env_vars = dict(environment)
    env_vars.update({"VZ_PROJECT_ID": project_id, "VZ_ENVIRONMENT_ID": env.env_id, "VZ_MACHINE_ID": machine_id})
    return RunImageRequest(
        workspace_id=workspace_id(project_id, env.env_id, machine_id),
        image=machine.image,
        environment=env_vars,
        labels=tuple(labels),
        workspace_mount=workspace_mount,
        mounts=tuple(mounts),
        platform=f"{machine.target.os}/{machine.target.arch or native_arch}",
        host_requirements=requirements,
        user=machine.user or "",
        remote_user=machine.remote_user or "",
        allow_recreate=allow_recreate,
    )
