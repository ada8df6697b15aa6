"""`vz driver list | add MANIFEST | verify [NAME]`.

The work is done by ``vz_core.drivers`` (built-in registry + external manifests, checksums); without it (an
installation lacking external driver support) ``list`` shows the built-in registry and ``add``/``verify``
explain why they cannot run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from vz_core.errors import TrustError, UserError

__all__ = ["run_driver_command"]


def _external() -> Any:
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
                "origin": "builtin",
                "summary": spec.summary,
                "targets": list(spec.targets),
                "plugin_command": list(spec.plugin_command),
            }
        )
    return rows


def _describe(row: dict[str, Any]) -> str:
    if row.get("origin") == "external":
        detail = f"{row.get('version', '?')} API {row.get('api_version', '?')} {row.get('binary', '(no binary here)')}"
    else:
        detail = f"{','.join(row.get('targets', []))}  {row.get('summary', '')}"
    return f"{row['name']:<16} {row.get('origin', ''):<9} {detail}".rstrip()


def run_driver_command(args: argparse.Namespace) -> int:
    """Run one `vz driver` action; the exit status."""
    external = _external()
    if args.action == "list":
        rows = external.list_drivers() if external is not None else _builtin_rows()
        if args.json:
            sys.stdout.write(json.dumps({"drivers": rows}, indent=2) + "\n")
        else:
            sys.stdout.write("".join(_describe(row) + "\n" for row in rows))
        return 0
    if external is None:
        raise UserError(
            f"`vz driver {args.action}` needs external driver support (vz_core.drivers), which this installation "
            "does not have; built-in drivers need no manifest"
        )
    if args.action == "add":
        row = external.add_manifest(args.manifest)
        if args.json:
            sys.stdout.write(json.dumps(row, indent=2) + "\n")
        else:
            sys.stdout.write(f"{row.get('status', 'added')} driver {row['name']} ({row.get('binary', '')})\n")
        return 0
    rows = external.verify(args.name)
    if args.json:
        sys.stdout.write(json.dumps({"drivers": rows}, indent=2) + "\n")
    else:
        for row in rows:
            sys.stdout.write(f"{row['name']:<16} {'ok' if row['ok'] else 'FAILED':<6} {row['detail']}\n")
    failed = [row["name"] for row in rows if not row["ok"]]
    if failed:
        raise TrustError(f"verification failed for {', '.join(failed)}; re-add a trusted manifest (vz driver add)")
    return 0
