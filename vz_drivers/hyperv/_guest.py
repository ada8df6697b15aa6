"""The vz Linux guest as a Hyper-V Machine: the shared guest builder plus what an EFI disk and Hyper-V need.

The guest is the one every VM driver shares (``vz_drivers._guest``): the stock kernel, the deterministic
initramfs with busybox and the guest agent as init, the image's root filesystem as ext4, and the
configuration script the init runs. What differs here:

* **Modules**: qemu's list plus FAT (the configuration lives on the EFI system partition) and the Hyper-V
  drivers (``hv_vmbus``, ``hv_storvsc`` + ``sd_mod``, ``hv_netvsc``, ``hv_utils`` for the shutdown integration
  service, ``hv_sock`` for AF_VSOCK over VMBus). The Hyper-V modules are loaded only when ``hv_vmbus`` loads,
  i.e. on Hyper-V; elsewhere (QEMU under OVMF) the same disk uses virtio.
* **Init**: the shared ``/init`` with the variant hook ``/etc/vz/init.sh`` (``INIT_HOOK``): ``vz_config_mount``
  mounts the ``vz-esp`` partition (found by GPT name) read-only instead of the 9p share, and Hyper-V variants
  of ``vz_root`` (the ``vz-root`` partition),
  ``vz_network`` (DHCP on the switch), ``vz_file`` (DHCP's resolv.conf) and ``vz_agent`` (the agent on
  AF_VSOCK port ``vz_vsock_port``, one session per connection) are defined. They come in a second cpio archive
  appended to qemu's (the kernel unpacks concatenated archives in order; later files replace earlier ones).
* **Shares**: the SMB client (``SMB_MODULES``) is in the initramfs, listed in ``/etc/vz/modules.smb``; the
  workspace and mounts are mounted through the agent after it answers (``vz_drivers.hyperv._shares``).
* **Shutdown**: Hyper-V's graceful ``Stop-VM`` makes ``hv_utils`` run ``/sbin/poweroff``; the overlay's
  ``/sbin/poweroff`` sends SIGTERM to PID 1, which is how the agent stops the main process and powers off.
* **Disk**: ESP (FAT32: ``\\EFI\\BOOT\\BOOTX64.EFI`` = the unified kernel image, ``config.sh``, ``hosts``,
  ``resolv.conf``) + root (ext4) in one GPT disk, then VHDX (``vz_drivers.hyperv._efi``).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vz_drivers._guest import (
    GUEST_MODULES,
    INIT_HOOK,
    CpioEntry,
    GuestConfig,
    Kernel,
    build_initramfs,
    create_root_disk,
    hosts_file,
    render,
    resolv_file,
    resolve_modules,
    write_cpio,
)
from vz_drivers.hyperv._efi import ESP_NAME, ROOT_NAME, BootTools, assemble_disk, build_uki, make_esp

__all__ = [
    "BOOT_CMDLINE",
    "COMMON_MODULES",
    "HYPERV_MODULES",
    "SMB_MODULES",
    "BootImage",
    "build_boot_disk",
    "build_boot_image",
    "hyperv_init",
    "render_config",
]

FAT_MODULES: tuple[str, ...] = ("vfat", "nls_cp437", "nls_ascii", "nls_utf8")
COMMON_MODULES: tuple[str, ...] = GUEST_MODULES + FAT_MODULES
"""Loaded on every boot (before the configuration is read)."""
HYPERV_MODULES: tuple[str, ...] = ("hv_vmbus", "hv_storvsc", "sd_mod", "hv_netvsc", "hv_utils", "hv_sock")
"""Loaded when ``hv_vmbus`` loads (on Hyper-V only: elsewhere it refuses with ENODEV)."""
SMB_MODULES: tuple[str, ...] = ("cifs", "gcm", "ccm", "ctr", "ghash-generic", "cmac", "sha512_generic", "ecb")
"""The SMB client (Debian builds ``cifs`` as a module, with netfs, fscache, dns_resolver, cifs_arc4 and cifs_md4 as
its dependencies) and the crypto its ``softdep`` names that Debian builds as modules: AES-GCM/CCM for SMB 3.1.1
encryption (``seal``), AES-CMAC for signing, SHA-512 for the pre-authentication integrity hash. They are in the
initramfs (the kernel's own ``request_module`` finds no modprobe there) and loaded by the first share mount of a
boot (``vz_drivers.hyperv._shares``), not at every boot."""
BOOT_CMDLINE = "console=tty0 console=ttyS0,115200 quiet panic=-1 no_timer_check cryptomgr.notests"
"""The kernel command line inside the unified kernel image (ttyS0 last: /dev/console is the serial port,
COM1 under Hyper-V, the console log under QEMU). ``no_timer_check`` skips the boot-time IO-APIC timer test, which
a virtual CPU the host does not run for a moment fails (the kernel then panics)."""
ESP_MIN_BYTES = 64 * 1024 * 1024
_MIB = 1024 * 1024


_HYPERV_PART = r"""# hyperv: the configuration is on the boot disk's EFI system partition; Hyper-V devices on Hyper-V.
# vz_partition NAME: the block device of the GPT partition named NAME (storvsc probes asynchronously).
vz_partition() {
	for _ in $($bb seq 1000); do
		u=$($bb grep -lx "PARTNAME=$1" /sys/class/block/*/uevent 2>/dev/null | $bb head -n 1)
		if [ -n "$u" ]; then
			u=${u%/uevent}
			echo "/dev/${u##*/}"
			return 0
		fi
		$bb usleep 10000
	done
	return 1
}
VZ_HYPERV=
if $bb modprobe hv_vmbus 2>/dev/null; then
	VZ_HYPERV=1
	$bb modprobe -a $($bb cat /etc/vz/modules.hyperv) || die "loading the Hyper-V modules failed"
fi
vz_config_mount() {
	esp=$(vz_partition @ESP@) || die "the EFI system partition (@ESP@) did not appear"
	$bb mount -t vfat -o ro,fmask=0177,dmask=0077 "$esp" /run/vz/cfg || die "cannot mount the EFI system partition $esp"
}
VZ_VSOCK_PORT=
vz_vsock_port() {
	VZ_VSOCK_PORT=$1
}
vz_root() {
	dev=$(vz_partition @ROOT@) || die "the root partition (@ROOT@) did not appear"
	$bb mount -t "$2" -o rw,noatime "$dev" /mnt/root || die "cannot mount the root partition $dev ($2)"
}
if [ -n "$VZ_HYPERV" ]; then
	vz_network() {
		$bb ip link set lo up
		if [ -e /sys/class/net/eth0 ]; then
			$bb ip link set eth0 up
			$bb udhcpc -i eth0 -q -n -t 10 -s /etc/vz/dhcp.sh >/dev/null 2>&1 || echo "vz: no DHCP answer on eth0"
		fi
	}
	vz_file() {
		src=$1
		[ "$2" = /etc/resolv.conf ] && [ -s /run/vz/resolv.conf ] && src=/run/vz/resolv.conf
		if [ -f "/mnt/root$2" ] && [ ! -L "/mnt/root$2" ]; then
			$bb mount --bind "$src" "/mnt/root$2" || die "cannot bind $2"
		fi
	}
	vz_session_agent() {
		:
	}
	vz_agent() {
		[ -n "$VZ_VSOCK_PORT" ] || die "the configuration names no vsock port"
		shift
		cd /
		exec /sbin/vz-agent serve --listen "vsock:$VZ_VSOCK_PORT" --root /mnt/root --prepare-root "$@"
	}
fi
"""

_POWEROFF = (
    "#!/bin/busybox sh\n# Run by the kernel for Hyper-V's shutdown request: PID 1 (the agent) stops everything.\n"
)
_POWEROFF += "exec /bin/busybox kill -TERM 1\n"

_DHCP = r"""#!/bin/busybox sh
# udhcpc's event script: address, default route and DNS servers from the switch's DHCP server.
bb=/bin/busybox
case "$1" in
bound | renew)
	$bb ip addr flush dev "$interface"
	$bb ip addr add "$ip/${mask:-24}" dev "$interface"
	for r in $router; do
		$bb ip route add default via "$r" dev "$interface"
		break
	done
	: >/run/vz/resolv.conf
	for d in $dns; do
		echo "nameserver $d" >>/run/vz/resolv.conf
	done
	;;
