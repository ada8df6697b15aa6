"""The driver registry proper: pluggy hooks from ``vz.drivers`` entry points, each declaration validated
(``vz_core._declaration``). Public through ``vz_core.registry`` (``DriverRegistry``), which imports this module
only when a registry is needed (never in a plugin process before its handshake).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vz_core._declaration import (
    ENTRY_POINT_GROUP,
    PROJECT,
    DriverDeclaration,
    RegistrationError,
    declaration_problems,
)
from vz_core.errors import NotFoundError

if TYPE_CHECKING:
    import pluggy

__all__ = ["DriverRegistry", "declaration_problems"]


def _spec_class() -> type:
    import pluggy

    hookspec = pluggy.HookspecMarker(PROJECT)

    class _Specs:
        @hookspec
        def vz_builtin_drivers(self) -> Sequence[DriverDeclaration]:  # type: ignore[empty-body]
            """Return the drivers a package declares."""

    return _Specs


def _manager() -> pluggy.PluginManager:
    import pluggy

    class _Manager(pluggy.PluginManager):
        def parse_hookimpl_opts(self, plugin: Any, name: str) -> pluggy.HookimplOpts | None:
            method = getattr(plugin, name, None)
            if callable(method) and getattr(method, "_vz_hookimpl", False) is True:
                return {
                    "wrapper": False,
                    "hookwrapper": False,
                    "optionalhook": False,
                    "tryfirst": False,
                    "trylast": False,
                    "specname": None,
                }
            return super().parse_hookimpl_opts(plugin, name)

    pm = _Manager(PROJECT)
    pm.add_hookspecs(_spec_class())
    return pm


def _describe_plugin(plugin: object, name: str | None) -> str:
    module = getattr(plugin, "__name__", None) or type(plugin).__module__ + "." + type(plugin).__qualname__
    return f"plugin {name!r} ({module})" if name and name != module else f"plugin {module}"


class DriverRegistry:
    """Name → DriverDeclaration, loaded from ``vz.drivers`` entry points (and any module registered by hand).

    Construction imports every registration module (cheap by contract) and validates its hooks; the
    declarations are collected and validated on first use. Errors are ``RegistrationError`` naming the plugin.
    """

    def __init__(self, *, load_entry_points: bool = True, distribution: str | None = None) -> None:
        """``distribution`` limits the entry points to one installed distribution (``"vz"``: the drivers shipped
        with vz, e.g. for generating its docs)."""
        self._pm = _manager()
        self._labels: dict[int, str] = {}
        self._cache: dict[str, tuple[DriverDeclaration, str]] | None = None
        self._modules: dict[str, str] = {}
        if load_entry_points:
            self._load_entry_points(distribution)

    def _load_entry_points(self, distribution: str | None) -> None:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if distribution is not None and (ep.dist is None or ep.dist.name != distribution):
                continue
            if self._pm.get_plugin(ep.name) is not None or self._pm.is_blocked(ep.name):
                continue
            label = f"plugin {ep.name!r} (entry point {ep.value} in group {ENTRY_POINT_GROUP})"
            try:
                plugin = ep.load()
            except Exception as exc:
                raise RegistrationError(f"{label} failed to import: {type(exc).__name__}: {exc}") from exc
            self._register(plugin, ep.name, label)

    def register(self, plugin: object, name: str | None = None) -> None:
        """Register a module or object implementing ``vz_builtin_drivers`` (tests, embedding)."""
        self._register(plugin, name, _describe_plugin(plugin, name))

    def _register(self, plugin: object, name: str | None, label: str) -> None:
        import pluggy

        try:
            self._pm.register(plugin, name)
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            if self._pm.is_registered(plugin):
                self._pm.unregister(plugin)
            message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise RegistrationError(f"{label}: {message}") from None
        except ValueError as exc:  # the same name or object registered twice
            raise RegistrationError(f"{label}: {exc}") from None
        if not self._pm.get_hookcallers(plugin):
            self._pm.unregister(plugin)
            raise RegistrationError(
                f"{label} implements no hook: it needs a function `vz_builtin_drivers` marked with "
                "@vz_core.registry.hookimpl (a misspelt or unmarked name registers nothing)"
            )
        self._labels[id(plugin)] = label
        self._cache = None

    def _all(self) -> dict[str, tuple[DriverDeclaration, str]]:
        if self._cache is None:
            found: dict[str, tuple[DriverDeclaration, str]] = {}
            for impl in self._pm.hook.vz_builtin_drivers.get_hookimpls():
                label = self._labels.get(id(impl.plugin), _describe_plugin(impl.plugin, impl.plugin_name))
                try:
                    batch = impl.function()
                except Exception as exc:
                    failure = f"{type(exc).__name__}: {exc}"
                    raise RegistrationError(f"{label}: vz_builtin_drivers() failed: {failure}") from exc
                if isinstance(batch, DriverDeclaration) or not isinstance(batch, Sequence):
                    raise RegistrationError(
                        f"{label}: vz_builtin_drivers() must return a list of DriverDeclaration, "
                        f"not {type(batch).__name__}"
                    )
                for i, spec in enumerate(batch):
                    if not isinstance(spec, DriverDeclaration):
                        raise RegistrationError(
                            f"{label}: vz_builtin_drivers()[{i}] is a {type(spec).__name__}, not a DriverDeclaration"
                        )
                    problems = spec.problems()
                    if problems:
                        raise RegistrationError(
                            f"{label}: the declaration of driver {spec.name!r} is invalid: {'; '.join(problems)}"
                        )
                    if spec.name in found and found[spec.name][0] != spec:
                        raise RegistrationError(
                            f"driver name {spec.name!r} is registered twice ({found[spec.name][1]}: "
                            f"{found[spec.name][0].factory}; {label}: {spec.factory}); a name must resolve to one "
                            "driver"
                        )
                    found[spec.name] = (spec, label)
                    if isinstance(impl.plugin, types.ModuleType):
                        self._modules[spec.name] = impl.plugin.__name__
            self._cache = found
        return self._cache

    def names(self) -> list[str]:
        return sorted(self._all())

    def declarations(self) -> list[DriverDeclaration]:
        """Every registered declaration, by name."""
        drivers = self._all()
        return [drivers[name][0] for name in sorted(drivers)]

    def module_of(self, name: str) -> str | None:
        """The registration module that declared driver ``name`` (``None`` for a non-module plugin)."""
        self.get(name)
        return self._modules.get(name)

    def registered_by(self, name: str) -> str:
        """Which plugin declared driver ``name`` (for messages)."""
        self.get(name)
        return self._all()[name][1]

    def get(self, name: str) -> DriverDeclaration:
        """The driver registered as ``name``; an unknown name lists what is installed."""
        drivers = self._all()
        try:
            return drivers[name][0]
        except KeyError:
            installed = ", ".join(sorted(drivers)) or "none"
            raise NotFoundError(
                f"unknown driver {name!r}; installed built-in drivers: {installed} "
                "(external drivers are added with `vz driver add <manifest>`)"
            ) from None
