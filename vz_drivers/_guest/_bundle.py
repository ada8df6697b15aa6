"""Guest bundles: the vz Linux guest built once, on a Linux machine, from pinned Debian packages, for hosts that
have no Linux system to build it from (vfkit on macOS, hyperv on Windows).

A bundle is a directory: the kernel in the form the VMM boots, the initramfs (busybox, the kernel modules, the
guest agent as init) and ``manifest.json`` with the SHA-256 and size of every file and the name, version,
architecture and SHA-256 of every input package. Its digest is the SHA-256 of ``manifest.json``'s bytes.

* **Build** (``build_bundle``, ``vz guest build``): the ``.deb`` files are fetched with ``apt-get download`` (the
  machine's configured Debian archive, with the foreign architecture added for a cross build) and each is
  refused unless its SHA-256 is the pinned one (``PINS``); nothing of the building machine's own ``/boot``,
  ``/lib/modules`` or busybox is read. Every output is deterministic: the cpio archive has fixed owners, modes,
  times and order; the manifest is sorted JSON with ``SOURCE_DATE_EPOCH`` (the kernel package's changelog date).
* **Use** (``open_bundle``): a driver takes a bundle by path or ``https://`` URL (of its ``manifest.json``;
  the files sit beside it), copies it into ``<cache>/guest/<digest>/`` and verifies every file against the
  manifest before use: a missing, extra or changed file is refused, naming it. A pinned ``digest`` (the
  ``guest_sha256`` option) must match the manifest's; a bundle already cached by that digest is verified and
  used without reading the source.
* **Releases** (``fetch_release``, ``vz guest fetch <release>/SHA256SUMS --arch A --format F``): the release
  workflow publishes each bundle's files flat (``vz-guest-<arch>-<format>.<file>``) beside ``SHA256SUMS``; the
  list pins the chosen manifest, the manifest every file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from vz_drivers._guest._efi import build_uki, find_boot_tools
from vz_drivers._guest._hyperv import BOOT_CMDLINE, hyperv_initrd
from vz_drivers._guest._initramfs import archive_bytes
from vz_drivers._guest._kernel import GUEST_MODULES, Kernel, decompress_kernel

__all__ = [
    "ARCHES",
    "FORMATS",
    "MANIFEST",
    "PINS",
    "SUMS",
    "VFKIT_MODULES",
    "Bundle",
    "Pin",
    "build_bundle",
    "bundle_cache",
    "check_bundle_options",
    "fetch_release",
    "open_bundle",
    "release_asset",
    "verify_bundle",
    "write_bundle",
]

MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"
"""The release's list of ``<sha256>  <asset>`` lines (``sha256sum`` output) beside its flat bundle assets."""
BUNDLE_VERSION = 1
ARCHES = ("amd64", "arm64")
FORMATS = ("hyperv", "qemu", "vfkit")

VFKIT_MODULES: tuple[str, ...] = (
    "virtio_pci",
    "virtio_mmio",
    "virtio_console",  # hvc0: vfkit's virtio-serial console
    "virtio_blk",  # the raw root disk
    "virtio_net",
    "crc32c_generic",  # ext4/jbd2 checksums ask the crypto layer for "crc32c" at mount time
    "ext4",
    "virtiofs",  # the configuration share, the workspace, bind mounts, volumes, Rosetta
    "vmw_vsock_virtio_transport",  # the agent and the readiness report
    # 9p carries the configuration when the same guest is booted under QEMU (how it is verified on Linux).
    "9pnet_virtio",
    "9p",
)
"""Kernel modules the vfkit form's initramfs loads (when not built in), by module name."""


@dataclass(frozen=True)
class Pin:
    """One input package: Debian name, version and the SHA-256 its ``.deb`` must have."""

    name: str
    version: str
    sha256: str


