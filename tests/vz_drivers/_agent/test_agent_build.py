"""Locating and building the agent binary."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from vz_core.errors import UnavailableError
from vz_drivers._agent import agent_source_digest, agent_source_dir, ensure_agent_binary


def test_env_override_wins(monkeypatch: pytest.MonkeyPatch, agent_binary: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("VZ_AGENT_BINARY", str(agent_binary))
    monkeypatch.setenv("PATH", str(tmp_path))  # no go needed
    assert ensure_agent_binary(cache_dir=tmp_path / "cache") == agent_binary.resolve()
    assert not (tmp_path / "cache").exists()


def test_env_override_must_be_executable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    plain = tmp_path / "vz-agent"
    plain.write_text("not executable")
    monkeypatch.setenv("VZ_AGENT_BINARY", str(plain))
    with pytest.raises(UnavailableError, match="VZ_AGENT_BINARY"):
        ensure_agent_binary()


def test_missing_go_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("VZ_AGENT_BINARY", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UnavailableError, match="golang-go") as info:
        ensure_agent_binary(cache_dir=tmp_path / "cache")
    assert "VZ_AGENT_BINARY" in str(info.value)


def test_source_digest_depends_on_target() -> None:
    digest = agent_source_digest("amd64")
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert agent_source_digest("amd64") == digest
    assert agent_source_digest("arm64") != digest
    assert sorted(p.name for p in agent_source_dir().glob("*.go"))


def test_built_binary_lives_under_its_digest(agent_binary: Path) -> None:
    if os.environ.get("VZ_AGENT_BINARY"):
        pytest.skip("VZ_AGENT_BINARY points at a prebuilt agent")
    assert agent_binary.name == "vz-agent"
    assert agent_binary.parent.name == agent_source_digest()
    out = subprocess.run([agent_binary, "version"], capture_output=True, check=True).stdout
    assert out.startswith(b"vz-agent ")
    # static: no program interpreter
    assert b"/lib64/ld-linux" not in agent_binary.read_bytes()[:4096]


@pytest.mark.slow
def test_concurrent_first_builds_share_one_result(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("VZ_AGENT_BINARY", raising=False)
    cache = tmp_path / "cache"
    results: list[Path | BaseException] = []

    def build() -> None:
        try:
            results.append(ensure_agent_binary(cache_dir=cache))
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2
    first, second = results
    assert isinstance(first, Path), first
    assert first == second
    assert first == cache / agent_source_digest() / "vz-agent"
    # Built in a temporary directory and renamed: nothing else is left behind.
    assert sorted(p.name for p in cache.iterdir()) == sorted([".build.lock", "gocache", agent_source_digest()])
    mtime = first.stat().st_mtime_ns
    assert ensure_agent_binary(cache_dir=cache) == first
    assert first.stat().st_mtime_ns == mtime  # not rebuilt
