"""`vz driver list | add MANIFEST | verify [NAME]`.

The work is done by ``vz_core.drivers`` (built-in registry + external manifests, checksums).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vz_core.errors import TrustError

__all__ = ["run_driver_command"]


def _describe(row: dict[str, Any]) -> str:
    if row.get("origin") == "external":
        detail = f"{row.get('version', '?')} API {row.get('api_version', '?')} {row.get('binary', '(no binary here)')}"
    else:
        detail = f"{','.join(row.get('targets', []))}  {row.get('summary', '')}"
    return f"{row['name']:<16} {row.get('origin', ''):<9} {detail}".rstrip()


def run_driver_command(args: argparse.Namespace) -> int:
    """Run one `vz driver` action; the exit status."""
    from vz_core import drivers

    if args.action == "list":
        rows = drivers.list_drivers()
        if args.json:
            sys.stdout.write(json.dumps({"drivers": rows}, indent=2) + "\n")
        else:
            sys.stdout.write("".join(_describe(row) + "\n" for row in rows))
        return 0
    if args.action == "add":
        row = drivers.add_manifest(args.manifest)
        if args.json:
            sys.stdout.write(json.dumps(row, indent=2) + "\n")
        else:
            sys.stdout.write(f"{row.get('status', 'added')} driver {row['name']} ({row.get('binary', '')})\n")
        return 0
    rows = drivers.verify(args.name)
    if args.json:
        sys.stdout.write(json.dumps({"drivers": rows}, indent=2) + "\n")
    else:
        for row in rows:
            sys.stdout.write(f"{row['name']:<16} {'ok' if row['ok'] else 'FAILED':<6} {row['detail']}\n")
    failed = [row["name"] for row in rows if not row["ok"]]
    if failed:
        raise TrustError(f"verification failed for {', '.join(failed)}; re-add a trusted manifest (vz driver add)")
    return 0
