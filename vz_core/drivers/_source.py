"""Where drivers come from: ``open_driver`` builds one for a Machine (built-ins in-process, external ones
out-of-process); a ``DriverSource`` (the vz daemon's session pool) answers instead when a command's context
carries one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from vz_core._driver import Driver
from vz_core.drivers._launch import remote_driver, resolve
from vz_core.drivers._manifests import ManifestStore
from vz_core.drivers._options import HostConfig, effective_options
from vz_core.errors import UserError
from vz_core.registry import DriverRegistry

if TYPE_CHECKING:
    from vz_core.redact import Redactor

__all__ = ["DriverSource", "open_driver"]


def open_driver(
    name: str,
    project_options: Mapping[str, Any] | None = None,
    *,
    where: str = "driver_options",
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    host_config: HostConfig | None = None,
    redactor: Redactor | None = None,
    recorded: bool = False,
) -> Driver:
    """Driver ``name`` ready to use, for a Machine whose vz.json gave ``project_options``.

    Built-in drivers are built in-process with ``effective_options``; external ones are served out-of-process
    (their binary verified at each launch). ``UserError`` for a bad name or option (nothing is built),
    ``NotFoundError`` for an unknown driver. ``redactor`` masks secrets in what an out-of-process driver says.
    ``recorded=True``: ``project_options`` are those stored with an existing Machine (see
    ``validate_project_options``).
    The caller closes the driver.
    """
    registry = registry if registry is not None else DriverRegistry()
    options = effective_options(
        name, project_options, where=where, registry=registry, store=store, host_config=host_config, recorded=recorded
    )
    resolved = resolve(name, registry=registry, store=store)
    if resolved.builtin is None:
        return remote_driver(name, redactor=redactor, registry=registry, store=store)
    try:
        return resolved.builtin.create(**options)
    except TypeError as exc:
        raise UserError(f"driver {name!r} rejected its options {sorted(options)}: {exc}") from None


class DriverSource(Protocol):
    """Where ``vz_core.env.acquire_driver`` gets drivers from when a command's ``Context.drivers`` names one: the
    vz daemon's ``SessionPool`` (shared, supervised plugin sessions; the handles' ``close`` keeps them)."""

    def driver(
        self,
        name: str,
        project_options: Mapping[str, Any] | None,
        *,
        where: str,
        recorded: bool,
        redactor: Redactor | None,
    ) -> Driver: ...
