"""Named volumes vz recorded: removing them through their driver, and the kept ones (`vz volume list / rm`).

A volume belongs to one Machine of one Environment (``vz-<env_id>-<machine_id>-<name>`` in its driver) and
outlives recreation. `vz delete` removes it with its Environment unless asked to keep it (``--keep-volumes``);
a kept volume, or one its driver could not remove, stays recorded (state ``kept``) and is removed by
`vz volume rm NAME`. `vz volume list` lists every recorded volume: those in use (``attached``) and the kept.
The data itself lives in the driver: vz removes it through
the driver's volume-removal operation (``Driver.delete_volume``), and a driver without one is named in the
answer, never silently skipped.
"""

from __future__ import annotations

from typing import Any

from vz_core.env._context import Context, open_store
from vz_core.env._drivers import DriverPool
from vz_core.env._errors import SelectionNotFoundError
from vz_core.env._store import VolumeRecord
from vz_core.errors import NotFoundError, UnsupportedError

__all__ = ["list_volumes", "remove_recorded_volume", "remove_volume"]


async def remove_recorded_volume(pool: DriverPool, volume: VolumeRecord) -> None:
    """Remove a volume's data through its driver; raises UnsupportedError naming a driver that cannot."""
    driver, _ = await pool.get(volume.driver, volume.driver_options, recorded=True)
    remove = getattr(driver, "delete_volume", None)
    if remove is None:
        raise UnsupportedError(
            f"driver {volume.driver!r} has no volume-removal operation, so volume {volume.backend_name} stays in "
            "its state directory; it stays listed by `vz volume list`"
        )
    try:
        await remove(volume.backend_name)
    except NotFoundError:
        pass  # already gone: removal is idempotent


def _row(volume: VolumeRecord) -> dict[str, Any]:
    return {
        "name": volume.backend_name,
        "volume": volume.name,
        "project_id": volume.project_id,
        "environment_id": volume.env_id,
        "machine_id": volume.machine_id,
        "driver": volume.driver,
        "state": volume.state,
        "created_at": volume.created_at,
    }


async def list_volumes(ctx: Context) -> dict[str, Any]:
    """Every recorded volume (all projects), in use (``attached``) or kept: ``{"volumes": [...]}``."""
    with open_store(ctx) as store:
        return {"volumes": [_row(v) for v in store.all_volumes()]}


async def remove_volume(ctx: Context, name: str) -> dict[str, Any]:
    """Remove one kept volume (its data through its driver, then its record)."""
    pool = DriverPool(ctx.redactor, ctx.drivers)
    store = open_store(ctx)
    try:
        volume = store.volume(name)
        if volume is not None and volume.state != "kept":
            raise SelectionNotFoundError(
                f"volume {name!r} is in use by Machine {volume.machine_id} of Environment {volume.env_id}, not kept; "
                "`vz delete` removes it with its Environment (`vz volume rm` removes only kept volumes)"
            )
        if volume is None:
            kept = ", ".join(v.backend_name for v in store.kept_volumes()) or "none"
            raise SelectionNotFoundError(f"no kept volume named {name!r}; kept volumes: {kept}")
        await remove_recorded_volume(pool, volume)
        with store.transaction() as db:
            store.forget_volume(db, volume.backend_name)
        return {"volumes": [{**_row(volume), "state": "removed"}]}
    finally:
        store.close()
        await pool.aclose()
