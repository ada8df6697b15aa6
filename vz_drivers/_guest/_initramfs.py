"""The initramfs vz boots every Machine with: busybox, the kernel modules the guest needs, the guest agent, /init.

It depends on nothing in the image. ``/init`` (a busybox shell script, ``INIT_SCRIPT``) loads the modules,
mounts the read-only 9p share ``vzcfg`` that carries the Machine's configuration (a shell script the host
writes with every value quoted, see ``vz_drivers._guest._guestconfig``), and runs it. The configuration mounts
the root disk (the image's root filesystem as ext4 on virtio-blk) at ``/mnt/root``, mounts shares and tmpfs
inside it, sets the hostname and the network, and finally replaces the shell with the guest agent as PID 1,
serving the host on a virtio-serial port and running every command chrooted into ``/mnt/root``.

Archives are deterministic (fixed order, owners and times) and cached by the SHA-256 of their bytes under
``<cache>/qemu/initramfs/<sha256>/initramfs.cpio``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import UnavailableError
from vz_drivers._guest._cpio import CpioEntry, write_cpio
from vz_drivers._guest._kernel import GUEST_MODULES, Kernel, resolve_modules, strip_module_signature

__all__ = [
    "AGENT_PORT_PREFIX",
    "CONFIG_TAG",
    "DHCP_SCRIPT",
    "GUEST_BUSYBOX",
    "INIT_HOOK",
    "INIT_SCRIPT",
    "Initramfs",
    "archive_bytes",
    "build_initramfs",
    "find_busybox",
]

CONFIG_TAG = "vzcfg"
"""Mount tag of the read-only 9p share holding the Machine's configuration script."""
AGENT_PORT_PREFIX = "vz.agent."
GUEST_BUSYBOX = "/bin/busybox"
"""Where the initramfs (every guest bundle's and the qemu driver's) holds its busybox, in the guest; an exec with
``root_override="/"`` runs it outside the image's root. Never a path of the host."""

INIT_HOOK = "etc/vz/init.sh"
"""Where a variant guest puts shell functions that add to or replace the init's (sourced before the configuration)."""
"""virtio-serial port names of the guest agent: ``vz.agent.0`` (PID 1), ``vz.agent.1`` ... (more sessions)."""
FORMAT_VERSION = "1"

