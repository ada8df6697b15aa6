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
from vz_core.errors import NotFoundError

__all__ = ["delete", "stop"]


async def stop(ctx: Context, *, environment: str | None = None) -> dict[str, Any]:
    """Stop every Machine of the selected Environment (idempotent); Machine-local data survives."""
    return await _mutate(ctx, environment, "stop")


async def delete(ctx: Context, *, environment: str | None = None) -> dict[str, Any]:
    """Delete the selected Environment: its Machines (through their drivers), then its records.

    Only the selected Environment's graph is traversed: Machines recorded under its env_id, each checked
    against the ownership label the driver reports before it is deleted.
    """
    return await _mutate(ctx, environment, "delete")


async def _mutate(ctx: Context, environment: str | None, kind: str) -> dict[str, Any]:
    project = resolve_project(ctx, environment)
    assert project is not None
    pool = DriverPool(ctx.redactor)
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
        try:
            for record in machines:
                fields = {
                    "environment": env.name,
                    "environment_id": env.env_id,
                    "machine": record.name,
                    "machine_id": record.machine_id,
                }
                with store.transaction() as db:
                    store.operation_step(db, op_id, f"{kind} {record.name}")
                driver, _ = await pool.get(record.driver, record.driver_options, recorded=True)
                verb = "stopping" if kind == "stop" else "deleting"
                with ctx.progress.step(kind, f"{verb} machine {record.name}", **fields):
                    if kind == "stop":
                        try:
                            await driver.stop(record.workspace_id)
                            state = "stopped"
                        except NotFoundError:
                            state = "missing"
                            ctx.progress.note(
                                "missing", f"machine {record.name} no longer exists in its driver", **fields
                            )
                        with store.transaction() as db:
                            store.set_machine_state(db, env.env_id, record.machine_id, state)
                    else:
                        await delete_owned(driver, record, env)
                        state = "deleted"
                        with store.transaction() as db:
                            store.delete_machine(db, env.env_id, record.machine_id)
                results.append({"id": record.machine_id, "name": record.name, "state": state})
            with store.transaction() as db:
                if kind == "delete":
                    store.delete_environment(db, env.env_id)
                else:
                    store.set_environment(db, env.env_id, state="stopped")
                store.finish_operation(db, op_id, "succeeded")
        except BaseException as exc:
            fail_operation(store, env, op_id, exc, ctx.redactor)
            raise
        if kind == "delete":
            try:
                env_lock_path(env.env_id).unlink()
            except OSError:
                pass
        result = {
            "project_id": env.project_id,
            "environment": {"id": env.env_id, "name": env.name, "state": "deleted" if kind == "delete" else "stopped"},
            "machines": results,
            "operation_id": op_id,
        }
        return ctx.redactor.redact_data(result)
    finally:
        if lock is not None:
            lock.release()
        store.close()
        await pool.aclose()
