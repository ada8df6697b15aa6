"""`vz stop` and `vz delete`: walk the selected Environment's recorded Machines through their drivers.

Both take the Environment lock, explain interrupted operations, write an operation record first and finish it
(a failure is stored masked), and touch only Machines recorded under the selected env_id.
"""

from __future__ import annotations

from typing import Any

from vz_core.env._context import (
    Context,
    converge_stale,
    delete_owned,
    fail_operation,
    learn_definition_secrets,
    learn_recorded_secrets,
    lock_environment,
    open_store,
    resolve_project,
    select_existing,
)
from vz_core.env._drivers import DriverPool
from vz_core.env._locks import FileLock, env_lock_path
from vz_core.env._store import EnvironmentRecord, MachineRecord, Store, VolumeRecord
from vz_core.env._volumes import remove_recorded_volume
from vz_core.errors import NotFoundError, UnsupportedError

__all__ = ["delete", "stop"]


async def _delete_volume(
    ctx: Context,
    store: Store,
    pool: DriverPool,
    env: EnvironmentRecord,
    op_id: str,
    volume: VolumeRecord,
    keep: bool,
) -> dict[str, Any]:
    row: dict[str, Any] = {"name": volume.backend_name, "volume": volume.name, "machine_id": volume.machine_id}
    row["driver"] = volume.driver
    if keep or volume.state == "kept":
        with store.transaction() as db:
            store.keep_volume(db, volume.backend_name)
        return {**row, "state": "kept", "reason": "--keep-volumes" if keep else "kept earlier"}
    with store.transaction() as db:
        store.operation_step(db, op_id, f"delete volume {volume.backend_name}")
    fields = {"environment": env.name, "environment_id": env.env_id, "volume": volume.backend_name}
    try:
        with ctx.progress.step("delete-volume", f"deleting volume {volume.name} ({volume.backend_name})", **fields):
            await remove_recorded_volume(pool, volume)
    except UnsupportedError as exc:
        with store.transaction() as db:
            store.keep_volume(db, volume.backend_name)
        ctx.progress.note("volume-kept", f"volume {volume.backend_name} kept: {exc.message}", **fields)
        return {**row, "state": "kept", "reason": exc.message}
    with store.transaction() as db:
        store.forget_volume(db, volume.backend_name)
    return {**row, "state": "removed"}


async def _remove_route_domain(ctx: Context, env: EnvironmentRecord) -> None:
    """After its Machines are gone: the Environment's route domain (links, nft table, namespace), nothing of
    another. `vz stop` keeps it (the next `vz up` re-attaches the Machines). Realized by the process running the
    command (the daemon) until the daemon owns route domains (docs/network.md)."""
    from vz_core.network import domain_exists, domain_for, remove_domain
    from vz_core.network.label import remove_slices

    remove_slices(env.env_id)  # the Machines' recorded slices (vz up re-attaching changed Machines) go with it
    if not domain_exists(env.env_id):
        return
    fields = {"environment": env.name, "environment_id": env.env_id, "route_domain": domain_for(env.env_id)}
    with ctx.progress.step("network", f"removing route domain {domain_for(env.env_id)}", **fields):
        await remove_domain(env.env_id)


async def stop(ctx: Context, *, environment: str | None = None) -> dict[str, Any]:
    """Stop every Machine of the selected Environment (idempotent); Machine-local data survives."""
    return await _mutate(ctx, environment, "stop")


async def delete(ctx: Context, *, environment: str | None = None, keep_volumes: bool = False) -> dict[str, Any]:
    """Delete the selected Environment and everything it owns: its Machines (through their drivers, each checked
    against the ownership label the driver reports), its named volumes (through their drivers, unless
    ``keep_volumes``: then they stay recorded as kept, listed by `vz volume list`), its worktree bindings, its
    lock file and its operation records. The result says what was removed and what was kept.

    Only the selected Environment's graph is traversed: what is recorded under its env_id.
    """
    return await _mutate(ctx, environment, "delete", keep_volumes=keep_volumes)


