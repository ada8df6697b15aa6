from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from vz_core.errors import TrustError
from vz_core.trust import host_platform, load_manifest, parse_manifest, sha256_of, verify_binary

SCRIPT = b"#!/bin/sh\necho hello\n"


def _binary(directory: Path, name: str = "driver", data: bytes = SCRIPT, mode: int = 0o755) -> tuple[Path, str]:
    path = directory / name
    path.write_bytes(data)
    path.chmod(mode)
    return path, hashlib.sha256(data).hexdigest()


def _manifest(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "acme",
        "version": "1.0",
        "api_version": "1.3",
        "binaries": {host_platform(): {"path": "bin/acme", "sha256": "a" * 64}},
    }
    base.update(over)
    return base


# Manifests --------------------------------------------------------------------------------------------


def test_a_valid_manifest_parses_and_resolves_paths(tmp_path: Path) -> None:
    raw = _manifest(args=["--serve"], options={"type": "object"}, plaintext=True)
    raw["binaries"]["darwin/arm64"] = {"url": "https://example.invalid/acme", "file": "acme-mac", "sha256": "B" * 64}
    m = parse_manifest(json.dumps(raw))
    assert m.binary_path(tmp_path) == tmp_path / "bin" / "acme"
    assert m.binary_path(tmp_path, "darwin/arm64") == tmp_path / "acme-mac"
    assert m.binaries["darwin/arm64"].sha256 == "b" * 64  # compared case-insensitively
    assert m.args == ("--serve",) and m.plaintext


def _entry(**entry: Any) -> dict[str, Any]:
    return _manifest(binaries={host_platform(): entry})


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        pytest.param(_entry(path="bin/acme"), "sha256: missing (every binary needs a SHA-256 checksum)", id="no-sum"),
        pytest.param(_entry(path="b", sha256="abc"), "64 hexadecimal digits", id="short-sum"),
        pytest.param(_entry(path="b", sha256="g" * 64), "64 hexadecimal digits", id="non-hex-sum"),
        pytest.param(_entry(path="b", sha256=""), "64 hexadecimal digits", id="empty-sum"),
        pytest.param(_entry(sha256="a" * 64), "exactly one of 'path' or 'url'", id="no-source"),
        pytest.param(_entry(url="https://x.invalid/a", sha256="a" * 64), "needs 'file'", id="url-no-file"),
        pytest.param(_entry(url="https://x", file="../a", sha256="a" * 64), "plain file name", id="file-escape"),
        pytest.param(_manifest(binaries={"plan9/mips": {"path": "b", "sha256": "a" * 64}}), "unknown platform", id="p"),
        pytest.param(_manifest(binaries={}), "binaries", id="no-binaries"),
        pytest.param(_manifest(api_version="2.0"), "api_version", id="api-2"),
        pytest.param(_manifest(name="Bad Name"), "name", id="bad-name"),
        pytest.param(_manifest(name="acme\n"), "name", id="name-newline"),
        pytest.param(_manifest(name="../acme"), "name", id="name-path"),
        pytest.param(_manifest(name="acme.v2"), "name", id="name-dot"),
        pytest.param(_manifest(name="9acme"), "name", id="name-digit-first"),
        pytest.param(_entry(path="bin/ac\x00me", sha256="a" * 64), "NUL", id="nul-path"),
        pytest.param(_manifest(args=["a\x00b"]), "NUL", id="nul-arg"),
        pytest.param(_entry(path="b", sha256="a" * 64 + "\n"), "64 hexadecimal digits", id="sum-newline"),
        pytest.param(_manifest(binaries={"linux/amd64\n": {"path": "b", "sha256": "a" * 64}}), "platform", id="p-nl"),
        pytest.param(_manifest(colour="blue"), "colour", id="unknown-key"),
    ],
)
def test_invalid_manifests_are_refused_naming_the_problem(raw: dict[str, Any], fragment: str) -> None:
    with pytest.raises(TrustError, match="invalid") as caught:
        parse_manifest(raw)
    assert fragment in str(caught.value)


def test_manifest_files_that_are_not_json_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text("{not json")
    with pytest.raises(TrustError, match="not valid JSON"):
        load_manifest(path)
    with pytest.raises(TrustError, match="cannot read manifest"):
        load_manifest(tmp_path / "missing.json")


def test_no_binary_for_this_host_names_what_exists() -> None:
    m = parse_manifest(_manifest(binaries={"windows/arm64": {"path": "a.exe", "sha256": "a" * 64}}))
    with pytest.raises(TrustError, match=r"no binary for .* \(it has: windows/arm64\)"):
        m.entry_for()


# Binaries ---------------------------------------------------------------------------------------------


