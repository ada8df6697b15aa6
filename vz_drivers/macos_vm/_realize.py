"""Turning a ``VmPlan`` into Virtualization.framework objects (macOS only; imported lazily).

``Realizer`` walks the plan's tree: ``cls.alloc().<init>(*args)`` then ``set<Prop>_(value)``, with ``Url``
leaves as ``NSURL.fileURLWithPath_`` and ``Data`` leaves as ``NSData.dataWithContentsOfFile_``. The
framework and Foundation modules are parameters: on a Mac they are PyObjC's ``Virtualization`` and
``Foundation``; the tests of this host hand in a small object model of their own.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from vz_core.errors import InvalidArgumentError, UnavailableError
from vz_drivers.macos_vm._host import BINDINGS
from vz_drivers.macos_vm._plan import Data, Limits, Obj, Url, Value, VmPlan

__all__ = ["Frameworks", "Realizer", "framework_limits", "load_frameworks"]


@dataclass(frozen=True)
class Frameworks:
    vz: Any
    """``Virtualization``"""
    foundation: Any
    """``Foundation``"""


def load_frameworks() -> Frameworks:
    """PyObjC's Virtualization and Foundation modules; ``UnavailableError`` when they are not installed."""
    try:
        return Frameworks(importlib.import_module("Virtualization"), importlib.import_module("Foundation"))
    except ImportError as exc:
        raise UnavailableError(f"{BINDINGS} cannot be imported ({exc}); install it with pip on the Mac") from None


def _error_text(error: Any) -> str:
    if error is None:
        return "unknown error"
    describe = getattr(error, "localizedDescription", None)
    return str(describe()) if callable(describe) else str(error)


def framework_limits(fw: Frameworks, *, base_min_cpus: int = 1, base_min_memory: int = 0) -> Limits:
    """The CPU and memory range ``VZVirtualMachineConfiguration`` allows on this host."""
    cfg = fw.vz.VZVirtualMachineConfiguration
    return Limits(
        min_cpus=int(cfg.minimumAllowedCPUCount()),
        max_cpus=int(cfg.maximumAllowedCPUCount()),
        min_memory=int(cfg.minimumAllowedMemorySize()),
        max_memory=int(cfg.maximumAllowedMemorySize()),
        base_min_cpus=base_min_cpus,
        base_min_memory=base_min_memory,
    )


class Realizer:
    """Builds framework objects from plan nodes."""

    def __init__(self, fw: Frameworks) -> None:
        self._fw = fw

    def value(self, value: Value) -> Any:
        if isinstance(value, Obj):
            return self.obj(value)
        if isinstance(value, Url):
            return self._fw.foundation.NSURL.fileURLWithPath_(value.path)
        if isinstance(value, Data):
            data = self._fw.foundation.NSData.dataWithContentsOfFile_(value.path)
            if data is None:
                raise UnavailableError(f"{value.path} cannot be read (a Machine file is missing)")
            return data
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value

    def obj(self, node: Obj) -> Any:
        cls = getattr(self._fw.vz, node.cls, None)
        if cls is None:
            raise UnavailableError(f"Virtualization.framework on this host has no {node.cls} (macOS too old?)")
        args = [self.value(a) for a in node.args]
        made = getattr(cls.alloc(), node.init)(*args)
        if node.init.endswith("error_"):
            made, error = made
            if made is None:
                raise InvalidArgumentError(f"{node.cls} {node.init}: {_error_text(error)}")
        if made is None:
            raise InvalidArgumentError(f"{node.cls} {node.init} refused its arguments")
        for name, value in node.props:
            getattr(made, "set" + name[0].upper() + name[1:] + "_")(self.value(value))
        return made

    def configuration(self, plan: VmPlan, *, save_restore: bool = False) -> Any:
        """The validated ``VZVirtualMachineConfiguration``; ``save_restore``: also check that its state can be
        saved and restored (only on hosts where the plan says the framework can)."""
        config = self.obj(plan.configuration)
        ok, error = config.validateWithError_(None)
        if not ok:
            raise InvalidArgumentError(f"Virtualization.framework rejected the configuration: {_error_text(error)}")
        if save_restore and plan.save_restore:
            ok, error = config.validateSaveRestoreSupportWithError_(None)
            if not ok:
                raise InvalidArgumentError(f"this configuration cannot save/restore state: {_error_text(error)}")
        return config
