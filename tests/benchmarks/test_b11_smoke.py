"""B11 works: ``python -m benchmarks --smoke --only B11`` measures every case and leaves nothing behind.

Smoke mode proves the code path (a version 2 Environment through the real vz and daemon, iperf3 or the socket
pump inside the Machines' namespaces, the plain veth, the export relay), not the figures. Afterwards: no process
of the run, no mount under its scratch directory, no route domain, no link of the plain veth.
"""

from __future__ import annotations

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
CASES = ("declared_path", "plain_veth", "export")


@pytest.fixture
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vzb11-", dir="/tmp"))  # short: Unix socket paths live below it
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
            found.append(f"process {proc.info['pid']}: {cmdline[:200]}")
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    found += [f"mount {p}" for p in (line.split()[4] for line in mounts) if p.startswith(str(scratch))]
    return found


@pytest.mark.slow
def test_b11_smoke_measures_every_case_and_cleans_up(scratch: Path) -> None:
    out = scratch / "out"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--only", "B11", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(scratch)},
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    b11 = json.loads((out / "results.json").read_text())["benchmarks"]["B11"]
    assert b11["status"] == "ok", b11.get("error")
    if os.geteuid() != 0:
        assert b11["measured"] is False and "needs root" in " ".join(b11["notes"])
        return
    assert b11["measured"] is True, b11["notes"]
    assert b11["tool"] == ("iperf3" if shutil.which("iperf3") else "python socket pump")
    for case in CASES:
        assert b11["throughput"][case]["gbit_per_s"] > 0, case
        latency = b11["latency"][case]
        assert latency["connect_and_1_byte"]["n"] == latency["connect"]["n"] == b11["latency_samples_per_case"] >= 20
        assert 0 < latency["connect"]["p50_ms"] <= latency["connect_and_1_byte"]["p50_ms"], case
    assert b11["path_throughput"] == b11["throughput"]["declared_path"]
    assert b11["export_throughput"] == b11["throughput"]["export"]
    assert len(b11["load_average_before_after"]) == 2
    assert b11["domain_left_after_delete"] is False
    assert b11["environment_id"].startswith("env_")
    assert not os.path.lexists(f"/run/netns/vzd-{b11['environment_id'][4:]}")  # its route domain is gone
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert " b11" not in links
    assert _leftovers(scratch) == []