KERNEL_RELEASE = {"amd64": "6.1.0-57-amd64", "arm64": "6.1.0-57-arm64"}
PINS: Mapping[str, Mapping[str, Pin]] = {
    # Debian 12 (bookworm). Debian drops superseded kernel builds from its mirrors: when a pinned version is gone,
    # update the version, the release above and the SHA-256 together after checking the new packages.
    "arm64": {
        "kernel": Pin(
            "linux-image-6.1.0-57-arm64",
            "6.1.192-3",
            "8301bd5b5b2cf8fd5e479832200c23e64eca0ae9ec45c487c5c318b1e44d4692",
        ),
        "busybox": Pin(
            "busybox-static",
            "1:1.35.0-4+deb12u1+b1",
            "732c9135564fc71337e0e05fb4da4d11e6c28c1834bce3e405e575afef2a52f5",
        ),
    },
    "amd64": {
        "kernel": Pin(
            "linux-image-6.1.0-57-amd64",
            "6.1.192-3",
            "14d219d01e1283261817d961dbb3895cb5b4288d0de10e0ba0632a0d993e15bf",
        ),
        "busybox": Pin(
            "busybox-static",
            "1:1.35.0-4+deb12u1+b1",
            "3d3fdbe91d4660c873e14b092c213fe81c1da6362daa236eb25d0171eb108744",
        ),
        # hyperv only: the EFI stub of the unified kernel image (EFI_STUB)
        "efi_stub": Pin(
            "systemd-boot-efi", "252.39-1~deb12u2", "8f2b81bdcfafc466882a0cae460272dbf10d8d97c6a3c1c6ea33038c155a2f5e"
        ),
    },
}
EFI_STUB = "usr/lib/systemd/boot/efi/linuxx64.efi.stub"

_HINT_PINS = "update the pins in vz_drivers/_guest/_bundle.py (PINS) after checking the new packages"


@dataclass(frozen=True)
class Bundle:
    """A verified bundle in the cache: its directory, manifest and digest (SHA-256 of ``manifest.json``)."""

    root: Path
    manifest: Mapping[str, object]
    digest: str

    @property
    def arch(self) -> str:
        return str(self.manifest["arch"])

    @property
    def format(self) -> str:
        return str(self.manifest["format"])

    def file(self, role: str) -> Path:
        """The file with ``role`` (``kernel``, ``initrd``; hyperv: ``uki``) in this bundle."""
        roles = self.manifest.get("roles")
        if not isinstance(roles, dict) or role not in roles:
            raise FailedPreconditionError(f"guest bundle {self.root} has no {role} (its manifest names none)")
        return self.root / str(roles[role])


# ---------------------------------------------------------------------------------------------------- build


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_deb(pin: Pin, arch: str, debs: Path, *, run: Callable[..., object] = subprocess.run) -> Path:
    """``<debs>/<sha256>.deb`` for ``pin``: downloaded with ``apt-get download`` unless already there, and refused
    unless its SHA-256 is the pinned one."""
    debs.mkdir(parents=True, exist_ok=True)
    target = debs / f"{pin.sha256}.deb"
    if target.is_file() and _sha256_file(target) == pin.sha256:
        return target
    apt = shutil.which("apt-get")
    if apt is None:
        raise UnavailableError("building a guest bundle needs apt-get (a Debian or Ubuntu machine)")
    with tempfile.TemporaryDirectory(dir=debs, prefix=".fetch.") as tmp:
        os.chmod(tmp, 0o755)  # apt's download sandbox user writes here
        spec = f"{pin.name}:{arch}={pin.version}"
        proc = subprocess.run([apt, "download", "-q", spec], cwd=tmp, capture_output=True, text=True, check=False)
        found = sorted(Path(tmp).glob("*.deb"))
        if proc.returncode != 0 or len(found) != 1:
            foreign = (
                "" if arch == _dpkg_arch() else f" (cross build: `dpkg --add-architecture {arch} && apt-get update`)"
            )
            raise UnavailableError(
                f"apt-get download {spec} failed{foreign}: {(proc.stderr or proc.stdout).strip()[-400:]}; when "
                f"Debian's archive no longer has that version, {_HINT_PINS}"
            )
        got = _sha256_file(found[0])
        if got != pin.sha256:
            raise FailedPreconditionError(
                f"{found[0].name} has SHA-256 {got}, not the pinned {pin.sha256}; refusing it ({_HINT_PINS})"
            )
        os.replace(found[0], target)
    return target


def _dpkg_arch() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(
            ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
        ).stdout.strip()
    return ""