INIT_SCRIPT = r"""#!/bin/busybox sh
# vz guest init. Runs from the initramfs as PID 1; prepares the Machine and becomes the guest agent.
# The Machine's configuration is a shell script on the read-only share "vzcfg" (9p under QEMU, virtio-fs named by
# vz.cfg=TAG on the kernel command line), written by the host with every value quoted. It calls the vz_*
# functions below in order and ends with vz_agent or vz_agent_vsock (which never return). A variant guest adds
# or redefines functions in /etc/vz/init.sh (sourced before the configuration share is mounted).
export PATH=/bin:/sbin
umask 022
bb=/bin/busybox

die() {
	echo "VZ-INIT-FAILED: $*"
	$bb sync
	$bb poweroff -f
	exit 1
}

$bb mount -t proc proc /proc
# Yama, where the guest kernel has it: no process may ptrace another (scope 3 also binds CAP_SYS_PTRACE and cannot
# be lowered until the VM reboots), so nothing of the Machine attaches to the agent (PID 1), reads or writes its
# memory (process_vm_*, /proc/1/mem) or takes its descriptors (pidfd_getfd). Set before any Machine process runs.
if [ -e /proc/sys/kernel/yama/ptrace_scope ]; then
	echo 3 >/proc/sys/kernel/yama/ptrace_scope || die "cannot set kernel.yama.ptrace_scope=3"
fi
$bb mount -t sysfs sysfs /sys
$bb mount -t devtmpfs devtmpfs /dev
$bb mkdir -p /run/vz/cfg /mnt/root /dev/pts /dev/shm
$bb mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
$bb mount -t tmpfs -o mode=1777,nosuid,nodev shm /dev/shm
$bb ln -sf /proc/self/fd /dev/fd
$bb ln -sf /proc/self/fd/0 /dev/stdin
$bb ln -sf /proc/self/fd/1 /dev/stdout
$bb ln -sf /proc/self/fd/2 /dev/stderr
if [ -s /etc/vz/modules ]; then
	$bb modprobe -a $($bb cat /etc/vz/modules) || die "loading the kernel modules failed"
fi

# vz_config_mount: the configuration share, read-only: the virtio-fs tag given as vz.cfg=TAG on the kernel
# command line (vfkit), else the 9p share "vzcfg" (QEMU).
vz_config_mount() {
	for word in $($bb cat /proc/cmdline); do
		case "$word" in
		vz.cfg=?*)
			$bb mount -t virtiofs -o ro "${word#vz.cfg=}" /run/vz/cfg
			return
			;;
		esac
	done
	$bb mount -t 9p -o trans=virtio,version=9p2000.L,ro vzcfg /run/vz/cfg
}

# vz_wait_block DEVICE: the disk appears when its driver probed it (synchronously in modprobe, normally).
vz_wait_block() {
	n=0
	while [ ! -b "$1" ]; do
		n=$((n + 1))
		[ $n -gt 200 ] && die "disk $1 did not appear"
		$bb usleep 10000
	done
}

# vz_root DEVICE FSTYPE: the Machine's root disk.
vz_root() {
	vz_wait_block "$1"
	$bb mount -t "$2" -o rw,noatime "$1" /mnt/root || die "cannot mount the root disk $1 ($2)"
}

# vz_share TAG TARGET ro|rw: a 9p share (workspace, bind mount, volume) at TARGET inside the root.
vz_share() {
	$bb mkdir -p "/mnt/root$2" || die "cannot create the mount point $2"
	$bb mount -t 9p -o "trans=virtio,version=9p2000.L,msize=262144,$3" "$1" "/mnt/root$2" \
		|| die "cannot mount share $1 at $2"
}

# vz_virtiofs TAG TARGET ro|rw[,OPTIONS]: a virtio-fs share at TARGET inside the root (read-only is enforced
# here: the host shares read-write).
vz_virtiofs() {
	$bb mkdir -p "/mnt/root$2" || die "cannot create the mount point $2"
	$bb mount -t virtiofs -o "$3" "$1" "/mnt/root$2" || die "cannot mount virtio-fs share $1 at $2"
}

# vz_rosetta TAG: Rosetta (Apple silicon hosts) from the virtio-fs share TAG, registered for x86_64 ELF binaries.
vz_rosetta() {
	$bb mkdir -p /run/vz/rosetta /proc/sys/fs/binfmt_misc
	$bb mount -t virtiofs -o ro "$1" /run/vz/rosetta || die "cannot mount the Rosetta share $1"
	[ -e /proc/sys/fs/binfmt_misc/register ] || $bb mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
	magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x3e\x00'
	mask='\xff\xff\xff\xff\xff\xfe\xfe\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
	echo ":rosetta:M::$magic:$mask:/run/vz/rosetta/rosetta:CF" >/proc/sys/fs/binfmt_misc/register \
		|| die "cannot register Rosetta with binfmt_misc"
}

# vz_tmpfs TARGET OPTIONS: an empty tmpfs at TARGET inside the root (empty again after every boot).
vz_tmpfs() {
	$bb mkdir -p "/mnt/root$1" || die "cannot create the mount point $1"
	$bb mount -t tmpfs -o "$2" tmpfs "/mnt/root$1" || die "cannot mount a tmpfs at $1"
}

# vz_hostname NAME
vz_hostname() {
	$bb hostname "$1"
}

# vz_network: loopback; then either the route-domain attachments named on the kernel command line (a version 2
# Machine: "vz.net=IFNAME,MAC,ADDRESS,GATEWAY,SUBNET" per interface, "vz.dns=SERVER", "vz.search=D1,D2") or eth0
# on QEMU user networking (10.0.2.0/24, gateway 10.0.2.2, DNS 10.0.2.3).
vz_network() {
	$bb ip link set lo up
	nets= dns= search=
	for word in $($bb cat /proc/cmdline); do
		case "$word" in
		vz.net=?*) nets="$nets ${word#vz.net=}" ;;
		vz.dns=?*) dns=${word#vz.dns=} ;;
		vz.search=?*) search=${word#vz.search=} ;;
		esac
	done
	if [ -z "$nets" ]; then
		if [ -e /sys/class/net/eth0 ]; then
			$bb ip link set eth0 up
			$bb ip addr add 10.0.2.15/24 dev eth0
			$bb ip route add default via 10.0.2.2
		fi
		return 0
	fi
	# First every attached interface (found by its MAC) under a temporary name, so that renaming to ethN
	# never collides with an interface that has yet to be renamed.
	i=0
	for net in $nets; do
		vz_net_claim "$(echo "$net" | $bb cut -d, -f2)" "vznet$i"
		i=$((i + 1))
	done
	i=0
	for net in $nets; do
		set -- $(echo "$net" | $bb tr , ' ')
		$bb ip link set "vznet$i" name "$1" || die "cannot name the interface $1"
		$bb ip link set "$1" up || die "cannot bring $1 up"
		$bb ip addr add "$3/32" dev "$1" || die "cannot give $1 the address $3"
		$bb ip route add "$4/32" dev "$1" scope link src "$3" || die "cannot route to the gateway $4"
		$bb ip route add "$5" via "$4" dev "$1" src "$3" || die "cannot route $5 via $4"
		if [ $i -eq 0 ]; then
			$bb ip route add default via "$4" dev "$1" src "$3" || die "cannot set the default route via $4"
		fi
		i=$((i + 1))
	done
	if [ -n "$dns" ]; then
		{
			echo "nameserver $dns"
			[ -n "$search" ] && echo "search $(echo "$search" | $bb tr , ' ')"
		} >/run/vz/resolv.conf
		vz_write_file /run/vz/resolv.conf /etc/resolv.conf
	fi
}

# vz_network_dhcp: loopback, then eth0 by DHCP, as a NAT that hands out addresses does (vfkit's, i.e.
# Virtualization.framework's): udhcpc's event script /etc/vz/dhcp.sh sets the address and the default route and
# writes /run/vz/resolv.conf. No lease is a failed boot that says so (never a Machine without network).
vz_network_dhcp() {
	$bb ip link set lo up
	n=0
	while [ ! -e /sys/class/net/eth0 ]; do
		n=$((n + 1))
		[ $n -gt 500 ] && die "no network interface eth0 appeared (the VM has no virtio-net device)"
		$bb usleep 10000
	done
	$bb ip link set eth0 up || die "cannot bring eth0 up"
	$bb udhcpc -i eth0 -f -q -n -t 10 -T 2 -s /etc/vz/dhcp.sh \
		|| die "no DHCP lease on eth0 after 10 requests: the VM's NAT network handed out no address"
	[ -s /run/vz/resolv.conf ] || die "the DHCP lease on eth0 named no DNS server"
}

# vz_net_claim MAC NAME: rename the interface with MAC (its driver may still be probing) to NAME.
vz_net_claim() {
	n=0
	while :; do
		for p in /sys/class/net/*; do
			if [ "$($bb cat "$p/address" 2>/dev/null)" = "$1" ]; then
				$bb ip link set "${p##*/}" name "$2" || die "cannot rename the interface with MAC $1"
				return 0
			fi
		done
		n=$((n + 1))
		[ $n -gt 500 ] && die "no network interface with MAC $1"
		$bb usleep 10000
	done
}

# vz_write_file SOURCE TARGET: SOURCE over TARGET inside the root: bound over a regular file (nothing of the
# image changes), otherwise written in place of a missing file or a link.
vz_write_file() {
	if [ -f "/mnt/root$2" ] && [ ! -L "/mnt/root$2" ]; then
		$bb mount --bind "$1" "/mnt/root$2" || die "cannot bind $2"
	else
		$bb mkdir -p "/mnt/root${2%/*}" && $bb rm -f "/mnt/root$2" && $bb cp "$1" "/mnt/root$2" \
			|| die "cannot write $2"
	fi
}

# vz_file SOURCE TARGET: bind a configuration file over a regular file of the image (hosts, resolv.conf).
vz_file() {
	if [ -f "/mnt/root$2" ] && [ ! -L "/mnt/root$2" ]; then
		$bb mount --bind "$1" "/mnt/root$2" || die "cannot bind $2"
	fi
}

# vz_port NAME: the character device of the virtio-serial port NAME (its name arrives asynchronously).
vz_port() {
	n=0
	while :; do
		for p in /sys/class/virtio-ports/*; do
			if [ "$($bb cat "$p/name" 2>/dev/null)" = "$1" ]; then
				echo "/dev/${p##*/}"
				return 0
			fi
		done
		n=$((n + 1))
		[ $n -gt 500 ] && return 1
		$bb usleep 10000
	done
}

# vz_session_agent PORT: one more session port of the agent (concurrent host connections). PID 1 serves it
# itself (--session-device): the Machine never holds the port, and every handshake on it proves the boot's key.
vz_session_agent() {
	dev=$(vz_port "$1") || die "no virtio-serial port named $1"
	VZ_SESSION_DEVICES="$VZ_SESSION_DEVICES --session-device $dev"
}

# vz_agent PORT ARGS...: become the guest agent (PID 1) serving PORT; ARGS are passed on verbatim.
vz_agent() {
	dev=$(vz_port "$1") || die "no virtio-serial port named $1"
	shift
	cd /
	# shellcheck disable=SC2086 # the session devices are /dev/vportNpM words
	exec /sbin/vz-agent serve --device "$dev" $VZ_SESSION_DEVICES --root /mnt/root --prepare-root --key-from-host "$@"
}

# vz_agent_vsock PORT READYPORT ARGS...: become the guest agent (PID 1) serving AF_VSOCK PORT (one session per
# connection); it reports ready by connecting to the host (CID 2) on READYPORT. ARGS are passed on verbatim.
vz_agent_vsock() {
	port=$1
	ready=$2
	shift 2
	cd /
	exec /sbin/vz-agent serve --listen "vsock:$port" --ready-vsock "2:$ready" --root /mnt/root --prepare-root \
		--key-from-host "$@"
}

if [ -f /etc/vz/init.sh ]; then
	. /etc/vz/init.sh
fi
vz_config_mount || die "cannot mount the configuration share"
. /run/vz/cfg/config.sh
die "the configuration did not start the guest agent"
"""


