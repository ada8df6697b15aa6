"""The root disk of a Machine: the image's root filesystem copied into a sparse ext4 image by ``mke2fs -d``.

No loop device, no mount and no privilege is involved: e2fsprogs writes the filesystem straight into a file.
The disk is the Machine's own storage (Machine-local files live there and survive Stop/Start); recreation
builds a new one from the image.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from vz_core.errors import InvalidArgumentError, UnavailableError
from vz_drivers._machine import MachinePlan

__all__ = [
    "DEFAULT_MIN_DISK",
    "MKE2FS_HINT",
    "create_root_disk",
    "default_disk_size",
    "install_root_disk",
    "minimum_disk_size",
    "root_disk_size",
    "stage_root_disk",
    "tree_usage",
    "unstage_root_disk",
]

DEFAULT_MIN_DISK = 2 * 1024**3
MKE2FS_HINT = (
    "install e2fsprogs (Debian/Ubuntu: `apt-get install e2fsprogs`; macOS: `brew install e2fsprogs`), which "
    "provides mke2fs"
)
_MKE2FS_CANDIDATES = (
    "/sbin/mke2fs",
    "/usr/sbin/mke2fs",
    "/opt/homebrew/opt/e2fsprogs/sbin/mke2fs",  # Homebrew's keg-only e2fsprogs (Apple silicon, Intel)
    "/usr/local/opt/e2fsprogs/sbin/mke2fs",
)
_INODE_BYTES = 256
_MIB = 1024 * 1024


def tree_usage(root: Path) -> tuple[int, int]:
    """(bytes, inodes) a directory tree occupies, without following symlinks or leaving its filesystem."""
    total = 0
    inodes = 0
    dev = os.lstat(root).st_dev
    for dirpath, dirnames, filenames in os.walk(root):
        inodes += 1
        for name in filenames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                total += max(st.st_size, st.st_blocks * 512)
                inodes += 1
        kept = []
        for name in dirnames:
            with contextlib.suppress(OSError):
                if os.lstat(os.path.join(dirpath, name)).st_dev == dev:
                    kept.append(name)
        dirnames[:] = kept
        total += 4096
    return total, inodes


def minimum_disk_size(usage: tuple[int, int]) -> int:
    """The smallest disk that holds a tree of ``usage`` with ext4's metadata and a 16 MiB journal."""
    used, inodes = usage
    return int(used * 1.15) + inodes * (_INODE_BYTES + 64) + 64 * _MIB


def default_disk_size(usage: tuple[int, int]) -> int:
    """Room for the image and then some: at least 2 GiB, at least twice the image plus 1 GiB (sparse file)."""
    size = max(DEFAULT_MIN_DISK, 2 * minimum_disk_size(usage) + 1024 * _MIB)
    return (size + _MIB - 1) // _MIB * _MIB


def root_disk_size(usage: tuple[int, int], requested: int = 0) -> int:
    """The root disk size: ``requested`` (``storage_bytes``) rounded down to 4 KiB, else ``default_disk_size``."""
    if requested:
        return requested // 4096 * 4096
    return default_disk_size(usage)


def find_mke2fs() -> str:
    found = shutil.which("mke2fs") or next((p for p in _MKE2FS_CANDIDATES if os.access(p, os.X_OK)), "")
    if not found:
        raise UnavailableError(f"mke2fs is missing; {MKE2FS_HINT}")
    return found


async def create_root_disk(rootfs: Path, target: Path, size: int, *, image: str) -> None:
    """Write an ext4 image of ``size`` bytes holding ``rootfs`` to ``target`` (replaced if present).

    Raises ``InvalidArgumentError`` when the image's files cannot become an ext4 root filesystem of that size.
    """
    mke2fs = find_mke2fs()
    await asyncio.to_thread(_remove, target)
    size_k = size // 1024
    proc = await asyncio.create_subprocess_exec(
        mke2fs,
        "-q",
        "-F",
        "-t",
        "ext4",
        "-L",
        "vz-root",
        "-J",
        "size=16",
        "-E",
        "lazy_itable_init=1,lazy_journal_init=1",
        "-d",
        str(rootfs),
        str(target),
        f"{size_k}k",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        await asyncio.to_thread(_remove, target)
        message = (err or out).decode(errors="replace").strip()
        lines = [line for line in message.splitlines() if line and not line.startswith("Creating regular file")]
        raise InvalidArgumentError(
            f"image {image!r} cannot become a root disk of {size} bytes: {lines[-1] if lines else 'mke2fs failed'}",
            runtime_message=message[-2000:],
            details={"field": "image"},
        )


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def stage_root_disk(plan: MachinePlan[Any], staging: Path, size: int) -> None:
    """Build the planned Machine's root disk (``size`` bytes, from ``plan.staged["rootfs"]``) in the private
    ``staging`` directory; its path is ``plan.staged["disk"]`` (set first, so that ``unstage_root_disk`` finds a
    partial one)."""
    record = plan.record
    await asyncio.to_thread(staging.mkdir, parents=True, exist_ok=True, mode=0o700)
    disk = staging / f"{record.key}-{uuid.uuid4().hex[:8]}.img"
    plan.staged["disk"] = disk
    await create_root_disk(plan.staged["rootfs"], disk, size, image=record.image_ref)


def unstage_root_disk(plan: MachinePlan[Any]) -> None:
    """Remove a staged root disk that did not become a Machine's."""
    disk = plan.staged.get("disk")
    if disk is not None:
        _remove(disk)


def install_root_disk(plan: MachinePlan[Any], disk: Path, cfg: Path) -> None:
    """Move the staged root disk to the Machine's ``disk`` path and create its private ``cfg`` directory."""
    cfg.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.replace(plan.staged["disk"], disk)
