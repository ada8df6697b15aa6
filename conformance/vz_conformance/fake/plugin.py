"""``vz-driver-fake``: the reference fake driver served as a plugin, through the shared built-in plugin main.

Usage: ``vz-driver-fake [--state-dir DIR] [--fault NAME ...] [--list-faults]`` (launched by a host, never by
hand). The command line comes from the fake's declaration; the hooks here add ``--list-faults`` and make the
plugin-level fault modes act around the SDK's handshake (the others are passed to ``FakeDriver``). Stdout
belongs to the handshake line; everything this module says goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from vz_core.errors import UserError
from vz_core.registry import PluginHooks, PluginStart

from ._faults import FAULT_DESCRIPTIONS, check_faults
from .registration import DECLARATION

__all__ = ["HOOKS", "build_parser", "main"]

PROG = "vz-driver-fake"


class _FakePluginHooks(PluginHooks):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--list-faults", action="store_true", help="print every fault mode and exit")

    def before_serve(
        self, parser: argparse.ArgumentParser, args: argparse.Namespace, options: dict[str, Any]
    ) -> PluginStart:
        if args.list_faults:
            width = max(map(len, FAULT_DESCRIPTIONS))
            for name, description in sorted(FAULT_DESCRIPTIONS.items()):
                print(f"{name:<{width}}  {description}")
            sys.exit(0)
        raw = options.get("faults") or ()
        try:
            faults = check_faults([raw] if isinstance(raw, str) else raw)
        except UserError as exc:
            parser.error(str(exc))
        if "crash-before-handshake" in faults:
            sys.stderr.write(f"{PROG}: exiting before the handshake (fault mode 'crash-before-handshake')\n")
            sys.stderr.flush()
            os._exit(3)
        if "never-handshake" in faults:
            sys.stderr.write(
                f"{PROG}: never printing a handshake (fault mode 'never-handshake'); waiting to be killed\n"
            )
            sys.stderr.flush()
            while True:
                time.sleep(3600)
        # FakeDriver is built after the handshake (its code is imported only then): a fast cold start.
        return PluginStart(on_serving=_crash_after_handshake if "crash-after-handshake" in faults else None)


def _crash_after_handshake() -> None:
    sys.stdout.flush()
    sys.stderr.write(f"{PROG}: exiting after the handshake (fault mode 'crash-after-handshake')\n")
    sys.stderr.flush()
    os._exit(3)


HOOKS = _FakePluginHooks()


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``vz-driver-fake`` console script: the plugin SDK serves the declaration with these hooks."""
    from vz_plugins import serve_declaration

    serve_declaration(DECLARATION, argv)


build_parser = DECLARATION.plugin_parser

if __name__ == "__main__":
    main()
