"""The `vz` command line (``vz_core.cli:main`` is the console script).

Kept cheap to import: the top-level help and `vz exec` never load pydantic or rich.
"""

from __future__ import annotations

from vz_core.cli._main import main

__all__ = ["main"]
