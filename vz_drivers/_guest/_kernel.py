"""Finding the guest kernel and the kernel modules the guest init needs.

The guest runs a stock distribution kernel (Debian's ``linux-image-amd64`` by default). Whatever a kernel builds
as modules (virtio transports, virtio-blk/console/net, ext4, 9p) is copied, dependencies first, into the
initramfs that vz builds; whatever is built in is skipped.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import re
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import UnavailableError
from vz_drivers._machine import atomic_write

__all__ = [
    "GUEST_MODULES",
    "Kernel",
    "KernelModule",
    "bzimage_release",
    "decompress_kernel",
    "extract_vmlinux",
    "find_kernel",
    "has_pvh_entry",
    "resolve_modules",
    "strip_module_signature",
]

GUEST_MODULES: tuple[str, ...] = (
    "virtio_pci",
    "virtio_mmio",
    "virtio_console",
    "virtio_blk",
    "virtio_net",
    "crc32c_generic",  # ext4/jbd2 checksums ask the crypto layer for "crc32c" at mount time
    "ext4",
    "9pnet_virtio",
    "9p",
)
"""What the guest init needs, by module name; resolved against ``modules.dep`` with dependencies."""

INSTALL_HINT = (
    "install a Linux kernel for the guest (Debian/Ubuntu: `apt-get install linux-image-amd64`) or pass the "
    "driver options kernel=<vmlinuz> and modules=<dir containing modules.dep>"
)


@dataclass(frozen=True)
class KernelModule:
    """One module to load in the guest: its canonical name and the file it comes from."""

    name: str
    path: Path
    deps: tuple[str, ...] = ()
    """Every module it needs (names), in ``modules.dep`` order: the last one is loaded first."""

    def read(self) -> bytes:
        """The uncompressed module image (``.ko``, ``.ko.xz``, ``.ko.gz`` or ``.ko.zst``)."""
        suffix = self.path.suffix
        raw = self.path.read_bytes()
        if suffix == ".xz":
            return lzma.decompress(raw)
        if suffix == ".gz":
            return gzip.decompress(raw)
        if suffix == ".zst":
            zstd = shutil.which("zstd")
            if zstd is None:
                raise UnavailableError(
                    f"kernel module {self.path} is zstd-compressed and the `zstd` tool is missing; "
                    "install it (`apt-get install zstd`)"
                )
            return subprocess.run([zstd, "-dcq", str(self.path)], check=True, capture_output=True).stdout
        return raw


@dataclass(frozen=True)
class Kernel:
    """A guest kernel image plus its module tree (``modules_dir`` may be None for a fully built-in kernel)."""

    image: Path
    release: str
    modules_dir: Path | None

    def fingerprint(self) -> str:
        """A short content hash of the kernel image (caches key on it, not on its path)."""
        digest = hashlib.sha256()
        with self.image.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()[:16]


def _release_of(image: Path) -> str:
    name = image.name
    for prefix in ("vmlinuz-", "bzImage-", "vmlinux-"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return ""


def _version_key(release: str) -> tuple[tuple[int, str], ...]:
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.-]", release))


def find_kernel(
    kernel: str | Path | None = None,
    modules: str | Path | None = None,
    *,
    boot_dir: Path = Path("/boot"),
    modules_root: Path = Path("/lib/modules"),
) -> Kernel:
    """The guest kernel: an explicit ``kernel`` path, else the newest ``/boot/vmlinuz-*`` with a module tree.

    Raises ``UnavailableError`` naming what to install when nothing usable is found.
    """
    if kernel is not None:
        image = Path(kernel)
        if not image.is_file():
            raise UnavailableError(f"guest kernel {image} does not exist or is not a file; {INSTALL_HINT}")
        release = _release_of(image) or bzimage_release(image)
        if modules is not None:
            mod_dir: Path | None = Path(modules)
        elif release and (modules_root / release / "modules.dep").is_file():
            mod_dir = modules_root / release
        else:
            mod_dir = None
        return _checked(Kernel(image=image, release=release, modules_dir=mod_dir))
    candidates = sorted(
        (p for p in boot_dir.glob("vmlinuz-*") if p.is_file() and (modules_root / _release_of(p)).is_dir()),
        key=lambda p: _version_key(_release_of(p)),
        reverse=True,
    )
    if not candidates:
        raise UnavailableError(
            f"no guest kernel found (looked for {boot_dir}/vmlinuz-* with a module tree); {INSTALL_HINT}"
        )
    image = candidates[0]
    release = _release_of(image)
    mod_dir = Path(modules) if modules is not None else modules_root / release
    return _checked(Kernel(image=image, release=release, modules_dir=mod_dir))


def _checked(kernel: Kernel) -> Kernel:
    try:
        with kernel.image.open("rb"):
            pass
    except OSError as exc:
        raise UnavailableError(
            f"guest kernel {kernel.image} is not readable ({exc.strerror}); run vz as a user that can read it "
            "or copy it somewhere readable and pass the driver option kernel=<path>"
        ) from None
    if kernel.modules_dir is not None and not (kernel.modules_dir / "modules.dep").is_file():
        raise UnavailableError(f"kernel module tree {kernel.modules_dir} has no modules.dep; {INSTALL_HINT}")
    return kernel


def _canonical(name: str) -> str:
    return name.replace("-", "_")


def _module_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    return _canonical(base.split(".ko", 1)[0])


def resolve_modules(kernel: Kernel, wanted: tuple[str, ...] = GUEST_MODULES) -> list[KernelModule]:
    """The modules to load for ``wanted``, dependencies first, skipping what the kernel has built in.

    Raises ``UnavailableError`` when a wanted module is neither built in nor in the module tree.
    """
    if kernel.modules_dir is None:
        return []
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in (kernel.modules_dir / "modules.dep").read_text().splitlines():
        target, sep, rest = line.partition(":")
        if not sep:
            continue
        deps[_module_name(target)] = (target, [_module_name(d) for d in rest.split()])
    builtin: set[str] = set()
    builtin_file = kernel.modules_dir / "modules.builtin"
    if builtin_file.is_file():
        builtin = {_module_name(line) for line in builtin_file.read_text().splitlines() if line}

    order: list[KernelModule] = []
    seen: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in seen or name in builtin:
            return
        if name not in deps:
            raise UnavailableError(
                f"kernel {kernel.release or kernel.image} lacks module {name!r} (needed for {chain[0]!r}) and does "
                f"not build it in; {INSTALL_HINT}"
            )
        seen.add(name)
        rel, requires = deps[name]
        # modules.dep lists the full closure; walking each dependency's own line keeps load order correct.
        for dep in reversed(requires):
            visit(dep, (*chain, dep))
        assert kernel.modules_dir is not None
        order.append(KernelModule(name=name, path=kernel.modules_dir / rel, deps=tuple(requires)))

    for want in wanted:
        visit(_canonical(want), (_canonical(want),))
    return order


_SIG_MAGIC = b"~Module signature appended~\n"


def strip_module_signature(data: bytes) -> bytes:
    """``data`` without an appended module signature.

    Checking signatures hashes every module at load time, which is slow under TCG; the guest kernel does not
    enforce them (an unsigned module only taints it), and the modules come from the host's own package.
    """
    if not data.endswith(_SIG_MAGIC):
        return data
    # struct module_signature (12 bytes) precedes the magic; its last field is the big-endian signature length.
    info = data[-len(_SIG_MAGIC) - 12 : -len(_SIG_MAGIC)]
    (sig_len,) = struct.unpack(">I", info[8:12])
    end = len(data) - len(_SIG_MAGIC) - 12 - sig_len
    return data[:end] if end > 0 else data


def _bzimage_header(data: bytes) -> bool:
    return len(data) > 0x260 and data[0x202:0x206] == b"HdrS"


def bzimage_release(image: Path) -> str:
    """The kernel release ("6.1.0-57-amd64") recorded in a bzImage header; "" when it has none."""
    with image.open("rb") as f:
        head = f.read(0x8000)
    if not _bzimage_header(head):
        return ""
    (offset,) = struct.unpack_from("<H", head, 0x20E)
    start = offset + 0x200
    if offset == 0 or start >= len(head):
        return ""
    text = head[start : start + 256].split(b"\0", 1)[0].decode(errors="replace")
    return text.split(" ", 1)[0]


def decompress_kernel(data: bytes) -> bytes | None:
    """The ELF ``vmlinux`` inside a bzImage (``data``), or ``data`` when it already is ELF; None when not
    extractable with the standard library (zstd, lz4, lzo payloads)."""
    if data.startswith(b"\x7fELF"):
        return data
    if not _bzimage_header(data):
        return None
    setup_sects = data[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", data, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    try:
        return _decompress_payload(data[start : start + payload_length])
    except (lzma.LZMAError, zlib.error, OSError, EOFError):
        return None


def _decompress_payload(payload: bytes) -> bytes | None:
    if payload.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
    if payload.startswith(b"\x5d\x00\x00"):
        return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(payload)
    if payload.startswith(b"\x1f\x8b"):
        return zlib.decompressobj(wbits=31).decompress(payload)
    if payload.startswith(b"BZh"):
        return bz2.BZ2Decompressor().decompress(payload)
    return None


_XEN_ELFNOTE_PHYS32_ENTRY = 18


def has_pvh_entry(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF kernel carries the PVH entry note QEMU needs to boot it directly."""
    if len(elf) < 64 or not elf.startswith(b"\x7fELF\x02\x01"):
        return False
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        base = phoff + i * phentsize
        if base + 56 > len(elf):
            return False
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", elf, base)
        if p_type != 4:  # PT_NOTE
            continue
        pos, end = p_offset, min(p_offset + p_filesz, len(elf))
        while pos + 12 <= end:
            namesz, descsz, n_type = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12 : pos + 12 + namesz]
            if name.rstrip(b"\0") == b"Xen" and n_type == _XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def extract_vmlinux(kernel: Kernel, cache: Path) -> Path | None:
    """The uncompressed ELF kernel inside ``kernel.image``, cached under ``cache``; None when not extractable.

    QEMU boots an ELF kernel with a PVH entry point directly, which skips both the firmware's kernel loader and
    the kernel's self-decompression (seconds under TCG). Kernels compressed with a method the Python standard
    library lacks (zstd, lz4, lzo) are booted as they are.
    """
    target = cache / kernel.fingerprint() / "vmlinux"
    if target.is_file():
        return target
    data = kernel.image.read_bytes()
    if data.startswith(b"\x7fELF"):
        return kernel.image
    if not _bzimage_header(data):
        return None
    setup_sects = data[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", data, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    try:
        elf = _decompress_payload(data[start : start + payload_length])
    except (lzma.LZMAError, zlib.error, OSError, EOFError):
        return None
    if elf is None or not has_pvh_entry(elf):
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, elf, 0o644)
    return target