async def _mutate(ctx: Context, environment: str | None, kind: str, *, keep_volumes: bool = False) -> dict[str, Any]:
    project = resolve_project(ctx, environment)
    assert project is not None
    pool = DriverPool(ctx.redactor, ctx.drivers)
    store = open_store(ctx)
    lock: FileLock | None = None
    try:
        env = select_existing(ctx, store, project, environment)
        lock = await lock_environment(ctx, store, env, kind)
        env = store.environment(env.env_id) or env
        converge_stale(ctx, store, env, lock)
        machines = store.machines(env.env_id)
        # Before any driver call: a driver error quoting any of this Environment's secrets is masked.
        learn_definition_secrets(ctx, project.header.path if project.header else None)
        learn_recorded_secrets(ctx, machines)
        with store.transaction() as db:
            op_id = store.begin_operation(db, env_id=env.env_id, project_id=env.project_id, kind=kind)
            if kind == "delete":
                store.set_environment(db, env.env_id, state="deleting")
        results: list[dict[str, Any]] = []
        volumes: list[dict[str, Any]] = []
        volume_records = store.volumes(env.env_id) if kind == "delete" else []
        bindings = store.bindings_of(env.env_id)
        try:
            for record in machines:
                with store.transaction() as db:
                    store.operation_step(db, op_id, f"{kind} {record.name}")
                state = await _mutate_machine(ctx, store, pool, env, record, kind)
                results.append({"id": record.machine_id, "name": record.name, "state": state})
            for volume in volume_records:
                volumes.append(await _delete_volume(ctx, store, pool, env, op_id, volume, keep_volumes))
            if kind == "delete":
                await _remove_route_domain(ctx, env)
            with store.transaction() as db:
                if kind == "delete":
                    store.delete_environment(db, env.env_id)
                else:
                    store.set_environment(db, env.env_id, state="stopped")
                store.finish_operation(db, op_id, "succeeded")
        except BaseException as exc:
            fail_operation(store, env, op_id, exc, ctx.redactor)
            raise
        result: dict[str, Any] = {
            "project_id": env.project_id,
            "environment": {"id": env.env_id, "name": env.name, "state": "deleted" if kind == "delete" else "stopped"},
            "machines": results,
            "operation_id": op_id,
        }
        if kind == "delete":
            with store.transaction() as db:  # the Environment is gone: so is its history
                operations = store.delete_operations(db, env.env_id)
            try:
                env_lock_path(env.env_id).unlink()
            except OSError:
                pass
            result.update(volumes=volumes, bindings=bindings, operations_removed=operations)
        return ctx.redactor.redact_data(result)
    finally:
        if lock is not None:
            lock.release()
        store.close()
        await pool.aclose()


async def _mutate_machine(
    ctx: Context, store: Store, pool: DriverPool, env: EnvironmentRecord, record: MachineRecord, kind: str
) -> str:
    """Stop or delete one recorded Machine; the state it is left in."""
    fields = {
        "environment": env.name,
        "environment_id": env.env_id,
        "machine": record.name,
        "machine_id": record.machine_id,
    }
    driver, _ = await pool.get(record.driver, record.driver_options, recorded=True)
    verb = "stopping" if kind == "stop" else "deleting"
    with ctx.progress.step(kind, f"{verb} machine {record.name}", **fields):
        if kind == "stop":
            try:
                await driver.stop(record.workspace_id)
                state = "stopped"
            except NotFoundError:
                state = "missing"
                ctx.progress.note("missing", f"machine {record.name} no longer exists in its driver", **fields)
            with store.transaction() as db:
                store.set_machine_state(db, env.env_id, record.machine_id, state)
        else:
            await delete_owned(driver, record, env)
            state = "deleted"
            with store.transaction() as db:
                store.delete_machine(db, env.env_id, record.machine_id, with_volumes=False)
    return state
