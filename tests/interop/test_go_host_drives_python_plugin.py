"""A Go host built on go-plugin drives vz's Python plugin (the fake driver) through the real transport."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import psutil
import pytest

STEPS = [
    "info",
    "find-absent",
    "run-image",
    "find-running",
    "exec-binary-echo",
    "exec-1mib",
    "exec-exit-code",
    "stop",
    "start",
    "delete",
    "not-found-detail",
    "shutdown",
]


def _run_host(go_bin: Path, state: Path, *extra: str) -> list[dict[str, object]]:
    plugin = shutil.which("vz-driver-fake")
    assert plugin, "vz-driver-fake console script is not installed"
    proc = subprocess.run(
        [
            str(go_bin / "vz-go-host"),
            "-plugin",
            plugin,
            "-plugin-arg",
            "--state-dir",
            "-plugin-arg",
            str(state),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    steps = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, f"Go host failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return steps


@pytest.mark.parametrize("automtls", [False, True], ids=["plaintext", "automtls"])
def test_go_host_runs_the_whole_scenario(go_bin: Path, tmp_path: Path, automtls: bool) -> None:
    before = {p.pid for p in psutil.process_iter()}
    steps = _run_host(go_bin, tmp_path / "state", *(["-automtls"] if automtls else []))
    assert [s["step"] for s in steps] == STEPS
    failed = [s for s in steps if not s["ok"]]
    assert not failed, failed
    by = {s["step"]: s for s in steps}
    assert by["info"]["driver_name"] == "fake" and by["info"]["api_major"] == 1
    assert by["info"]["negotiated_protocol"] == "grpc"
    assert by["exec-binary-echo"]["stdout_hex"] == "00ff800a0d01"
    assert by["exec-1mib"]["bytes"] == 1 << 20 and int(str(by["exec-1mib"]["max_frame"])) <= 32768
    assert by["not-found-detail"]["details"] == 1
    # go-plugin hosts wait 2 s after Shutdown before killing: our plugin must be gone well before that.
    assert int(str(by["shutdown"]["ms"])) < 1000
    leftovers = [
        p
        for p in psutil.process_iter(["pid", "cmdline"])
        # This host's plugins (their --state-dir): other tests of the run (other workers) start fake plugins too.
        if p.pid not in before
        and any("vz-driver-fake" in part for part in (p.info["cmdline"] or []))
        and str(tmp_path / "state") in (p.info["cmdline"] or [])
    ]
    assert not leftovers, f"plugin processes left behind: {leftovers}"
