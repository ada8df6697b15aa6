"""The guest side that can be checked on this host: the vz guest agent cross-compiles for linux/arm64.

vfkit on Apple silicon runs arm64 guests, so the agent (the guest's init) must build for linux/arm64 as a static
binary (CGO_ENABLED=0). The ELF header says what the binary is, without running it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from vz_drivers._agent import agent_source_digest, ensure_agent_binary

EM_AARCH64 = 183
EM_X86_64 = 62
PT_INTERP = 3
PT_DYNAMIC = 2


def _elf(path: Path) -> tuple[int, int, int, set[int]]:
    """(class, data, machine, program header types) of an ELF file."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF", f"{path} is not an ELF file"
    ei_class, ei_data = data[4], data[5]
    assert ei_class == 2 and ei_data == 1, "expected ELF64 little-endian"
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    e_phoff = struct.unpack_from("<Q", data, 32)[0]
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    types = {struct.unpack_from("<I", data, e_phoff + i * e_phentsize)[0] for i in range(e_phnum)}
    assert e_type == 2, "expected an executable (ET_EXEC)"
    return ei_class, ei_data, e_machine, types


@pytest.fixture(scope="module")
def arm64_agent() -> Path:
    # The shared agent cache: the binary is keyed by the digest of today's sources and linux/arm64, so a cached
    # one was built from exactly these sources.
    return ensure_agent_binary("arm64")


def test_the_agent_cross_compiles_to_a_static_aarch64_elf(arm64_agent: Path) -> None:
    _cls, _data, machine, types = _elf(arm64_agent)
    assert machine == EM_AARCH64
    assert PT_INTERP not in types and PT_DYNAMIC not in types  # static: no loader, no shared libraries


def test_the_arm64_build_is_its_own_artifact(arm64_agent: Path) -> None:
    assert agent_source_digest("arm64") != agent_source_digest("amd64")
    assert arm64_agent.parent.name == agent_source_digest("arm64")
    host = ensure_agent_binary("amd64")
    assert _elf(host)[2] == EM_X86_64
