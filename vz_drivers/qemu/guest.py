"""The qemu driver's guest builder, public for the other VM drivers (hyperv, vfkit): kernel and module lookup,
the initramfs (busybox, modules, the guest agent as init), cpio, the ext4 root disk and the guest config script.

Pure re-exports; the code lives in the qemu package's private modules.
"""

from __future__ import annotations

from vz_drivers.qemu._cpio import CpioEntry, write_cpio
from vz_drivers.qemu._disk import (
    create_root_disk,
    default_disk_size,
    find_mke2fs,
    install_root_disk,
    minimum_disk_size,
    root_disk_size,
    stage_root_disk,
    tree_usage,
    unstage_root_disk,
)
from vz_drivers.qemu._guestconfig import GuestConfig, GuestMount, env_list, hosts_file, render, resolv_file
from vz_drivers.qemu._initramfs import (
    AGENT_PORT_PREFIX,
    CONFIG_TAG,
    INIT_HOOK,
    INIT_SCRIPT,
    Initramfs,
    build_initramfs,
    find_busybox,
)
from vz_drivers.qemu._kernel import GUEST_MODULES, Kernel, extract_vmlinux, find_kernel, resolve_modules

__all__ = [
    "AGENT_PORT_PREFIX",
    "CONFIG_TAG",
    "GUEST_MODULES",
    "INIT_HOOK",
    "INIT_SCRIPT",
    "CpioEntry",
    "GuestConfig",
    "GuestMount",
    "Initramfs",
    "Kernel",
    "build_initramfs",
    "create_root_disk",
    "default_disk_size",
    "env_list",
    "extract_vmlinux",
    "find_busybox",
    "find_kernel",
    "find_mke2fs",
    "hosts_file",
    "install_root_disk",
    "minimum_disk_size",
    "render",
    "resolv_file",
    "resolve_modules",
    "root_disk_size",
    "stage_root_disk",
    "tree_usage",
    "unstage_root_disk",
    "write_cpio",
]