def _extract(deb: Path, root: Path) -> None:
    dpkg_deb = shutil.which("dpkg-deb")
    if dpkg_deb is None:
        raise UnavailableError("building a guest bundle needs dpkg-deb (Debian: dpkg)")
    subprocess.run([dpkg_deb, "-x", str(deb), str(root)], check=True, capture_output=True)


def _changelog_epoch(root: Path, package: str) -> int:
    """SOURCE_DATE_EPOCH of the build: the date of the kernel package's newest changelog entry."""
    import email.utils
    import gzip

    for path in sorted((root / "usr/share/doc" / package).glob("changelog*.gz")):
        text = gzip.decompress(path.read_bytes()).decode(errors="replace")
        match = re.search(r"^ -- .*?>  (.+)$", text, re.MULTILINE)
        if match:
            return int(email.utils.parsedate_to_datetime(match.group(1)).timestamp())
    return 0


def _depmod(root: Path, release: str) -> None:
    depmod = shutil.which("depmod") or next(
        (p for p in ("/usr/sbin/depmod", "/sbin/depmod") if os.path.exists(p)), None
    )
    if depmod is None:
        raise UnavailableError("building a guest bundle needs depmod (Debian: kmod)")
    subprocess.run([depmod, "-b", str(root), release], check=True, capture_output=True)


def _kernel_form(fmt: str, arch: str, image: Path) -> tuple[str, bytes]:
    """The kernel file the VMM of ``fmt`` boots, with its file name."""
    data = image.read_bytes()
    if arch == "arm64":
        # Debian's arm64 vmlinuz is the uncompressed ARM64 Image ("ARM\x64" at 0x38), which vfkit's linux
        # bootloader requires (a gzip'd Image hangs it) and QEMU boots as it is.
        if data[0x38:0x3C] != b"ARMd":
            raise FailedPreconditionError(f"{image.name} is not an uncompressed arm64 Image; {_HINT_PINS}")
        return "Image", data
    if fmt == "qemu":
        return "bzImage", data
    elf = decompress_kernel(data)
    if elf is None:
        raise FailedPreconditionError(f"the vmlinux inside {image.name} cannot be extracted; {_HINT_PINS}")
    return "vmlinux", elf


def _unified_kernel_image(stub: Path, kernel: Path, initrd: bytes, work: Path) -> bytes:
    """systemd's EFI stub (from its pinned package) with the kernel, ``initrd`` and the hyperv command line."""
    import asyncio

    tools = find_boot_tools(stub)
    path = asyncio.run(build_uki(tools, kernel, initrd, BOOT_CMDLINE, work / "uki"))
    return _pe_deterministic(path.read_bytes())


def _pe_deterministic(image: bytes) -> bytes:
    """``image`` with the PE header's TimeDateStamp (objcopy writes the current time) set to 0 and its checksum
    recomputed: the same inputs give the same bytes."""
    data = bytearray(image)
    (pe,) = struct.unpack_from("<I", data, 0x3C)
    if data[pe : pe + 4] != b"PE\0\0":
        raise FailedPreconditionError("the unified kernel image is not a PE image")
    struct.pack_into("<I", data, pe + 8, 0)
    checksum_at = pe + 24 + 64
    struct.pack_into("<I", data, checksum_at, 0)
    padded = bytes(data) + b"\0" * (len(data) % 2)
    total = 0
    for (word,) in struct.iter_unpack("<H", padded):
        total += word
        total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    struct.pack_into("<I", data, checksum_at, (total + len(data)) & 0xFFFFFFFF)
    return bytes(data)


