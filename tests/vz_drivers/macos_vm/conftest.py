"""Fixtures of the macos_vm tests: a real darwin/arm64 Mach-O executable, cross-compiled once."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from macos_conftest_lib import go_build


@pytest.fixture(scope="session")
def go_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("go") is None:
        pytest.fail("these tests need the Go toolchain (golang-go) on PATH")
    return tmp_path_factory.mktemp("gocache")


@pytest.fixture(scope="session")
def darwin_program(go_cache: Path) -> Path:
    """A minimal Go program built for darwin/arm64 (GOOS=darwin GOARCH=arm64 CGO_ENABLED=0)."""
    src = go_cache / "hello"
    src.mkdir()
    (src / "main.go").write_text("package main\n\nfunc main() {}\n")
    done = go_build(src, go_cache / "hello-darwin-arm64", go_cache)
    assert done.returncode == 0, done.stderr
    return go_cache / "hello-darwin-arm64"


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short private directory: a Machine's Unix sockets live in its directory, and socket addresses hold at
    most 103 bytes on macOS (107 on Linux), which pytest's own tmp_path can exceed."""
    path = Path(tempfile.mkdtemp(prefix="vzm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
