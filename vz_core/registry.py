"""The built-in driver registry: stable names, lazily loaded, through pluggy.

Every built-in driver package registers through the same hook a third-party Python package would use: an
entry point in the ``vz.drivers`` group naming a module with a ``vz_builtin_drivers`` hook implementation::

    from vz_core.registry import BuiltinDriver, hookimpl

    @hookimpl
    def vz_builtin_drivers() -> list[BuiltinDriver]:
        return [BuiltinDriver(name="fake", summary="...", factory="vz_conformance.fake:FakeDriver",
                              plugin_command=("vz-driver-fake",))]

Registration modules must be cheap to import: the driver code itself is only imported when ``load()`` runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy

from vz_core._driver import Driver
from vz_core.errors import NotFoundError, UserError

__all__ = ["BuiltinDriver", "DriverRegistry", "hookimpl", "hookspec"]

PROJECT = "vz"
ENTRY_POINT_GROUP = "vz.drivers"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True)
class BuiltinDriver:
    """A driver shipped as Python code: how to build it in-process and how to launch it as a plugin.

    ``factory`` is "module:attribute", a callable taking keyword options and returning a ``Driver``.
    ``plugin_command`` is the console script (plus arguments) that serves the same driver as a plugin.
    """

    name: str
    summary: str
    factory: str
    plugin_command: tuple[str, ...] = ()
    targets: tuple[str, ...] = ("linux",)
    options: dict[str, str] = field(default_factory=dict)

    def load(self) -> Callable[..., Driver]:
        """Import and return the factory (the only place driver code gets imported)."""
        module_name, _, attr = self.factory.partition(":")
        if not attr:
            raise UserError(f"driver {self.name!r}: factory {self.factory!r} must look like 'module:attribute'")
        module = importlib.import_module(module_name)
        factory: Callable[..., Driver] = getattr(module, attr)
        return factory

    def create(self, **options: Any) -> Driver:
        """Build the driver in-process."""
        return self.load()(**options)


class _Specs:
    @hookspec
    def vz_builtin_drivers(self) -> Sequence[BuiltinDriver]:  # type: ignore[empty-body]
        """Return the built-in drivers a package provides."""


class DriverRegistry:
    """Name → BuiltinDriver, loaded from ``vz.drivers`` entry points (and any module registered by hand)."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self._pm = pluggy.PluginManager(PROJECT)
        self._pm.add_hookspecs(_Specs)
        if load_entry_points:
            self._pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        self._cache: dict[str, BuiltinDriver] | None = None

    def register(self, plugin: object, name: str | None = None) -> None:
        """Register a module or object implementing ``vz_builtin_drivers`` (tests, embedding)."""
        self._pm.register(plugin, name)
        self._cache = None

    def _all(self) -> dict[str, BuiltinDriver]:
        if self._cache is None:
            found: dict[str, BuiltinDriver] = {}
            for batch in self._pm.hook.vz_builtin_drivers():
                for spec in batch:
                    if spec.name in found and found[spec.name] != spec:
                        raise UserError(
                            f"driver name {spec.name!r} is registered twice "
                            f"({found[spec.name].factory} and {spec.factory}); a name must resolve to one driver"
                        )
                    found[spec.name] = spec
            self._cache = found
        return self._cache

    def names(self) -> list[str]:
        return sorted(self._all())

    def get(self, name: str) -> BuiltinDriver:
        """The driver registered as ``name``; an unknown name lists what is installed."""
        drivers = self._all()
        try:
            return drivers[name]
        except KeyError:
            installed = ", ".join(sorted(drivers)) or "none"
            raise NotFoundError(
                f"unknown driver {name!r}; installed built-in drivers: {installed} "
                "(external drivers are added with `vz driver add <manifest>`)"
            ) from None