def build_bundle(
    arch: str,
    fmt: str,
    out: Path,
    *,
    agent: Path,
    debs: Path,
) -> Bundle:
    """Build the ``fmt`` bundle for ``arch`` into the empty or missing directory ``out``.

    ``agent`` is the guest agent built for ``linux/<arch>``; ``debs`` caches the pinned packages by SHA-256.
    """
    if arch not in ARCHES:
        raise InvalidArgumentError(f"--arch {arch!r} is unknown; use one of {', '.join(ARCHES)}")
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"--format {fmt!r} is unknown; use one of {', '.join(FORMATS)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgumentError(f"--out {out} exists and is not an empty directory; name a new one")
    if fmt == "hyperv" and arch != "amd64":
        raise InvalidArgumentError("--format hyperv is built for --arch amd64 (Hyper-V Generation 2 on x86-64)")
    pins = {role: pin for role, pin in PINS[arch].items() if role != "efi_stub" or fmt == "hyperv"}
    release = KERNEL_RELEASE[arch]
    packages = {role: fetch_deb(pin, arch, debs) for role, pin in pins.items()}
    with tempfile.TemporaryDirectory(prefix="vz-guest-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        for deb in packages.values():
            _extract(deb, root)
        _depmod(root, release)
        epoch = _changelog_epoch(root, pins["kernel"].name)
        image = root / "boot" / f"vmlinuz-{release}"
        kernel = Kernel(image=image, release=release, modules_dir=root / "lib/modules" / release)
        busybox = root / "bin" / "busybox"
        roles: dict[str, str]
        if fmt == "hyperv":
            uki = _unified_kernel_image(root / EFI_STUB, image, hyperv_initrd(kernel, busybox, agent), Path(tmp))
            files = {"BOOTX64.EFI": uki}
            roles = {"uki": "BOOTX64.EFI"}
        else:
            modules = VFKIT_MODULES if fmt == "vfkit" else GUEST_MODULES
            initrd = archive_bytes(kernel, busybox, agent, modules)
            kernel_name, kernel_bytes = _kernel_form(fmt, arch, image)
            files = {kernel_name: kernel_bytes, "initramfs.cpio": initrd}
            roles = {"kernel": kernel_name, "initrd": "initramfs.cpio"}
    packages_list = [
        {"role": role, "name": pin.name, "version": pin.version, "architecture": arch, "sha256": pin.sha256}
        for role, pin in sorted(pins.items())
    ]
    extra = {"kernel_release": release, "packages": packages_list, "agent": {"sha256": _sha256_file(agent)}}
    return write_bundle(out, files, arch=arch, fmt=fmt, roles=roles, epoch=epoch, **extra)


def write_bundle(
    out: Path,
    files: Mapping[str, bytes],
    *,
    arch: str,
    fmt: str,
    roles: Mapping[str, str],
    epoch: int = 0,
    **extra: object,
) -> Bundle:
    """Write ``files`` and their manifest into ``out``: modes 0644, times ``epoch``, sorted JSON."""
    out.mkdir(parents=True, exist_ok=True)
    for name, data in sorted(files.items()):
        (out / name).write_bytes(data)
        os.chmod(out / name, 0o644)
        os.utime(out / name, (epoch, epoch))
    manifest: dict[str, object] = {
        **extra,
        "vz_guest_bundle": BUNDLE_VERSION,
        "arch": arch,
        "format": fmt,
        "source_date_epoch": epoch,
        "roles": dict(roles),
        "files": {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)} for name, data in files.items()
        },
    }
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (out / MANIFEST).write_text(text, encoding="utf-8")
    os.chmod(out / MANIFEST, 0o644)
    os.utime(out / MANIFEST, (epoch, epoch))
    return Bundle(root=out, manifest=manifest, digest=hashlib.sha256(text.encode()).hexdigest())


# ---------------------------------------------------------------------------------------------------- use


