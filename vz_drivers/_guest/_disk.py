"""The root disk of a Machine: the image's layers written into a sparse ext4 image from their tar streams.

``vz_drivers._images._ext4`` merges the layers (OCI whiteouts) and has e2fsprogs (``mke2fs`` without ``-d``,
then ``debugfs -w``) write every entry as its tar header says, so the disk is the same whether vz runs as root
or not and whatever the host file system's case rules. No loop device, no mount and no privilege is involved.
The disk is the Machine's own storage (Machine-local files live there and survive Stop/Start); recreation
builds a new one from the image.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vz_drivers._images import E2FSPROGS_HINT, find_e2fs_tool, write_ext4
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
MKE2FS_HINT = E2FSPROGS_HINT
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
                if sys.platform == "win32":  # no st_blocks: the apparent size
                    total += st.st_size
                else:
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
    """mke2fs's path, after checking that debugfs (which writes the root disk's files) and e2fsck (which indexes
    its large directories) are there too."""
    find_e2fs_tool("debugfs")
    find_e2fs_tool("e2fsck")
    return find_e2fs_tool("mke2fs")


async def create_root_disk(layers: Sequence[tuple[str, Path]], target: Path, size: int, *, image: str) -> None:
    """Write an ext4 image of ``size`` bytes holding the image's ``(digest, blob path)`` layers, merged, to
    ``target`` (replaced if present), straight from their tar streams (``vz_drivers._images._ext4``): every
    entry's name, owner, mode, xattrs and device numbers are the image's, whoever runs vz and whatever the host
    file system's case rules.

    Raises ``InvalidArgumentError`` when the image's files cannot become an ext4 root filesystem of that size.
    """
    await asyncio.to_thread(write_ext4, layers, target, size, image=image)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def stage_root_disk(plan: MachinePlan[Any], staging: Path, size: int) -> None:
    """Build the planned Machine's root disk (``size`` bytes, from the image layers ``plan.staged["layers"]``) in
    the private ``staging`` directory; its path is ``plan.staged["disk"]`` (set first, so that
    ``unstage_root_disk`` finds a partial one)."""
    record = plan.record
    await asyncio.to_thread(staging.mkdir, parents=True, exist_ok=True, mode=0o700)
    disk = staging / f"{record.key}-{uuid.uuid4().hex[:8]}.img"
    plan.staged["disk"] = disk
    await create_root_disk(plan.staged["layers"], disk, size, image=record.image_ref)


def unstage_root_disk(plan: MachinePlan[Any]) -> None:
    """Remove a staged root disk that did not become a Machine's."""
    disk = plan.staged.get("disk")
    if disk is not None:
        _remove(disk)


def install_root_disk(plan: MachinePlan[Any], disk: Path, cfg: Path) -> None:
    """Move the staged root disk to the Machine's ``disk`` path and create its private ``cfg`` directory."""
    cfg.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.replace(plan.staged["disk"], disk)
