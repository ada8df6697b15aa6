"""The vz Linux guest as a Hyper-V Machine: the guest bundle's unified kernel image on the Machine's EFI disk.

The guest is the shared vz Linux guest in its hyperv form (``vz_drivers._guest``: ``vz guest build --arch amd64
--format hyperv``): a unified kernel image with the stock kernel, the initramfs (busybox, the Hyper-V and SMB
modules, the agent as init, the init's Hyper-V variant) and the kernel command line, verified against its
bundle's manifest before use. What this module adds per Machine:

* **Configuration**: the shared ``config.sh`` preceded by the agent's vsock port (``render_config``).
* **Disk**: ESP (FAT32: ``\\EFI\\BOOT\\BOOTX64.EFI`` = the bundle's unified kernel image, ``config.sh``,
  ``hosts``, ``resolv.conf``) + root (ext4) in one GPT disk, then VHDX (``vz_drivers._guest``'s EFI tools).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vz_drivers._guest import (
    BootTools,
    GuestConfig,
    assemble_disk,
    create_root_disk,
    hosts_file,
    make_esp,
    render,
    resolv_file,
)

__all__ = ["BootImage", "build_boot_disk", "render_config"]

ESP_MIN_BYTES = 64 * 1024 * 1024
_MIB = 1024 * 1024


@dataclass(frozen=True)
class BootImage:
    """The unified kernel image every Machine of this host boots (kernel + initramfs + command line)."""

    path: Path
    initramfs_digest: str


def render_config(config: GuestConfig, *, vsock_port: int) -> str:
    """The Machine's ``config.sh``: qemu's configuration, preceded by the agent's vsock port."""
    head = f"# vz hyperv Machine: the agent's AF_VSOCK port (Hyper-V socket service {vsock_port:08x}-facb-...)\n"
    return head + f"vz_vsock_port {int(vsock_port)}\n" + str(render(config))


def esp_size(uki: Path) -> int:
    need = uki.stat().st_size * 3 // 2 + 16 * _MIB
    return max(ESP_MIN_BYTES, (need + _MIB - 1) // _MIB * _MIB)


async def build_boot_disk(
    tools: BootTools,
    *,
    uki: Path,
    config: str,
    hostname: str,
    layers: Sequence[tuple[str, Path]],
    root_bytes: int,
    image: str,
    work: Path,
    target: Path,
    seed: str,
) -> None:
    """Write the raw boot disk ``target`` (GPT: ESP with the UKI and the configuration, ext4 root).

    ``work`` is a private directory (the configuration holds the Machine's secrets: files are 0600)."""
    files: dict[str, Path] = {"EFI/BOOT/BOOTX64.EFI": uki}
    contents: Mapping[str, str] = {"config.sh": config, "hosts": hosts_file(hostname), "resolv.conf": resolv_file()}
    for name, text in contents.items():
        path = work / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        files[name] = path
    esp = work / "esp.img"
    root = work / "root.img"
    try:
        await make_esp(tools, esp, esp_size(uki), files)
        await create_root_disk(layers, root, root_bytes, image=image)
        await asyncio.to_thread(assemble_disk, target, esp, root, seed=seed)
    finally:
        for path in (esp, root, *(work / n for n in contents)):
            path.unlink(missing_ok=True)
