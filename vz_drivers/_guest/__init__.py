"""The vz Linux guest every VM driver boots (qemu, vfkit, hyperv): one builder below the drivers.

* **Kernel** (``_kernel``): finding a kernel and its module tree, resolving the modules the guest init needs
  (dependencies first, built-ins skipped), stripping module signatures, extracting the ELF ``vmlinux`` QEMU
  boots directly.
* **Initramfs** (``_initramfs``, ``_cpio``): the deterministic archive with busybox, the modules, the guest agent
  and ``/init`` (``INIT_SCRIPT``; a variant adds functions in ``INIT_HOOK``).
* **Configuration** (``_guestconfig``): the Machine's ``config.sh`` the init runs, with every value quoted.
* **Root disk** (``_disk``): the image's root filesystem as ext4, sized, staged and installed.
* **EFI disks** (``_efi``, ``_hyperv``): unified kernel images, FAT without mounts, GPT, VHDX; the hyperv
  form's initramfs overlay.
* **Bundles** (``_bundle``): the guest built from pinned Debian packages with a manifest of digests, for hosts
  without a Linux system (vfkit, hyperv), verified and cached by digest before use.

The drivers use these public names only (``from vz_drivers._guest import ...``); each adds its own transports.
"""

from __future__ import annotations

from vz_drivers._guest._bundle import (
    ARCHES,
    FORMATS,
    MANIFEST,
    PINS,
    SUMS,
    VFKIT_MODULES,
    Bundle,
    Pin,
    build_bundle,
    bundle_cache,
    check_bundle_options,
    fetch_release,
    open_bundle,
    release_asset,
    verify_bundle,
    write_bundle,
)
from vz_drivers._guest._cpio import CpioEntry, write_cpio
from vz_drivers._guest._disk import (
    DEFAULT_MIN_DISK,
    MKE2FS_HINT,
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
from vz_drivers._guest._efi import (
    ESP_NAME,
    ESP_TYPE,
    LINUX_TYPE,
    ROOT_NAME,
    BootTools,
    Partition,
    assemble_disk,
    build_uki,
    find_boot_tools,
    make_esp,
    to_vhdx,
    write_gpt,
)
from vz_drivers._guest._guestconfig import (
    LOG_PATH,
    GuestConfig,
    GuestMount,
    env_list,
    hosts_file,
    render,
    resolv_file,
)
from vz_drivers._guest._hyperv import (
    BOOT_CMDLINE,
    COMMON_MODULES,
    HYPERV_MODULES,
    SMB_MODULES,
    hyperv_init,
    hyperv_initrd,
    overlay_archive,
)
from vz_drivers._guest._initramfs import (
    AGENT_PORT_PREFIX,
    CONFIG_TAG,
    DHCP_SCRIPT,
    GUEST_BUSYBOX,
    INIT_HOOK,
    INIT_SCRIPT,
    Initramfs,
    archive_bytes,
    build_initramfs,
    find_busybox,
)
from vz_drivers._guest._kernel import (
    GUEST_MODULES,
    Kernel,
    KernelModule,
    bzimage_release,
    decompress_kernel,
    extract_vmlinux,
    find_kernel,
    has_pvh_entry,
    resolve_modules,
    strip_module_signature,
)

__all__ = [
    "AGENT_PORT_PREFIX",
    "ARCHES",
    "BOOT_CMDLINE",
    "COMMON_MODULES",
    "CONFIG_TAG",
    "DEFAULT_MIN_DISK",
    "DHCP_SCRIPT",
    "ESP_NAME",
    "ESP_TYPE",
    "FORMATS",
    "GUEST_BUSYBOX",
    "GUEST_MODULES",
    "HYPERV_MODULES",
    "INIT_HOOK",
    "INIT_SCRIPT",
    "LINUX_TYPE",
    "LOG_PATH",
    "MANIFEST",
    "MKE2FS_HINT",
    "PINS",
    "ROOT_NAME",
    "SMB_MODULES",
    "SUMS",
    "VFKIT_MODULES",
    "BootTools",
    "Bundle",
    "CpioEntry",
    "GuestConfig",
    "GuestMount",
    "Initramfs",
    "Kernel",
    "KernelModule",
    "Partition",
    "Pin",
    "archive_bytes",
    "assemble_disk",
    "build_bundle",
    "build_initramfs",
    "build_uki",
    "bundle_cache",
    "bzimage_release",
    "check_bundle_options",
    "create_root_disk",
    "decompress_kernel",
    "default_disk_size",
    "env_list",
    "extract_vmlinux",
    "fetch_release",
    "find_boot_tools",
    "find_busybox",
    "find_kernel",
    "find_mke2fs",
    "has_pvh_entry",
    "hosts_file",
    "hyperv_init",
    "hyperv_initrd",
    "install_root_disk",
    "make_esp",
    "minimum_disk_size",
    "open_bundle",
    "overlay_archive",
    "release_asset",
    "render",
    "resolv_file",
    "resolve_modules",
    "root_disk_size",
    "stage_root_disk",
    "strip_module_signature",
    "to_vhdx",
    "tree_usage",
    "unstage_root_disk",
    "verify_bundle",
    "write_bundle",
    "write_cpio",
    "write_gpt",
]
