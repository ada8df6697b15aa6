"""Is a file a Mach-O arm64 executable? (the guest agent a macOS Machine runs must be one)."""

from __future__ import annotations

import struct
from pathlib import Path

from vz_core.errors import UnavailableError

__all__ = ["CPU_TYPE_ARM64", "MH_EXECUTE", "MH_MAGIC_64", "check_darwin_arm64", "macho_kind"]

MH_MAGIC_64 = 0xFEEDFACF
CPU_TYPE_ARM64 = 0x0100000C
MH_EXECUTE = 2
_HEADER = struct.Struct("<IiiI")  # magic, cputype, cpusubtype, filetype (little-endian: arm64 and x86_64)


def macho_kind(data: bytes) -> str:
    """ "darwin/arm64 executable", or what the header says instead."""
    if len(data) < _HEADER.size:
        return "too short for a Mach-O header"
    magic, cputype, _sub, filetype = _HEADER.unpack_from(data)
    if data[:4] == b"\x7fELF":
        return "an ELF file (Linux), not Mach-O"
    if magic != MH_MAGIC_64:
        return f"not a 64-bit Mach-O file (magic {magic:#010x})"
    if cputype != CPU_TYPE_ARM64:
        return f"a Mach-O file for CPU type {cputype:#x}, not arm64"
    if filetype != MH_EXECUTE:
        return f"a Mach-O arm64 file of type {filetype}, not an executable"
    return "darwin/arm64 executable"


def check_darwin_arm64(path: Path) -> None:
    """``UnavailableError`` unless ``path`` is a Mach-O arm64 executable."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEADER.size)
    except OSError as exc:
        raise UnavailableError(f"the macOS guest agent {path} cannot be read: {exc.strerror or exc}") from None
    kind = macho_kind(head)
    if kind != "darwin/arm64 executable":
        raise UnavailableError(
            f"the macOS guest agent {path} is {kind}; build it with GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 "
            "(see docs/drivers/macos_vm.md) and set agent_binary to it",
            details={"option": "agent_binary"},
        )
