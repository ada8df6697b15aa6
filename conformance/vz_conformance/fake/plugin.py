"""``vz-driver-fake``: the reference fake driver served as a Runtime Protocol plugin.

Usage: ``vz-driver-fake [--state-dir DIR] [--fault NAME ...]`` (launched by a host, never by hand). Plugin-level
fault modes act here, around the SDK's handshake; the others are passed to ``FakeDriver``. Stdout belongs to
the handshake line; everything this module says goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from vz_core.errors import UserError

from ._faults import FAULT_DESCRIPTIONS, check_faults

__all__ = ["build_parser", "main"]

PROG = "vz-driver-fake"


def build_parser() -> argparse.ArgumentParser:
    """The plugin's command line."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The vz reference fake driver as a Runtime Protocol plugin (started by a host, not by hand).",
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        default=None,
        help="where Machines are kept (default: <vz state dir>/drivers/fake; VZ_HOME moves the vz state dir)",
    )
    parser.add_argument(
        "--fault",
        metavar="NAME",
        action="append",
        default=[],
        help="enable a fault mode (repeatable); --list-faults shows them",
    )
    parser.add_argument("--list-faults", action="store_true", help="print every fault mode and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Parse the arguments, apply plugin-level faults, then serve ``FakeDriver`` through the plugin SDK."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_faults:
        width = max(map(len, FAULT_DESCRIPTIONS))
        for name, description in sorted(FAULT_DESCRIPTIONS.items()):
            print(f"{name:<{width}}  {description}")
        sys.exit(0)
    try:
        faults = check_faults(args.fault)
    except UserError as exc:
        parser.error(str(exc))

    if "crash-before-handshake" in faults:
        sys.stderr.write(f"{PROG}: exiting before the handshake (fault mode 'crash-before-handshake')\n")
        sys.stderr.flush()
        os._exit(3)
    if "never-handshake" in faults:
        sys.stderr.write(f"{PROG}: never printing a handshake (fault mode 'never-handshake'); waiting to be killed\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)

    from vz_plugins import serve

    from ._driver import FakeDriver

    driver = FakeDriver(args.state_dir, faults)
    if "crash-after-handshake" in faults:
        serve(driver, on_serving=_crash_after_handshake)
    else:
        serve(driver)


def _crash_after_handshake() -> None:
    sys.stdout.flush()
    sys.stderr.write(f"{PROG}: exiting after the handshake (fault mode 'crash-after-handshake')\n")
    sys.stderr.flush()
    os._exit(3)


if __name__ == "__main__":
    main()
