"""Exit codes and how every understood error maps to one (documented in docs/cli.md).

The codes are the one table of ``vz_core.wire`` and the mapping is the daemon's
(``vz_core.daemon.classify_error``): the CLI prints the daemon's errors with the exit code and kind they arrive
with, and maps its own few local errors (usage, `-it` without a terminal) with the same table.
"""

from __future__ import annotations

from vz_core.errors import VzError
from vz_core.wire import BACKEND, CONFLICT, INTERRUPTED, NOT_FOUND, OK, UNAVAILABLE, USAGE

__all__ = ["BACKEND", "CONFLICT", "INTERRUPTED", "NOT_FOUND", "OK", "UNAVAILABLE", "USAGE", "classify"]


def classify(exc: VzError) -> tuple[int, str]:
    """(exit code, kind) of an understood error."""
    from vz_core.daemon import classify_error

    return classify_error(exc)
