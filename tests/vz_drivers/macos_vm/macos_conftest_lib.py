"""Building Go programs for darwin/arm64 here (the Mach-O the macOS guest runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def go_build(package: Path, out: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    go = shutil.which("go") or "go"
    shared = os.environ.get("GOCACHE", "")  # scripts/test.sh shares Go's build cache between the run's builds
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO") and k != "CGO_ENABLED"}
    env.update(
        GOOS="darwin",
        GOARCH="arm64",
        CGO_ENABLED="0",
        GO111MODULE="off",
        GOCACHE=shared if os.path.isabs(shared) else str(cache),
        GOPATH=str(cache / "gopath"),
        GOFLAGS="",
    )
    return subprocess.run(
        [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(out), "."],  # the agent build's flags: its cache entries
        cwd=package,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
