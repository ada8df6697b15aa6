"""The committed stubs are exactly what scripts/gen_protos.py generates from protocol/ today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_a_fresh_generation() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"stub drift:\n{result.stdout[-4000:]}\n{result.stderr[-2000:]}"
    assert "stubs up to date" in result.stdout
