"""The benchmarks work: ``python -m benchmarks --smoke`` runs every benchmark, exits 0 and writes valid JSON.

Smoke mode takes few samples: it proves the code paths (launching plugins, the Go peer, Environments through
the CLI, linux_native Machines), not the figures. The run's scratch space is a private temporary directory,
checked afterwards for leftover processes and mounts. A benchmark with its own smoke test (OWN_SMOKE) is left out
of this run, so no benchmark runs twice; every registered benchmark is in one of the two.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
# B11 (network) has its own smoke test with its checks (test_b11_smoke.py: ``--smoke --only B11``).
OWN_SMOKE = {"B11": "test_b11_smoke.py"}
IDS = {f"B{i}" for i in range(1, 13)} - set(OWN_SMOKE)


@pytest.fixture
def scratch() -> Iterator[Path]:
    # Short on purpose: Unix socket paths (plugins, Machine agents) live below it and are limited to ~100 bytes.
    path = Path(tempfile.mkdtemp(prefix="vzb-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _leftovers(scratch: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        try:
            home = proc.environ().get("VZ_HOME", "")
        except psutil.Error:
            home = ""
        if str(scratch) in cmdline or home.startswith(str(scratch)):
            # A vz daemon (and its plugins) is recognized by its VZ_HOME: its command line names no path.
            found.append(f"process {proc.info['pid']}: {cmdline[:200]}")
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    found += [f"mount {p}" for p in (line.split()[4] for line in mounts) if p.startswith(str(scratch))]
    return found


def test_every_registered_benchmark_has_a_smoke_run() -> None:
    from benchmarks.__main__ import MODULES

    registered = {importlib.import_module(name).ID for name in MODULES}
    assert registered == IDS | set(OWN_SMOKE)
    for test_file in OWN_SMOKE.values():
        assert (Path(__file__).parent / test_file).is_file(), test_file


@pytest.mark.slow
def test_smoke_run_writes_every_benchmark(scratch: Path) -> None:
    out = scratch / "out"
    env = {**os.environ, "TMPDIR": str(scratch)}
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--only", ",".join(sorted(IDS)), "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    data = json.loads((out / "results.json").read_text())
    assert data["schema"] == 1 and data["smoke"] is True
    benchmarks = data["benchmarks"]
    assert set(benchmarks) == IDS
    for bid, entry in benchmarks.items():
        assert entry["status"] == "ok", (bid, entry.get("error"))
        assert isinstance(entry["headline"], str) and entry["headline"], bid
    # Scale: every Environment came up, ran its command and was deleted.
    assert benchmarks["B6"]["failures"] == 0, benchmarks["B6"]
    assert benchmarks["B6"]["runs"]["n2"]["machines_left_after_delete"] == 0
    # B7: the warm daemon, the cold start apart, the floor and every installed peer measured in the same run.
    b7 = benchmarks["B7"]
    assert b7["warm_as_is"]["n"] == b7["warm_bytecode_cached"]["n"] == b7["python_pass"]["n"] >= 3
    assert b7["cold_daemon_start"]["n"] >= 1
    from benchmarks._peers import DOCKER, DOCKERD, PODMAN

    for name, exes in (("docker", (DOCKER, DOCKERD)), ("podman", (PODMAN,))):
        if all(os.access(exe, os.X_OK) for exe in exes) and os.geteuid() == 0:
            assert b7["peers"][name] is not None, b7["notes"]
            assert b7["ratios"][f"vz_as_is_over_{name}"] > 0
    # The warm session is measured against one launch per operation of the same driver.
    assert benchmarks["B9"]["warm_speedup"] > 1
    if os.geteuid() == 0:
        # Root can run linux_native Machines: those benchmarks must have measured, not skipped.
        for bid in ("B3", "B4", "B5", "B8"):
            assert benchmarks[bid]["measured"] is True, (bid, benchmarks[bid]["notes"])
        b4 = benchmarks["B4"]
        for path in ("fast_path_vz_exec", "grpc_frames_exec", "grpc_frames_exec_local"):
            assert b4[path]["mib_per_s"] > 0, path
        paused = b4["paused_reader_rss_growth_mib"]
        assert set(paused["fast_path_vz_exec"]) >= {"cli", "daemon", "plugin"}
        assert set(paused["grpc_frames"]) >= {"host", "plugin"}
        assert benchmarks["B6"]["driver"] == benchmarks["B7"]["driver"] == "linux_native"
    assert _leftovers(scratch) == []
