"""Exit codes and how every understood error maps to one (documented in docs/cli.md).

The mapping is the daemon's (``vz_core.daemon.classify_error``): the CLI prints the daemon's errors with the
exit code and kind they arrive with, and maps its own few local errors (usage, `-it` without a terminal) with
the same table.
"""

from __future__ import annotations

from vz_core.errors import VzError

__all__ = ["BACKEND", "CONFLICT", "INTERRUPTED", "NOT_FOUND", "OK", "USAGE", "classify"]

OK = 0
BACKEND = 1
USAGE = 2
NOT_FOUND = 3
CONFLICT = 4
INTERRUPTED = 130


def classify(exc: VzError) -> tuple[int, str]:
    """(exit code, kind) of an understood error."""
    from vz_core.daemon import classify_error

    return classify_error(exc)
