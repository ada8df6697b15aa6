"""The benchmarks' commands report their own peak RSS when started by the spawner (gather_timed), not the size
of the benchmark process that started them (run_timed)."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from benchmarks._common import gather_timed, run_timed

# A command that peaks at about 40 MiB: well above the spawner's own size, well below what the test holds.
SMALL = [sys.executable, "-I", "-S", "-c", "b = bytearray(40 << 20); print(len(b))"]
HELD_MIB = 400


async def test_a_command_reports_its_own_peak_rss_not_its_starters(tmp_path: Path) -> None:
    held = bytearray(HELD_MIB << 20)  # this process is large, as a benchmark process is after B4
    held[::4096] = b"x" * (len(held) // 4096)  # every page touched: resident
    assert psutil.Process().memory_info().rss > HELD_MIB << 20
    env = {"PATH": "/usr/bin:/bin"}
    direct = run_timed(SMALL, cwd=tmp_path, env=env, log=tmp_path / "direct.log", timeout=60)
    assert direct.ok and direct.output.strip() == str(40 << 20)
    # Started from here, the command's peak is at least this process's size: that is what the spawner avoids.
    assert direct.max_rss_kib > HELD_MIB * 1024

    results = await gather_timed([(SMALL, tmp_path, env, tmp_path / f"spawned-{i}.log") for i in range(3)], 60)
    for result in results:
        assert result.ok and result.output.strip() == str(40 << 20)
        assert 40 * 1024 < result.max_rss_kib < 100 * 1024, result.max_rss_kib
        assert 0 < result.seconds < 60
    del held


async def test_a_failing_command_keeps_its_exit_code_and_output(tmp_path: Path) -> None:
    argv = [sys.executable, "-I", "-S", "-c", "import sys; print('oops'); sys.exit(3)"]
    (result,) = await gather_timed([(argv, tmp_path, {}, tmp_path / "fail.log")], 60)
    assert result.returncode == 3 and not result.ok and result.output.strip() == "oops"


async def test_a_command_that_cannot_start_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-program")
    with pytest.raises(RuntimeError, match="no-such-program"):
        await gather_timed([([missing], tmp_path, {}, tmp_path / "missing.log")], 60)
