"""The Machine's EFI boot disk: a unified kernel image, a GPT disk around it, and its VHDX form.

Boot chain (the same under Hyper-V Generation 2 firmware and under OVMF): the firmware's removable-media
fallback loads ``\\EFI\\BOOT\\BOOTX64.EFI`` from the EFI system partition. That file is a *unified kernel
image* (UKI): systemd's EFI stub (Debian ``systemd-boot-efi``: ``linuxx64.efi.stub``) with the stock kernel
(``.linux``), the vz initramfs (``.initrd``) and the kernel command line (``.cmdline``) added as PE sections.
The stub hands the kernel its command line and the initramfs (LoadFile2 initrd protocol), so no boot loader,
no EFI shell (Hyper-V has none: a ``startup.nsh`` would never run there) and no NVRAM boot entry is needed.
The image is unsigned: Secure Boot stays off unless the operator signs it (see docs/drivers/hyperv.md).

Nothing here needs root, a loop device or a mount: the FAT file system is made and filled with mtools
(``mformat``/``mmd``/``mcopy`` on an image file), the root ext4 is written from the image layers by ``mke2fs``
and ``debugfs`` (the shared guest builder), and the GPT (protective MBR, header, entries, backup) is written by
``write_gpt`` below, byte for byte after the UEFI specification (chapter 5). The raw disk is converted with
``qemu-img convert -O vhdx``.

Partitions are found in the guest by GPT name (``PARTNAME`` in sysfs), not by device name: ``vz-esp`` and
``vz-root`` are ``/dev/sda1``/``sda2`` under Hyper-V (storvsc) and ``/dev/vda1``/``vda2`` under QEMU.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import struct
import tempfile
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from vz_core.errors import RuntimeFailureError, UnavailableError

__all__ = [
    "ESP_NAME",
    "ESP_TYPE",
    "LINUX_TYPE",
    "ROOT_NAME",
    "BootTools",
    "Partition",
    "assemble_disk",
    "build_uki",
    "find_boot_tools",
    "make_esp",
    "to_vhdx",
    "write_gpt",
]

SECTOR = 512
ESP_TYPE = uuid.UUID("c12a7328-f81f-11d2-ba4b-00a0c93ec93b")
LINUX_TYPE = uuid.UUID("0fc63daf-8483-4772-8e79-3d69d8477de4")
ESP_NAME = "vz-esp"
ROOT_NAME = "vz-root"
_ALIGN = 1024 * 1024
_ENTRIES = 128
_ENTRY_SIZE = 128
_ENTRY_SECTORS = _ENTRIES * _ENTRY_SIZE // SECTOR
TOOLS_HINT = (
    "the hyperv guest disk is built with mtools and qemu-img (Debian/Ubuntu: `apt-get install mtools qemu-utils`; "
    "Windows: their native builds on PATH), a guest bundle's unified kernel image also with objcopy (binutils)"
)


@dataclass(frozen=True)
class BootTools:
    mformat: str
    mmd: str
    mcopy: str
    qemu_img: str
    objcopy: str = ""
    stub: Path | None = None
    """systemd's EFI stub, only where unified kernel images are built (``vz guest build``, from its pinned
    package): a driver boots the bundle's image and needs neither objcopy nor a stub."""


def find_boot_tools(stub: Path | None = None) -> BootTools:
    """The tools the boot disk needs (with ``stub``: also those a unified kernel image needs); ``UnavailableError``
    naming what is missing and how to install it."""
    found: dict[str, str] = {}
    missing = []
    for tool in ("mformat", "mmd", "mcopy", "qemu-img", *(("objcopy",) if stub is not None else ())):
        path = shutil.which(tool)
        if path is None:
            missing.append(tool)
        else:
            found[tool] = path
    if stub is not None and not stub.is_file():
        missing.append(f"EFI stub {stub}")
    if missing:
        raise UnavailableError(f"{', '.join(missing)} missing: {TOOLS_HINT}")
    return BootTools(
        mformat=found["mformat"],
        mmd=found["mmd"],
        mcopy=found["mcopy"],
        qemu_img=found["qemu-img"],
        objcopy=found.get("objcopy", ""),
        stub=stub,
    )


async def _run(argv: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env) if env is not None else None,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        message = (err or out).decode(errors="replace").strip()
        raise RuntimeFailureError(
            f"{what} failed: {message.splitlines()[-1] if message else f'exit {proc.returncode}'}",
            runtime_message=message[-4000:],
        )


# ---------------------------------------------------------------------------------------------- the UKI


