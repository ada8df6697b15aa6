"""The host side of the vfkit guest: its root disk and its configuration script.

The guest is the vz Linux guest (kernel + initramfs with the agent as init) built for the host's architecture.
Its init reads ``config.sh`` from the virtio-fs share ``vzcfg``: a list of calls to the init's functions with
every argument quoted for the shell. The vfkit flavour differs from qemu's only in its transports: shares are
virtio-fs (``vz_virtiofs TAG TARGET ro|rw``: read-only is the guest's ``-o ro``, the host shares read-write), and
the agent serves AF_VSOCK port 1024 and reports ready on host port 1025 (``vz_agent_vsock``). The script holds
the Machine's environment (secrets): it is written 0600 into the Machine's private directory and never appears
on vfkit's command line.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vz_core.errors import RuntimeFailureError, UnavailableError
from vz_drivers.vfkit._cmdline import AGENT_VSOCK_PORT, READY_VSOCK_PORT

__all__ = [
    "CONFIG_TAG",
    "GUEST_MODULES",
    "GuestConfig",
    "GuestMount",
    "create_root_disk",
    "disk_size",
    "env_list",
    "find_mke2fs",
    "render",
]

CONFIG_TAG = "vzcfg"
GUEST_MODULES: tuple[str, ...] = (
    "virtio_pci",
    "virtio_mmio",
    "virtio_console",  # hvc0: vfkit's virtio-serial console
    "virtio_blk",  # the raw root disk
    "virtio_net",
    "crc32c_generic",  # ext4/jbd2 checksums ask the crypto layer for "crc32c" at mount time
    "ext4",
    "virtiofs",  # the configuration share, the workspace, bind mounts, volumes, Rosetta
    "vmw_vsock_virtio_transport",  # the agent and the readiness report
)
"""Kernel modules the vfkit guest's initramfs loads (when not built in), by module name."""
ROOT_DEVICE = "/dev/vda"
LOG_PATH = "/run/vz/main.log"
MKE2FS_HINT = "install e2fsprogs (macOS: `brew install e2fsprogs`; Debian: `apt-get install e2fsprogs`)"
_MKE2FS_CANDIDATES = ("/opt/homebrew/opt/e2fsprogs/sbin/mke2fs", "/usr/local/opt/e2fsprogs/sbin/mke2fs")
_MIN_DISK = 2 * 1024**3
_MIB = 1024 * 1024


@dataclass(frozen=True)
class GuestMount:
    """A mount inside the guest root: a virtio-fs share (``tag``) or a tmpfs (``tag`` empty)."""

    target: str
    tag: str = ""
    read_only: bool = False
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class GuestConfig:
    hostname: str
    mounts: tuple[GuestMount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    user: str = ""
    workdir: str = "/"
    stop_timeout: float = 10.0
    rosetta_tag: str = ""
    network: bool = True


def _call(*words: str) -> str:
    return " ".join(shlex.quote(w) if i else w for i, w in enumerate(words))


def render(config: GuestConfig) -> str:
    """The configuration script of one Machine for the vfkit guest."""
    lines = ["# vz Machine configuration for vfkit (generated; read by /init)", _call("vz_root", ROOT_DEVICE, "ext4")]
    lines.append(_call("vz_hostname", config.hostname))
    for mount in config.mounts:
        opts = ",".join(("ro" if mount.read_only else "rw", *mount.options))
        if mount.tag:
            lines.append(_call("vz_virtiofs", mount.tag, mount.target, opts))
        else:
            lines.append(_call("vz_tmpfs", mount.target, opts))
    if config.rosetta_tag:
        lines.append(_call("vz_rosetta", config.rosetta_tag))
    if config.network:
        lines.append("vz_network")
    lines.append(_call("vz_file", "/run/vz/cfg/hosts", "/etc/hosts"))
    if config.network:
        lines.append(_call("vz_file", "/run/vz/cfg/resolv.conf", "/etc/resolv.conf"))
    args: list[str] = [str(AGENT_VSOCK_PORT), str(READY_VSOCK_PORT)]
    for name, value in config.env.items():
        args += ["--env", f"{name}={value}"]
    args += ["--poweroff", "--init", "--log", LOG_PATH, "--stop-timeout", f"{max(config.stop_timeout, 0.0):.3f}s"]
    if config.user:
        args += ["--main-user", config.user]
    args += ["--main-workdir", config.workdir or "/"]
    if config.argv:
        args += ["--", *config.argv]
    lines.append(_call("vz_agent_vsock", *args))
    return "\n".join(lines) + "\n"


def env_list(image_env: Sequence[str], *layers: Mapping[str, str]) -> dict[str, str]:
    """The base environment of every command: the image's ``NAME=value`` entries, then each layer on top."""
    env = dict(item.split("=", 1) for item in image_env if "=" in item and not item.startswith("="))
    for layer in layers:
        env.update(layer)
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def find_mke2fs() -> str:
    found = shutil.which("mke2fs") or next((c for c in _MKE2FS_CANDIDATES if os.access(c, os.X_OK)), "")
    if not found:
        raise UnavailableError(f"mke2fs is missing (it builds the Machine's root disk); {MKE2FS_HINT}")
    return found


def disk_size(rootfs_bytes: int, requested: int = 0) -> int:
    """The root disk size: ``requested`` rounded to 4 KiB, else twice the image plus 1 GiB (at least 2 GiB)."""
    if requested:
        return requested // 4096 * 4096
    return max(_MIN_DISK, (2 * rootfs_bytes + 1024 * _MIB) // _MIB * _MIB)


def _sparse_file(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)


async def create_root_disk(rootfs: Path, disk: Path, size: int) -> None:
    """A sparse raw disk holding ``rootfs`` as ext4 (``mke2fs -d``: no loop device, no mount, no privilege)."""
    mke2fs = await asyncio.to_thread(find_mke2fs)
    await asyncio.to_thread(_sparse_file, disk, size)
    proc = await asyncio.create_subprocess_exec(
        mke2fs,
        "-q",
        "-F",
        "-t",
        "ext4",
        "-E",
        "root_owner=0:0",
        "-d",
        str(rootfs),
        str(disk),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        await asyncio.to_thread(disk.unlink, missing_ok=True)
        raise RuntimeFailureError(
            f"building the root disk failed (mke2fs exit {proc.returncode})",
            runtime_message=(err or out).decode(errors="replace")[-4000:],
        )
