"""vfkit binary discovery, SHA-256 pinning (trust on first use), the private copy, and --version parsing."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from vz_core.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from vz_drivers.vfkit._binary import VfkitBinary, parse_version


def _fake(path: Path, version_line: str = "vfkit version: v0.6.1") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("output", "text", "numbers"),
    [
        ("vfkit version: v0.6.1", "0.6.1", (0, 6, 1)),
        ("vfkit version: 0.5.1-12-gabcdef", "0.5.1-12-gabcdef", (0, 5, 1)),
        ("vfkit version: v0.6", "0.6", (0, 6, 0)),
        ("vfkit version: unknown", "vfkit version: unknown", None),
    ],
)
def test_version_parsing(output: str, text: str, numbers: tuple[int, int, int] | None) -> None:
    assert parse_version(output) == (text, numbers)


def test_first_use_records_the_hash_and_runs_a_private_copy(tmp_path: Path) -> None:
    source = _fake(tmp_path / "brew" / "vfkit")
    binary = VfkitBinary(str(source), state_root=tmp_path / "state")
    verified = binary.verify()
    trust = json.loads((tmp_path / "state" / "trust.json").read_text())
    assert trust == {"path": str(source), "sha256": verified.sha256}
    copy = Path(verified.path)
    assert copy != source and copy.read_bytes() == source.read_bytes()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o500
    assert stat.S_IMODE(copy.parent.stat().st_mode) == 0o700
    assert binary.check_version() == "0.6.1"


def test_a_changed_binary_is_refused_until_trusted_again(tmp_path: Path) -> None:
    source = _fake(tmp_path / "vfkit")
    VfkitBinary(str(source), state_root=tmp_path / "s").verify()
    _fake(source, "vfkit version: v9.9.9")  # "brew upgrade" or tampering
    fresh = VfkitBinary(str(source), state_root=tmp_path / "s")
    with pytest.raises(FailedPreconditionError, match="changed: SHA-256") as info:
        fresh.verify()
    assert info.value.details["path"] == str(source)
    (tmp_path / "s" / "trust.json").unlink()
    assert fresh.verify().sha256 == info.value.details["actual_sha256"]


def test_a_cached_verification_notices_a_replaced_file(tmp_path: Path) -> None:
    source = _fake(tmp_path / "vfkit")
    binary = VfkitBinary(str(source), state_root=tmp_path / "s")
    binary.verify()
    replacement = _fake(tmp_path / "other", "vfkit version: v0.7.0")
    os.replace(replacement, source)
    with pytest.raises(FailedPreconditionError):
        binary.verify()


def test_a_pinned_hash_wins(tmp_path: Path) -> None:
    source = _fake(tmp_path / "vfkit")
    with pytest.raises(FailedPreconditionError, match="the vfkit_sha256 option"):
        VfkitBinary(str(source), state_root=tmp_path / "s", pinned_sha256="0" * 64).verify()
    assert not (tmp_path / "s" / "trust.json").exists()
    with pytest.raises(InvalidArgumentError):
        VfkitBinary(str(source), state_root=tmp_path / "s", pinned_sha256="abc")


def test_missing_vfkit_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UnavailableError, match=r"vfkit not found on PATH; install vfkit \(`brew install vfkit`\)"):
        VfkitBinary("", state_root=tmp_path / "s").verify()
    with pytest.raises(UnavailableError, match="vfkit not found at /nowhere/vfkit"):
        VfkitBinary("/nowhere/vfkit", state_root=tmp_path / "s").verify()
    with pytest.raises(InvalidArgumentError, match="absolute"):
        VfkitBinary("bin/vfkit", state_root=tmp_path / "s")


def test_found_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _fake(tmp_path / "bin" / "vfkit")
    monkeypatch.setenv("PATH", str(source.parent))
    assert VfkitBinary("", state_root=tmp_path / "s").verify().source == str(source)


def test_too_old_a_vfkit_is_refused(tmp_path: Path) -> None:
    source = _fake(tmp_path / "vfkit", "vfkit version: v0.5.1")
    with pytest.raises(FailedPreconditionError, match=r"older than 0\.6\.0"):
        VfkitBinary(str(source), state_root=tmp_path / "s").check_version()


def test_not_executable(tmp_path: Path) -> None:
    source = _fake(tmp_path / "vfkit")
    source.chmod(0o644)
    with pytest.raises(UnavailableError, match="not an executable file"):
        VfkitBinary(str(source), state_root=tmp_path / "s").verify()