def _load_manifest(data: bytes, where: str) -> dict[str, object]:
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise FailedPreconditionError(f"guest bundle {where}: {MANIFEST} is not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("vz_guest_bundle") != BUNDLE_VERSION:
        raise FailedPreconditionError(
            f"guest bundle {where}: {MANIFEST} is not a version {BUNDLE_VERSION} vz guest bundle manifest"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise FailedPreconditionError(f"guest bundle {where}: {MANIFEST} lists no files")
    for name, entry in files.items():
        if (
            not isinstance(name, str)
            or "/" in name
            or name in ("", ".", "..", MANIFEST)
            or not isinstance(entry, dict)
            or not re.fullmatch(r"[0-9a-f]{64}", str(entry.get("sha256", "")))
        ):
            raise FailedPreconditionError(f"guest bundle {where}: {MANIFEST} has a bad file entry {name!r}")
    return manifest


def verify_bundle(root: Path, *, digest: str = "") -> Bundle:
    """The bundle in ``root``, every file checked against its manifest (and the manifest against ``digest``).

    Raises ``FailedPreconditionError`` naming the first missing, unexpected or changed file."""
    try:
        data = (root / MANIFEST).read_bytes()
    except OSError as exc:
        raise FailedPreconditionError(f"guest bundle {root}: cannot read {MANIFEST} ({exc.strerror})") from None
    got = hashlib.sha256(data).hexdigest()
    if digest and got != digest:
        raise FailedPreconditionError(
            f"guest bundle {root}: {MANIFEST} has SHA-256 {got}, not the pinned {digest} (option guest_sha256)"
        )
    manifest = _load_manifest(data, str(root))
    files = manifest["files"]
    assert isinstance(files, dict)
    present = {p.name for p in root.iterdir() if p.name != MANIFEST}
    for extra in sorted(present - set(files)):
        raise FailedPreconditionError(f"guest bundle {root}: {extra} is not in its manifest; refusing the bundle")
    for name, entry in sorted(files.items()):
        path = root / name
        if not path.is_file():
            raise FailedPreconditionError(f"guest bundle {root}: {name} is missing")
        if _sha256_file(path) != entry["sha256"]:
            raise FailedPreconditionError(
                f"guest bundle {root}: {name} does not match its manifest (SHA-256 differs); refusing the bundle"
            )
    return Bundle(root=root, manifest=manifest, digest=got)


def bundle_cache() -> Path:
    """Where verified bundles are kept, by digest: ``<vz cache>/guest/bundles`` (``$VZ_HOME/cache/...``)."""
    from vz_core.paths import cache_dir

    return cache_dir() / "guest" / "bundles"


def _read_source(source: str, name: str) -> bytes:
    """``name`` of the bundle at ``source``: beside its manifest, with the manifest's name prefix (a release
    publishes ``vz-guest-arm64-vfkit.manifest.json`` beside ``vz-guest-arm64-vfkit.Image``)."""
    if source.startswith("https://"):
        base, last = source.rsplit("/", 1)
        prefix = last[: -len(MANIFEST)] if last.endswith(MANIFEST) else ""
        url = source if name == MANIFEST else f"{base}/{urllib.parse.quote(prefix + name)}"
        with urllib.request.urlopen(url, timeout=60) as response:
            return bytes(response.read())
    path = Path(source)
    if path.is_dir():
        return (path / name).read_bytes()
    prefix = path.name[: -len(MANIFEST)] if path.name.endswith(MANIFEST) else ""
    return path.read_bytes() if name == MANIFEST else (path.parent / (prefix + name)).read_bytes()


def check_bundle_options(source: str, digest: str) -> None:
    """Refuse a ``guest`` option that is neither an absolute path nor an ``https://`` URL, and a ``guest_sha256``
    that is no SHA-256, when the driver is made (before any boot reads the bundle)."""
    if source and not source.startswith("https://") and not os.path.isabs(source):
        raise InvalidArgumentError(
            f"guest={source!r} must be an absolute path of a guest bundle (its directory or manifest.json) or an "
            "https:// URL of its manifest.json",
            details={"option": "guest"},
        )
    if digest and not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise InvalidArgumentError(
            f"guest_sha256={digest!r} is not a SHA-256 (64 lowercase hex digits)", details={"option": "guest_sha256"}
        )


def open_bundle(source: str, cache: Path, *, digest: str = "") -> Bundle:
    """The bundle at ``source`` (a directory, its ``[PREFIX]manifest.json``, or an ``https://`` URL of that),
    copied into ``<cache>/<digest>/`` and verified there; a cached copy is verified again before every use."""
    if not source:
        raise InvalidArgumentError("no guest bundle given (see `vz guest build --help` and docs/drivers/)")
    if not source.startswith("https://") and not os.path.isabs(source):
        raise InvalidArgumentError(f"guest bundle {source!r} must be an absolute path or an https:// URL")
    if digest and (cache / digest).is_dir():
        return verify_bundle(cache / digest, digest=digest)  # cached by that digest: nothing is read from source
    try:
        data = _read_source(source, MANIFEST)
    except OSError as exc:
        raise UnavailableError(f"guest bundle {source}: cannot read {MANIFEST} ({exc})") from None
    got = hashlib.sha256(data).hexdigest()
    if digest and got != digest:
        raise FailedPreconditionError(
            f"guest bundle {source}: {MANIFEST} has SHA-256 {got}, not the pinned {digest} (option guest_sha256)"
        )
    manifest = _load_manifest(data, source)
    target = cache / got
    if target.is_dir():
        return verify_bundle(target, digest=got)
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=".bundle."))
    try:
        files = manifest["files"]
        assert isinstance(files, dict)
        for name in sorted(files):
            try:
                blob = _read_source(source, str(name))
            except OSError as exc:
                raise UnavailableError(f"guest bundle {source}: cannot read {name} ({exc})") from None
            (staging / str(name)).write_bytes(blob)
        (staging / MANIFEST).write_bytes(data)
        bundle = verify_bundle(staging, digest=got)
        with contextlib.suppress(FileExistsError, OSError):
            os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not target.is_dir():
        raise UnavailableError(f"guest bundle {source}: cannot store it in {cache}")
    return Bundle(root=target, manifest=bundle.manifest, digest=got)