def _pe_layout(stub: bytes) -> tuple[int, int, int]:
    """(image base, end of the last section's virtual range, section alignment) of a PE32+ image."""
    if stub[:2] != b"MZ":
        raise UnavailableError("the EFI stub is not a PE image")
    (pe,) = struct.unpack_from("<I", stub, 0x3C)
    if stub[pe : pe + 4] != b"PE\0\0":
        raise UnavailableError("the EFI stub is not a PE image")
    nsections, opt_size = struct.unpack_from("<H12xH", stub, pe + 6)
    opt = pe + 24
    if struct.unpack_from("<H", stub, opt)[0] != 0x20B:
        raise UnavailableError("the EFI stub is not a PE32+ (x86-64) image")
    (image_base,) = struct.unpack_from("<Q", stub, opt + 24)
    (alignment,) = struct.unpack_from("<I", stub, opt + 32)
    end = 0
    for i in range(nsections):
        vsize, vaddr = struct.unpack_from("<II", stub, opt + opt_size + i * 40 + 8)
        end = max(end, vaddr + vsize)
    return image_base, end, alignment


async def build_uki(tools: BootTools, kernel: Path, initrd: bytes, cmdline: str, cache: Path) -> Path:
    """The unified kernel image for ``kernel`` + ``initrd`` + ``cmdline``, cached by the digest of all three."""
    if tools.stub is None or not tools.objcopy:
        raise UnavailableError(f"building a unified kernel image needs objcopy and an EFI stub: {TOOLS_HINT}")
    stub_path = tools.stub
    stub, kernel_bytes = await asyncio.to_thread(lambda: (stub_path.read_bytes(), kernel.read_bytes()))
    digest = hashlib.sha256()
    for part in (stub, kernel_bytes, initrd, cmdline.encode()):
        digest.update(hashlib.sha256(part).digest())
    target = cache / digest.hexdigest() / "BOOTX64.EFI"
    if await asyncio.to_thread(target.is_file):
        return target
    await asyncio.to_thread(lambda: target.parent.mkdir(parents=True, exist_ok=True))
    image_base, end, alignment = _pe_layout(stub)
    align = max(alignment, 0x1000)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        work = Path(tmp)
        sections = [
            (".osrel", b"ID=vz\nNAME=vz guest\n"),
            (".cmdline", cmdline.encode() + b"\0"),
            (".initrd", initrd),
            (".linux", kernel_bytes),  # last: newer stubs expect the kernel after every other section
        ]
        argv = [tools.objcopy]
        offset = (end + align - 1) // align * align
        for name, data in sections:
            path = work / name.lstrip(".")
            path.write_bytes(data)
            argv += [
                "--add-section",
                f"{name}={path}",
                "--set-section-flags",
                f"{name}=data,readonly",
                "--change-section-vma",
                f"{name}={image_base + offset:#x}",
            ]
            offset += (len(data) + align - 1) // align * align
        out = work / "uki.efi"
        await _run([*argv, str(stub_path), str(out)], "objcopy (building the unified kernel image)")
        os.replace(out, target)
    return target


# ---------------------------------------------------------------------------------------------- FAT


def _sized_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


