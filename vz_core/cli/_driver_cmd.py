"""`vz driver list | add MANIFEST | verify [NAME] | configure NAME [KEY=VALUE ...] [--unset KEY ...]`.

The work is done by ``vz_core.drivers`` (built-in registry + external manifests, checksums, host configuration).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vz_core.errors import TrustError

__all__ = ["add_driver_arguments", "run_driver_command"]


def add_driver_arguments(parser: argparse.ArgumentParser) -> None:
    """The sub-commands of `vz driver` on ``parser``."""
    sub = parser.add_subparsers(dest="action", metavar="{list,add,verify,configure}")
    sub.required = True
    listing = sub.add_parser("list", help="installed drivers")
    listing.add_argument("--json", action="store_true")
    add = sub.add_parser("add", help="record an external driver from its manifest (verifies its checksum)")
    add.add_argument("manifest", type=Path)
    add.add_argument("--json", action="store_true")
    verify = sub.add_parser("verify", help="re-hash driver binaries against their manifests")
    verify.add_argument("name", nargs="?")
    verify.add_argument("--json", action="store_true")
    configure = sub.add_parser(
        "configure",
        help="show or change a built-in driver's host configuration (<VZ_HOME>/config/drivers.json)",
        description="Options of scope 'host' (binaries, host paths, host networks) can only be set here, never "
        "in vz.json; project-scoped options set here are defaults a vz.json may override.",
    )
    configure.add_argument("name", metavar="NAME")
    configure.add_argument("assignments", nargs="*", metavar="KEY=VALUE", help="options to set")
    configure.add_argument("--unset", action="append", default=[], metavar="KEY", help="remove an option")
    configure.add_argument("--json", action="store_true")


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
    if args.action == "configure":
        result = drivers.configure(args.name, args.assignments, args.unset)
        if args.json:
            sys.stdout.write(json.dumps(result, indent=2) + "\n")
        else:
            sys.stdout.write(f"{result['name']} host configuration ({result['path']}):\n")
            options = result["options"]
            sys.stdout.write("".join(f"  {k} = {json.dumps(v)}\n" for k, v in sorted(options.items())) or "  (none)\n")
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
