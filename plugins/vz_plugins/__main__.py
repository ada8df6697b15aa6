"""``python -m vz_plugins MODULE:FACTORY``: serve the driver built by ``FACTORY(**options)`` as a plugin.

Options come from the ``VZ_DRIVER_OPTIONS`` environment variable (a JSON object), when set. The host launches
built-in drivers this way, with its own interpreter.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

from vz_core import Driver
from vz_plugins._serve import serve

OPTIONS_ENV = "VZ_DRIVER_OPTIONS"


def _factory(spec: str) -> Driver:
    module_name, _, attr = spec.partition(":")
    options: dict[str, Any] = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
    made = getattr(importlib.import_module(module_name), attr)(**options)
    if not isinstance(made, Driver):
        raise TypeError(f"{spec} built a {type(made).__name__}, not a vz_core Driver")
    return made


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or ":" not in args[0]:
        sys.stderr.write("usage: python -m vz_plugins MODULE:FACTORY\n")
        sys.exit(2)
    serve(lambda: _factory(args[0]))


if __name__ == "__main__":
    main()
