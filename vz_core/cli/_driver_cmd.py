"""`vz driver list | add | verify`.

External drivers (manifests, checksums) are handled by ``vz_core.drivers`` when it is installed; without it
``list`` shows the built-in registry and ``add``/``verify`` explain that external drivers are unavailable.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vz_core.errors import UserError

__all__ = ["run_driver_command"]


def _external() -> Any:
    import importlib

    try:
        return importlib.import_module("vz_core.drivers")
    except ImportError:
        return None


def _builtin_rows() -> list[dict[str, Any]]:
    from vz_core.registry import DriverRegistry

    registry = DriverRegistry()
    rows = []
    for name in registry.names():
        spec = registry.get(name)
        rows.append(
            {
                "name": name,
                "kind": "built-in",
                "summary": spec.summary,
                "targets": list(spec.targets),
                "plugin_command": list(spec.plugin_command),
            }
        )
    return rows


def run_driver_command(args: argparse.Namespace) -> int:
    external = _external()
    if args.action == "list":
        if external is not None and hasattr(external, "list_drivers"):
            rows = [_as_dict(row) for row in external.list_drivers()]
        else:
            rows = _builtin_rows()
        if args.json:
            sys.stdout.write(json.dumps({"drivers": rows}, indent=2) + "\n")
        else:
            for row in rows:
                targets = ",".join(row.get("targets", []))
                sys.stdout.write(f"{row['name']:<14} {row.get('kind', ''):<9} {targets:<8} {row.get('summary', '')}\n")
        return 0
    if external is None:
        raise UserError(
            f"`vz driver {args.action}` needs external driver support (vz_core.drivers), which this installation "
            "does not have; built-in drivers need no manifest"
        )
    result = external.add_driver(args.manifest) if args.action == "add" else external.verify_driver(args.name)
    if result is not None:
        sys.stdout.write(json.dumps(_as_dict(result), indent=2, default=str) + "\n")
    return 0


def _as_dict(value: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value