DHCP_SCRIPT = r"""#!/bin/busybox sh
# udhcpc's event script (vz_network_dhcp): the lease's address, default route and DNS servers.
bb=/bin/busybox
case "$1" in
deconfig)
	$bb ip addr flush dev "$interface"
	;;
bound | renew)
	$bb ip addr flush dev "$interface"
	$bb ip addr add "$ip/${mask:-24}" dev "$interface" || exit 1
	for r in $router; do
		$bb ip route replace default via "$r" dev "$interface" || exit 1
		break
	done
	: >/run/vz/resolv.conf.new
	[ -n "$domain" ] && echo "search $domain" >>/run/vz/resolv.conf.new
	for d in $dns; do
		echo "nameserver $d" >>/run/vz/resolv.conf.new
	done
	$bb mv /run/vz/resolv.conf.new /run/vz/resolv.conf
	echo "vz: eth0 $ip/${mask:-24} via ${router%% *}, DNS $dns"
	;;
esac
exit 0
"""
"""udhcpc's event script in every initramfs (``/etc/vz/dhcp.sh``)."""


@dataclass(frozen=True)
class Initramfs:
    """A built initramfs: its path and the SHA-256 of its bytes."""

    path: Path
    digest: str


def _is_static_elf(data: bytes) -> bool:
    if not data.startswith(b"\x7fELF\x02\x01"):
        return False
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        base = phoff + i * phentsize
        if base + 4 > len(data):
            return False
        if struct.unpack_from("<I", data, base)[0] == 3:  # PT_INTERP: needs a dynamic loader
            return False
    return True


