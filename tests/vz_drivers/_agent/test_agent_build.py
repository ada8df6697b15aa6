"""Locating and building the agent binary."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from vz_core.errors import UnavailableError
from vz_core.paths import cache_dir
from vz_drivers._agent import _build as build_module
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


def _fake_go(bin_dir: Path, record: Path) -> None:
    """A ``go`` that records the GOCACHE it was given and writes a stand-in binary where ``-o`` says."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    go = bin_dir / "go"
    go.write_text(
        "#!/bin/sh\n"
        f'printf "%s" "$GOCACHE" > "{record}"\n'
        'while [ "$#" -gt 0 ]; do if [ "$1" = "-o" ]; then printf "#!/bin/sh\\n" > "$2"; fi; shift; done\n'
    )
    go.chmod(0o755)


@pytest.mark.parametrize(
    ("gocache", "expected"),
    [(None, "cache/gocache"), ("shared-gocache", "shared-gocache"), ("relative/dir", "cache/gocache")],
    ids=["unset", "absolute", "relative-ignored"],
)
def test_go_build_cache_is_gocache_when_absolute_else_under_the_cache_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gocache: str | None, expected: str
) -> None:
    monkeypatch.delenv("VZ_AGENT_BINARY", raising=False)
    record = tmp_path / "gocache-seen"
    _fake_go(tmp_path / "bin", record)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    if gocache is None:
        monkeypatch.delenv("GOCACHE", raising=False)
    else:
        monkeypatch.setenv("GOCACHE", str(tmp_path / gocache) if gocache.startswith("shared") else gocache)
    built = ensure_agent_binary(cache_dir=tmp_path / "cache")
    assert built == tmp_path / "cache" / agent_source_digest() / "vz-agent"
    assert record.read_text() == str(tmp_path / expected)


@pytest.mark.slow
def test_concurrent_first_builds_share_one_result(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, agent_binary: Path
) -> None:
    """Two callers of an empty output directory get one build. Go's build cache is the one the session's agent
    build warmed (``$GOCACHE``): the packages are compiled already, the binary is still built (and linked) here."""
    monkeypatch.delenv("VZ_AGENT_BINARY", raising=False)
    monkeypatch.setenv("GOCACHE", str(build_module._go_cache(cache_dir() / "agent")))
    cache = tmp_path / "cache"
    builds: list[Path] = []
    real_build = build_module._build

    def counting_build(go: str, goos: str, goarch: str, base: Path, target: Path) -> None:
        builds.append(target)
        real_build(go, goos, goarch, base, target)

    monkeypatch.setattr(build_module, "_build", counting_build)
    results: list[Path | BaseException] = []
    start = threading.Barrier(2)

    def build() -> None:
        try:
            start.wait()
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
    assert builds == [first]  # the second caller waited for the first one's build
    out = subprocess.run([first, "version"], capture_output=True, check=True).stdout
    assert out.startswith(b"vz-agent ")
    # Built in a temporary directory and renamed: nothing else is left behind.
    assert sorted(p.name for p in cache.iterdir()) == sorted([".build.lock", agent_source_digest()])
    mtime = first.stat().st_mtime_ns
    assert ensure_agent_binary(cache_dir=cache) == first
    assert first.stat().st_mtime_ns == mtime  # not rebuilt
    assert builds == [first]
