"""Run the vz benchmarks and write JSON plus a human table.

Usage: python -m benchmarks [--smoke] [--only B1,B2] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# B6 runs last: it starts up to 50 processes at once, and the load it leaves behind would weigh on what follows.
MODULES = [
    "benchmarks.b1_cold_start",
    "benchmarks.b2_unary",
    "benchmarks.b3_exec",
    "benchmarks.b4_throughput",
    "benchmarks.b5_create",
    "benchmarks.b7_cli_exec",
    "benchmarks.b8_memory",
    "benchmarks.b9_session",
    "benchmarks.b10_pty",
    "benchmarks.b11_network",
    "benchmarks.b12_rootdisk_ext4",
    "benchmarks.b6_scale",
]


@dataclass
class Context:
    """What every benchmark gets: smoke mode, a scratch directory, and a place for notes."""

    smoke: bool
    workdir: Path
    notes: list[str] = field(default_factory=list)

    def n(self, full: int, smoke: int) -> int:
        """Sample count: ``full`` normally, ``smoke`` in smoke mode."""
        return smoke if self.smoke else full


def _available() -> list[Any]:
    found = []
    for name in MODULES:
        try:
            found.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="few samples: proves the benchmarks work, no figures")
    parser.add_argument("--only", default="", help="comma-separated ids, e.g. B1,B3")
    parser.add_argument("--out", default="bench-results", help="directory for results.json")
    args = parser.parse_args(argv)
    wanted = {x.strip().upper() for x in args.only.split(",") if x.strip()}
    modules = [m for m in _available() if not wanted or m.ID in wanted]
    if wanted and {m.ID for m in modules} != wanted:
        missing = sorted(wanted - {m.ID for m in modules})
        print(f"unknown or unavailable benchmark ids: {', '.join(missing)}", file=sys.stderr)
        return 2
    if not modules:
        print("no benchmarks available", file=sys.stderr)
        return 1
    results: dict[str, Any] = {
        "schema": 1,
        "smoke": args.smoke,
        "host": {
            "machine": platform.machine(),
            "system": platform.system(),
            "release": platform.release(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "benchmarks": {},
    }
    failed = False
    for module in modules:
        with tempfile.TemporaryDirectory(prefix=f"vz-bench-{module.ID}-") as tmp:
            ctx = Context(smoke=args.smoke, workdir=Path(tmp))
            load_before = [round(x, 2) for x in os.getloadavg()]
            t0 = time.perf_counter()
            try:
                data = asyncio.run(module.run(ctx))
                status = "ok"
            except Exception:
                data = {"error": traceback.format_exc(limit=5)}
                status = "failed"
                failed = True
            results["benchmarks"][module.ID] = {
                "title": module.TITLE,
                "status": status,
                "seconds": round(time.perf_counter() - t0, 2),
                "load_average_before": load_before,
                "notes": ctx.notes,
                **data,
            }
        print(f"{module.ID} {status}: {module.TITLE}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    _table(results)
    return 1 if failed else 0


def _table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="vz benchmarks" + (" (smoke: not figures)" if results["smoke"] else ""))
    table.add_column("id")
    table.add_column("what")
    table.add_column("status")
    table.add_column("headline")
    for bid, data in results["benchmarks"].items():
        table.add_row(bid, data["title"], data["status"], str(data.get("headline", data.get("error", "")))[:200])
    Console(stderr=False).print(table)


if __name__ == "__main__":
    sys.exit(main())