def find_busybox(path: str | None = None) -> Path:
    """A statically linked busybox (Debian: ``busybox-static``); ``UnavailableError`` naming what to install."""
    candidates = [path] if path else ["/bin/busybox", "/usr/bin/busybox", shutil.which("busybox") or ""]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            with open(candidate, "rb") as f:
                if _is_static_elf(f.read(1 << 16)):
                    return Path(candidate)
    raise UnavailableError(
        "the qemu driver needs a statically linked busybox for the guest init; install it "
        "(Debian/Ubuntu: `apt-get install busybox-static`) or pass the driver option busybox=<path>"
    )


def archive_bytes(kernel: Kernel, busybox: Path, agent: Path, modules: tuple[str, ...] = GUEST_MODULES) -> bytes:
    """The initramfs for ``kernel`` (its ``modules``), ``busybox`` and the guest ``agent``, the same bytes each time."""
    release = kernel.release or "vz"
    mod_dir = f"lib/modules/{release}"
    entries = [
        CpioEntry.directory(d)
        for d in (
            "bin",
            "dev",
            "etc",
            "etc/vz",
            "lib",
            "lib/modules",
            mod_dir,
            "mnt",
            "mnt/root",
            "proc",
            "run",
            "sbin",
            "sys",
            "tmp",
        )
    ]
    entries.append(CpioEntry.char_device("dev/console", 5, 1))
    entries.append(CpioEntry.file(GUEST_BUSYBOX.lstrip("/"), busybox.read_bytes(), 0o755))
    entries.append(CpioEntry.symlink("bin/sh", "busybox"))
    entries.append(CpioEntry.file("sbin/vz-agent", agent.read_bytes(), 0o755))
    resolved = resolve_modules(kernel, modules)
    dep_lines = []
    for module in resolved:
        entries.append(CpioEntry.file(f"{mod_dir}/{module.name}.ko", strip_module_signature(module.read())))
        # busybox modprobe reads modules.dep ("module.ko: dependency.ko ..."), like the kernel's own file.
        dep_lines.append(f"{module.name}.ko:" + "".join(f" {dep}.ko" for dep in module.deps))
    entries.append(CpioEntry.file(f"{mod_dir}/modules.dep", ("\n".join(dep_lines) + "\n").encode()))
    canonical = {w.replace("-", "_") for w in modules}
    wanted = [m.name for m in resolved if m.name in canonical]
    entries.append(CpioEntry.file("etc/vz/modules", (" ".join(wanted) + "\n").encode()))
    entries.append(CpioEntry.file("etc/vz/format", f"{FORMAT_VERSION}\n".encode()))
    entries.append(CpioEntry.file("etc/vz/dhcp.sh", DHCP_SCRIPT.encode(), 0o755))
    entries.append(CpioEntry.file("init", INIT_SCRIPT.encode(), 0o755))
    out = io.BytesIO()
    write_cpio(out, entries)
    return out.getvalue()


def build_initramfs(
    kernel: Kernel,
    agent: Path,
    cache: Path,
    *,
    busybox: Path | None = None,
    modules: tuple[str, ...] = GUEST_MODULES,
) -> Initramfs:
    """Build (or find in ``cache``) the initramfs for ``kernel`` with the guest ``agent`` binary.

    Raises ``UnavailableError`` when busybox-static or a needed kernel module is missing.
    """
    bb = busybox or find_busybox()
    data = archive_bytes(kernel, bb, agent, modules)
    digest = hashlib.sha256(data).hexdigest()
    target = cache / digest / "initramfs.cpio"
    if target.is_file():
        return Initramfs(target, digest)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".initramfs.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return Initramfs(target, digest)
