"""Builds the Go interop peers (tests/go) once per session from Debian's Go packages."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def go_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("go") is None or shutil.which("protoc-gen-go-grpc") is None:
        pytest.fail(
            "the Go interop peers need golang-go, golang-github-hashicorp-go-plugin-dev, protoc-gen-go and "
            "protoc-gen-go-grpc (scripts/install-deps.sh installs them)"
        )
    out = tmp_path_factory.mktemp("go")
    result = subprocess.run(
        ["bash", str(ROOT / "tests" / "go" / "build.sh"), str(out)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"building the Go peers failed:\n{result.stdout}\n{result.stderr}"
    return out / "bin"