# ---------------------------------------------------------------------------------------------------- releases


def release_asset(arch: str, fmt: str, name: str = MANIFEST) -> str:
    """The flat asset name of a bundle file in a release: ``vz-guest-<arch>-<format>.<name>``."""
    return f"vz-guest-{arch}-{fmt}.{name}"


def _parse_sums(text: str, where: str) -> dict[str, str]:
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = re.fullmatch(r"([0-9a-f]{64}) [ *]([^/\\]+)", line.rstrip("\r"))
        if m is None:
            raise FailedPreconditionError(f"{where}: line {number} is not '<sha256>  <file>' ({line[:80]!r})")
        sums[m.group(2)] = m.group(1)
    return sums


def fetch_release(sums: str, arch: str, fmt: str, cache: Path) -> Bundle:
    """The ``arch``/``fmt`` bundle of a release, named by its ``SHA256SUMS`` (an ``https://`` URL or an absolute
    path; the assets sit beside it): the manifest is pinned by its line there, every file by the manifest, and a
    file the list names must have the list's SHA-256 too. Cached by the manifest's digest: once cached, only
    the list is read again."""
    if arch not in ARCHES or fmt not in FORMATS:
        raise InvalidArgumentError(
            f"no {arch}/{fmt} guest bundle: --arch is one of {ARCHES}, --format one of {FORMATS}"
        )
    if not sums.startswith("https://") and not os.path.isabs(sums):
        raise InvalidArgumentError(f"{sums!r} must be an https:// URL or an absolute path of a release's {SUMS}")
    try:
        if sums.startswith("https://"):
            with urllib.request.urlopen(sums, timeout=60) as response:
                text = bytes(response.read()).decode("utf-8")
        else:
            text = Path(sums).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UnavailableError(f"cannot read {sums} ({exc})") from None
    listed = _parse_sums(text, sums)
    manifest_name = release_asset(arch, fmt)
    digest = listed.get(manifest_name)
    if digest is None:
        offered = sorted({n.split(".", 1)[0] for n in listed if n.endswith("." + MANIFEST)})
        raise FailedPreconditionError(f"{sums} lists no {manifest_name}; its bundles: {', '.join(offered) or 'none'}")
    base = sums.rsplit("/", 1)[0] if sums.startswith("https://") else str(Path(sums).parent)
    source = (
        f"{base}/{urllib.parse.quote(manifest_name)}" if sums.startswith("https://") else base + "/" + manifest_name
    )
    bundle = open_bundle(source, cache, digest=digest)
    files = bundle.manifest["files"]
    assert isinstance(files, dict)
    for name, entry in sorted(files.items()):
        want = listed.get(release_asset(arch, fmt, name))
        if want is not None and want != entry["sha256"]:
            raise FailedPreconditionError(
                f"{sums} and {manifest_name} disagree about {release_asset(arch, fmt, name)}; refusing the bundle"
            )
    return bundle
