"""The Go interop peers (tests/go) from Debian's Go packages: built by tests/go/build.sh once per source digest
and shared with the benchmarks (``benchmarks._common.go_peer_bin``, under ``<vz cache dir>/bench-go``), so a run
builds them at most once whoever asks first."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def go_bin() -> Path:
    if any(shutil.which(tool) is None for tool in ("go", "protoc", "protoc-gen-go-grpc")):
        pytest.fail(
            "the Go interop peers need golang-go, golang-github-hashicorp-go-plugin-dev, protobuf-compiler, "
            "protoc-gen-go and protoc-gen-go-grpc (scripts/install-deps.sh installs them)"
        )
    from benchmarks._common import go_peer_bin

    notes: list[str] = []
    plugin = go_peer_bin(notes)
    assert plugin is not None, notes
    bin_dir = plugin.parent
    for name in ("vz-go-plugin", "vz-go-host"):
        assert os.access(bin_dir / name, os.X_OK), f"tests/go/build.sh did not leave an executable {bin_dir / name}"
    return bin_dir
