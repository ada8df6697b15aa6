"""What a built-in driver package exposes without importing its driver code (importing a package stays cheap)."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, module: str, names: tuple[str, ...]
) -> tuple[Callable[[str], Any], Callable[..., Awaitable[None]]]:
    """A module ``__getattr__`` loading ``names`` from ``module`` on first use, and the package's ``cleanup_state``.

    ``cleanup_state(state_dir, **options)`` builds the driver (the first of ``names``) on ``state_dir`` and removes
    every Machine, volume and host resource recorded there (tests, uninstall).
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(module), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    async def cleanup_state(state_dir: str, **options: Any) -> None:
        driver = getattr(importlib.import_module(module), names[0])(state_dir=state_dir, **options)
        await driver.remove_everything()

    return __getattr__, cleanup_state