def test_verified_binary_is_a_sealed_copy_of_exactly_the_hashed_bytes(tmp_path: Path) -> None:
    path, digest = _binary(tmp_path)
    with verify_binary(path, digest.upper(), driver_dir=tmp_path) as vb:
        assert vb.sha256 == digest and vb.size == len(SCRIPT)
        if vb.fd is not None:
            assert os.pread(vb.fd, 1 << 16, 0) == SCRIPT
            with pytest.raises(PermissionError):
                os.pwrite(vb.fd, b"evil", 0)  # sealed against writes
        else:
            assert vb.copy_path is not None and Path(vb.copy_path).read_bytes() == SCRIPT
        # The original can change now: what runs is the copy.
        path.write_bytes(b"#!/bin/sh\necho evil\n")
        if vb.fd is not None:
            assert os.pread(vb.fd, 1 << 16, 0) == SCRIPT
    assert vb.fd is None


def test_checksum_mismatch_is_refused(tmp_path: Path) -> None:
    path, _ = _binary(tmp_path)
    with pytest.raises(TrustError, match=r"SHA-256 mismatch .* the manifest says 0{64}, the file has"):
        verify_binary(path, "0" * 64, driver_dir=tmp_path)


def test_a_file_changed_between_two_operations_fails_the_second(tmp_path: Path) -> None:
    path, digest = _binary(tmp_path)
    verify_binary(path, digest, driver_dir=tmp_path).close()
    path.write_bytes(SCRIPT + b"# changed\n")
    with pytest.raises(TrustError, match="SHA-256 mismatch"):
        verify_binary(path, digest, driver_dir=tmp_path)
    with pytest.raises(TrustError, match="SHA-256 mismatch"):  # and again: nothing is cached
        verify_binary(path, digest, driver_dir=tmp_path)


def test_malformed_expected_checksum_is_refused(tmp_path: Path) -> None:
    path, _ = _binary(tmp_path)
    with pytest.raises(TrustError, match="not 64 hexadecimal digits"):
        verify_binary(path, "xyz", driver_dir=tmp_path)


def test_relative_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrustError, match="not absolute"):
        verify_binary("bin/driver", "a" * 64)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrustError, match="does not exist"):
        verify_binary(tmp_path / "nope", "a" * 64, driver_dir=tmp_path)


def test_non_executable_file_is_refused(tmp_path: Path) -> None:
    path, digest = _binary(tmp_path, mode=0o644)
    with pytest.raises(TrustError, match="not executable"):
        verify_binary(path, digest, driver_dir=tmp_path)


def test_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(TrustError, match="not a regular file"):
        verify_binary(tmp_path / "dir", "a" * 64, driver_dir=tmp_path)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o755)
    with pytest.raises(TrustError, match="not a regular file"):
        verify_binary(fifo, "a" * 64, driver_dir=tmp_path)


def test_symlink_escaping_the_driver_directory_is_refused(tmp_path: Path) -> None:
    outside, digest = _binary(tmp_path, "outside")
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir()
    (driver_dir / "bin").symlink_to(outside)
    with pytest.raises(TrustError, match="outside its driver directory"):
        verify_binary(driver_dir / "bin", digest, driver_dir=driver_dir)
    with pytest.raises(TrustError, match="outside its driver directory"):
        sha256_of(driver_dir / "bin", driver_dir=driver_dir)


def test_symlink_inside_the_driver_directory_is_allowed(tmp_path: Path) -> None:
    real, digest = _binary(tmp_path, "driver-1.2")
    (tmp_path / "driver").symlink_to(real.name)
    with verify_binary(tmp_path / "driver", digest, driver_dir=tmp_path) as vb:
        assert vb.real_path == str(real)


def test_sha256_of_runs_the_same_checks_without_copying(tmp_path: Path) -> None:
    path, digest = _binary(tmp_path)
    assert sha256_of(path, driver_dir=tmp_path) == digest
    path.chmod(0o600)
    with pytest.raises(TrustError, match="not executable"):
        sha256_of(path, driver_dir=tmp_path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd execution is the Linux path")
def test_the_sealed_copy_executes_even_as_a_script(tmp_path: Path) -> None:
    import subprocess

    path, digest = _binary(tmp_path)
    with verify_binary(path, digest, driver_dir=tmp_path) as vb:
        assert vb.fd is not None
        assert stat.S_ISREG(os.fstat(vb.fd).st_mode)
        out = subprocess.run(
            [str(path)], executable=f"/proc/self/fd/{vb.fd}", pass_fds=(vb.fd,), capture_output=True, check=True
        )
    assert out.stdout == b"hello\n"
