"""The lazy facade of a package: names loaded from its modules on first use (PEP 562), so importing the package
stays cheap (``vz exec`` pays only for what it touches; this module imports nothing itself, not even
``typing``)."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``where`` maps each public name to the module that defines it,
    a module of the package (``"_up"``), a module elsewhere by its full name (``"vz_core.wire"``), or ``""``:
    the name is a module of the package itself. A value is imported on first use and kept in the package, so
    the next use is a plain attribute."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        full = f"{package}.{name}" if module == "" else module if "." in module else f"{package}.{module}"
        __import__(full)
        value = sys.modules[full] if module == "" else getattr(sys.modules[full], name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