async def make_esp(tools: BootTools, target: Path, size: int, files: Mapping[str, Path]) -> None:
    """A FAT32 EFI system partition image of ``size`` bytes holding ``files`` (FAT path -> host file)."""
    await asyncio.to_thread(_sized_file, target, size)
    env = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}
    image = str(target)
    await _run(
        [
            tools.mformat,
            "-i",
            image,
            "-F",
            "-v",
            "VZ-ESP",
            "-N",
            "565a4553",
            "-T",
            str(size // SECTOR),
            "-h",
            "64",
            "-s",
            "32",
            "::",
        ],
        "mformat (the EFI system partition)",
        env,
    )
    made: set[str] = set()
    for fat_path in sorted(files):
        parts = fat_path.strip("/").split("/")
        for depth in range(1, len(parts)):
            d = "/".join(parts[:depth])
            if d not in made:
                await _run([tools.mmd, "-i", image, f"::/{d}"], f"mmd {d}", env)
                made.add(d)
        await _run([tools.mcopy, "-i", image, "-m", str(files[fat_path]), f"::/{'/'.join(parts)}"], "mcopy", env)


# ---------------------------------------------------------------------------------------------- GPT


@dataclass(frozen=True)
class Partition:
    name: str
    type_guid: uuid.UUID
    guid: uuid.UUID
    first_lba: int
    last_lba: int


def _header(disk_guid: uuid.UUID, current: int, backup: int, entries_lba: int, last_usable: int, crc: int) -> bytes:
    fields = struct.pack(
        "<8sIIIIQQQQ16sQIII",
        b"EFI PART",
        0x00010000,
        92,
        0,
        0,
        current,
        backup,
        34,
        last_usable,
        disk_guid.bytes_le,
        entries_lba,
        _ENTRIES,
        _ENTRY_SIZE,
        crc,
    )
    with_crc = fields[:16] + struct.pack("<I", zlib.crc32(fields)) + fields[20:]
    return with_crc.ljust(SECTOR, b"\0")


def write_gpt(out: BinaryIO, size: int, disk_guid: uuid.UUID, partitions: Sequence[Partition]) -> None:
    """Write a protective MBR, the primary and the backup GPT of a ``size``-byte disk to ``out``."""
    sectors = size // SECTOR
    last_usable = sectors - 1 - 1 - _ENTRY_SECTORS
    entries = bytearray(_ENTRIES * _ENTRY_SIZE)
    for i, p in enumerate(partitions):
        if not 34 <= p.first_lba <= p.last_lba <= last_usable:
            raise ValueError(f"partition {p.name} ({p.first_lba}..{p.last_lba}) outside the usable range")
        name = p.name.encode("utf-16-le")[:72]
        struct.pack_into(
            "<16s16sQQQ72s",
            entries,
            i * _ENTRY_SIZE,
            p.type_guid.bytes_le,
            p.guid.bytes_le,
            p.first_lba,
            p.last_lba,
            0,
            name,
        )
    entries_crc = zlib.crc32(bytes(entries))
    mbr = bytearray(SECTOR)
    # One partition of type 0xEE covering the disk (capped at 2^32-1 sectors), so MBR tools leave it alone.
    struct.pack_into("<8BII", mbr, 446, 0, 0, 2, 0, 0xEE, 0xFF, 0xFF, 0xFF, 1, min(sectors - 1, 0xFFFFFFFF))
    mbr[510:512] = b"\x55\xaa"
    primary = _header(disk_guid, 1, sectors - 1, 2, last_usable, entries_crc)
    backup = _header(disk_guid, sectors - 1, 1, sectors - 1 - _ENTRY_SECTORS, last_usable, entries_crc)
    out.seek(0)
    out.write(bytes(mbr) + primary + bytes(entries))
    out.seek((sectors - 1 - _ENTRY_SECTORS) * SECTOR)
    out.write(bytes(entries) + backup)


def _data_ranges(f: BinaryIO, size: int) -> list[tuple[int, int]]:
    """Where a file has data (SEEK_DATA/SEEK_HOLE where the system has them; else: all of it)."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return [(0, size)]
    ranges, pos = [], 0
    try:
        while pos < size:
            start = os.lseek(f.fileno(), pos, seek_data)
            pos = os.lseek(f.fileno(), start, seek_hole)
            ranges.append((start, pos))
    except OSError:  # ENXIO: no data after pos
        pass
    return ranges


def _copy_into(src: Path, out: BinaryIO, offset: int) -> None:
    """Copy ``src`` into ``out`` at ``offset``, only its data (the holes of a sparse image stay holes)."""
    with open(src, "rb") as f:
        for start, stop in _data_ranges(f, os.fstat(f.fileno()).st_size):
            f.seek(start)
            while start < stop:
                chunk = f.read(min(stop - start, 4 << 20))
                if not chunk:
                    break
                if chunk.count(0) != len(chunk):
                    out.seek(offset + start)
                    out.write(chunk)
                start += len(chunk)


def assemble_disk(target: Path, esp: Path, root: Path, *, seed: str) -> tuple[Partition, Partition]:
    """Write the raw boot disk ``target``: GPT, ``esp`` as partition 1, ``root`` as partition 2.

    GUIDs derive from ``seed`` (the Machine's key), so the same inputs give the same disk."""
    esp_size = esp.stat().st_size
    root_size = root.stat().st_size
    first = _ALIGN // SECTOR
    esp_part = Partition(ESP_NAME, ESP_TYPE, _guid(seed, "esp"), first, first + esp_size // SECTOR - 1)
    root_first = (esp_part.last_lba + 1 + first - 1) // first * first
    root_part = Partition(ROOT_NAME, LINUX_TYPE, _guid(seed, "root"), root_first, root_first + root_size // SECTOR - 1)
    size = (root_part.last_lba + 1) * SECTOR + _ALIGN
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.truncate(size)
            write_gpt(out, size, _guid(seed, "disk"), (esp_part, root_part))
            _copy_into(esp, out, esp_part.first_lba * SECTOR)
            _copy_into(root, out, root_part.first_lba * SECTOR)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        raise
    return esp_part, root_part


def _guid(seed: str, what: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"vz:hyperv:{seed}:{what}")


async def to_vhdx(tools: BootTools, raw: Path, target: Path) -> None:
    """Convert the raw disk to a dynamic VHDX (what Generation 2 VMs boot from)."""
    await asyncio.to_thread(target.unlink, missing_ok=True)
    await _run(
        [tools.qemu_img, "convert", "-q", "-f", "raw", "-O", "vhdx", "-o", "subformat=dynamic", str(raw), str(target)],
        "qemu-img convert -O vhdx",
    )
