"""Adapters known to the suite by driver name, and loading a driver author's own adapter.

The suite depends on the drivers, never the reverse: a driver's declaration names its adapter by string
(``DriverDeclaration.adapter``, e.g. ``"vz_conformance.adapters.linux_native:ADAPTER"``) and only the suite
imports it. For a registered driver the suite uses, in order: the adapter its declaration names; else the
``ADAPTER`` of an ``adapter`` module beside the driver's factory (``acme:AcmeDriver`` → ``acme.adapter:ADAPTER``,
for drivers whose declaration predates the ``adapter`` field); else the POSIX defaults of ``Adapter``. Authors
can always pass their own with ``--adapter module:attribute`` (CLI) or the ``pytest_vz_adapter`` hook (pytest
plugin). The built-in drivers' adapters live here: ``linux_native``, ``qemu`` and ``FakeAdapter``.
"""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

from vz_conformance import Adapter
from vz_core.registry import DriverRegistry

__all__ = ["Adapter", "FakeAdapter", "adapter_for", "load_adapter"]


class FakeAdapter(Adapter):
    """The reference fake driver: Machines are directories and commands run as host processes whose working
    directory and ``$VZ_MACHINE_ROOT`` are the Machine's root directory."""

    local_dir = '"$VZ_MACHINE_ROOT"'
    processes_visible_on_host = True

    def driver_options(self, state_dir: Path) -> dict[str, object]:
        return {"state_dir": state_dir}

    def plugin_args(self, state_dir: Path) -> list[str]:
        return ["--state-dir", str(state_dir)]


def adapter_for(driver_name: str, *, registry: DriverRegistry | None = None) -> Adapter:
    """The adapter the suite knows for ``driver_name`` (a fresh copy: callers may change it), else the POSIX
    defaults."""
    registry = registry if registry is not None else DriverRegistry()
    if driver_name not in registry.names():
        return Adapter()
    declaration = registry.get(driver_name)
    if declaration.adapter:
        return copy.copy(load_adapter(declaration.adapter))
    package = declaration.factory.partition(":")[0]
    target = f"{package}.adapter"
    try:
        module = importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name in (target, package):
            return Adapter()
        raise
    adapter = getattr(module, "ADAPTER", None)
    if not isinstance(adapter, Adapter):
        raise TypeError(f"{target}.ADAPTER must be a vz_conformance.Adapter, not {type(adapter).__name__}")
    return copy.copy(adapter)


def load_adapter(spec: str) -> Adapter:
    """Load ``module:attribute``: an Adapter instance, an Adapter subclass, or a callable returning one."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"adapter {spec!r} must look like 'module:attribute'")
    target = getattr(importlib.import_module(module_name), attr)
    adapter = target
    if callable(target) and not isinstance(target, Adapter):
        try:
            adapter = target()
        except TypeError as exc:
            raise TypeError(
                f"adapter {spec!r} could not be called without arguments ({exc}); give an Adapter instance, "
                "an Adapter subclass or a callable without arguments"
            ) from None
    if not isinstance(adapter, Adapter):
        raise TypeError(f"adapter {spec!r} is a {type(adapter).__name__}, not a vz_conformance.Adapter")
    return adapter
