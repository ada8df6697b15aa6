"""The hyperv form of the vz Linux guest (``vz guest build --format hyperv``): the shared initramfs with the
Hyper-V modules and the init's Hyper-V variant appended as a second archive, for a unified kernel image.

* **Modules**: the shared list plus FAT (the configuration lives on the EFI system partition) and the Hyper-V
  drivers (``hv_vmbus``, ``hv_storvsc`` + ``sd_mod``, ``hv_netvsc``, ``hv_utils`` for the shutdown integration
  service, ``hv_sock`` for AF_VSOCK over VMBus). The Hyper-V modules are loaded only when ``hv_vmbus`` loads,
  i.e. on Hyper-V; elsewhere (QEMU under OVMF) the same disk uses virtio.
* **Init**: the shared ``/init`` with the variant hook ``/etc/vz/init.sh`` (``INIT_HOOK``): ``vz_config_mount``
  mounts the ``vz-esp`` partition (found by GPT name) read-only instead of the 9p share, and Hyper-V variants
  of ``vz_root`` (the ``vz-root`` partition), ``vz_network`` (DHCP on the switch), ``vz_file`` (DHCP's
  resolv.conf) and ``vz_agent`` (the agent on AF_VSOCK port ``vz_vsock_port``, one session per connection) are
  defined. They come in a second cpio archive appended to the shared one (the kernel unpacks concatenated
  archives in order; later files replace earlier ones).
* **Shares**: the SMB client (``SMB_MODULES``) is in the initramfs, listed in ``/etc/vz/modules.smb``.
* **Shutdown**: Hyper-V's graceful ``Stop-VM`` makes ``hv_utils`` run ``/sbin/poweroff``; the overlay's
  ``/sbin/poweroff`` sends SIGTERM to PID 1, which is how the agent stops the main process and powers off.
"""

from __future__ import annotations

import io
from pathlib import Path

from vz_drivers._guest._cpio import CpioEntry, write_cpio
from vz_drivers._guest._efi import ESP_NAME, ROOT_NAME
from vz_drivers._guest._initramfs import INIT_HOOK, archive_bytes
from vz_drivers._guest._kernel import GUEST_MODULES, Kernel, resolve_modules

__all__ = [
    "BOOT_CMDLINE",
    "COMMON_MODULES",
    "HYPERV_MODULES",
    "SMB_MODULES",
    "hyperv_init",
    "hyperv_initrd",
    "overlay_archive",
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
		exec /sbin/vz-agent serve --listen "vsock:$VZ_VSOCK_PORT" --root /mnt/root --prepare-root --key-from-host "$@"
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


def hyperv_initrd(kernel: Kernel, busybox: Path, agent: Path) -> bytes:
    """The hyperv initramfs: the shared archive (with this form's modules) followed by the overlay."""
    data = archive_bytes(kernel, busybox, agent, COMMON_MODULES + HYPERV_MODULES + SMB_MODULES)
    data += b"\0" * (-len(data) % 512)
    return data + overlay_archive(kernel)