esac
"""


def hyperv_init() -> str:
    """The hyperv variant of the shared guest init: ``/etc/vz/init.sh``, sourced by the init before the
    configuration is mounted (it redefines ``vz_config_mount``, ``vz_root`` and, on Hyper-V, the network,
    resolv.conf and agent functions)."""
    return _HYPERV_PART.replace("@ESP@", ESP_NAME).replace("@ROOT@", ROOT_NAME)


def _loaded_names(kernel: Kernel, wanted: tuple[str, ...]) -> list[str]:
    canonical = {w.replace("-", "_") for w in wanted}
    return [m.name for m in resolve_modules(kernel, wanted) if m.name in canonical]


def overlay_archive(kernel: Kernel) -> bytes:
    """The second cpio archive: the hyperv init, the module lists, /sbin/poweroff and the DHCP script."""
    entries = [
        CpioEntry.file(INIT_HOOK, hyperv_init().encode(), 0o644),
        CpioEntry.file("etc/vz/modules", (" ".join(_loaded_names(kernel, COMMON_MODULES)) + "\n").encode()),
        CpioEntry.file("etc/vz/modules.hyperv", (" ".join(_loaded_names(kernel, HYPERV_MODULES)) + "\n").encode()),
        CpioEntry.file("etc/vz/modules.smb", (" ".join(_loaded_names(kernel, SMB_MODULES)) + "\n").encode()),
        CpioEntry.file("etc/vz/dhcp.sh", _DHCP.encode(), 0o755),
        CpioEntry.file("sbin/poweroff", _POWEROFF.encode(), 0o755),
    ]
    out = io.BytesIO()
    write_cpio(out, entries)
    return out.getvalue()


@dataclass(frozen=True)
class BootImage:
    """The unified kernel image every Machine of this host boots (kernel + initramfs + command line)."""

    path: Path
    initramfs_digest: str


def build_boot_image_sync(kernel: Kernel, agent: Path, busybox: Path, cache: Path) -> bytes:
    """The initramfs bytes: qemu's archive (with this driver's modules) followed by the overlay."""
    base = build_initramfs(
        kernel, agent, cache / "initramfs", busybox=busybox, modules=COMMON_MODULES + HYPERV_MODULES + SMB_MODULES
    )
    data = base.path.read_bytes()
    data += b"\0" * (-len(data) % 512)
    return bytes(data + overlay_archive(kernel))


async def build_boot_image(tools: BootTools, kernel: Kernel, agent: Path, busybox: Path, cache: Path) -> BootImage:
    initrd = await asyncio.to_thread(build_boot_image_sync, kernel, agent, busybox, cache)
    uki = await build_uki(tools, kernel.image, initrd, BOOT_CMDLINE, cache / "uki")
    return BootImage(path=uki, initramfs_digest=hashlib.sha256(initrd).hexdigest())


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
