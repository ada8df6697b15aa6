"""The guest agent a macOS Machine runs: Mach-O arm64 checks, and the darwin/arm64 cross-compile."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from vz_core.errors import UnavailableError
from vz_drivers._agent import agent_source_digest, ensure_agent_binary
from vz_drivers.macos_vm._macho import CPU_TYPE_ARM64, MH_EXECUTE, MH_MAGIC_64, check_darwin_arm64, macho_kind


def test_a_darwin_arm64_build_has_the_mach_o_arm64_header(darwin_program: Path) -> None:
    magic, cputype, _sub, filetype = struct.unpack("<IiiI", darwin_program.read_bytes()[:16])
    assert (magic, cputype, filetype) == (MH_MAGIC_64, CPU_TYPE_ARM64, MH_EXECUTE)
    assert macho_kind(darwin_program.read_bytes()[:16]) == "darwin/arm64 executable"
    check_darwin_arm64(darwin_program)


@pytest.mark.parametrize(
    ("head", "text"),
    [
        (b"\x7fELF\x02\x01\x01" + bytes(9), "ELF file (Linux)"),
        (struct.pack("<IiiI", MH_MAGIC_64, 0x01000007, 3, MH_EXECUTE), "CPU type 0x1000007, not arm64"),
        (struct.pack("<IiiI", MH_MAGIC_64, CPU_TYPE_ARM64, 0, 6), "not an executable"),
        (struct.pack("<IiiI", 0xFEEDFACE, 12, 0, MH_EXECUTE), "not a 64-bit Mach-O"),
        (b"\xcf\xfa", "too short"),
    ],
    ids=["elf", "x86_64", "dylib", "32-bit", "short"],
)
def test_anything_else_is_refused_with_what_it_is(tmp_path: Path, head: bytes, text: str) -> None:
    assert text in macho_kind(head)
    path = tmp_path / "agent"
    path.write_bytes(head)
    with pytest.raises(UnavailableError) as info:
        check_darwin_arm64(path)
    assert text in info.value.message
    assert info.value.details["option"] == "agent_binary"


def test_the_linux_agent_is_not_accepted(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError, match="GOOS=darwin GOARCH=arm64"):
        check_darwin_arm64(Path("/bin/sh").resolve())


@pytest.fixture(scope="module")
def darwin_agent(go_cache: Path) -> Path:
    """The vz guest agent cross-compiled for darwin/arm64 from the bundled sources by ``ensure_agent_binary``
    (the way the macos_vm driver gets it), once for the tests of this module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("VZ_AGENT_BINARY", raising=False)
        return ensure_agent_binary("arm64", goos="darwin", cache_dir=go_cache / "agent")


def test_the_vz_guest_agent_cross_compiles_for_darwin_arm64(darwin_agent: Path) -> None:
    magic, cputype, _sub, filetype = struct.unpack("<IiiI", darwin_agent.read_bytes()[:16])
    assert (magic, cputype, filetype) == (MH_MAGIC_64, CPU_TYPE_ARM64, MH_EXECUTE)
    check_darwin_arm64(darwin_agent)


def test_ensure_agent_binary_builds_the_darwin_agent_under_its_own_digest(
    go_cache: Path, darwin_agent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VZ_AGENT_BINARY", raising=False)
    assert darwin_agent == go_cache / "agent" / agent_source_digest("arm64", goos="darwin") / "vz-agent"
    assert agent_source_digest("arm64", goos="darwin") != agent_source_digest("arm64")
    # Built once: asking again gives the same file, not a new build.
    mtime = darwin_agent.stat().st_mtime_ns
    assert ensure_agent_binary("arm64", goos="darwin", cache_dir=go_cache / "agent") == darwin_agent
    assert darwin_agent.stat().st_mtime_ns == mtime
