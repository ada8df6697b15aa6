"""Guest bundles without building one: the manifest check, the cache by digest, the flat (release) layout, and
the vfkit and hyperv drivers refusing a missing or wrong bundle before anything is created. Building from the
pinned packages (and twice giving the same bytes) is tested where the bundles boot:
tests/vz_drivers/vfkit/test_vfkit_arm64_boot.py (arm64 vfkit) and tests/vz_drivers/hyperv/test_hyperv_guest.py
(amd64 hyperv)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from vz_core.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from vz_drivers._guest import MANIFEST, open_bundle, verify_bundle, write_bundle

FILES = {"Image": b"kernel bytes", "initramfs.cpio": b"initramfs bytes"}
ROLES = {"kernel": "Image", "initrd": "initramfs.cpio"}


def _bundle(root: Path, arch: str = "arm64", fmt: str = "vfkit") -> Path:
    return write_bundle(root, FILES, arch=arch, fmt=fmt, roles=ROLES).root


def test_the_manifest_names_every_file_by_sha256(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    manifest = json.loads((root / MANIFEST).read_text())
    assert manifest["files"]["Image"] == {"sha256": hashlib.sha256(b"kernel bytes").hexdigest(), "size": 12}
    bundle = verify_bundle(root)
    assert bundle.digest == hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()
    assert bundle.file("kernel") == root / "Image"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda r: (r / "Image").write_bytes(b"kernel bytez"), "Image does not match its manifest"),
        (lambda r: (r / "initramfs.cpio").unlink(), "initramfs.cpio is missing"),
        (lambda r: (r / "extra").write_bytes(b""), "extra is not in its manifest"),
    ],
)
def test_a_changed_missing_or_extra_file_is_refused_naming_it(tmp_path: Path, change: object, named: str) -> None:
    root = _bundle(tmp_path / "b")
    change(root)  # type: ignore[operator]
    with pytest.raises(FailedPreconditionError, match=named):
        verify_bundle(root)


def test_a_manifest_cannot_name_a_file_outside_the_bundle(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["files"]["../escape"] = manifest["files"].pop("Image")
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(FailedPreconditionError, match=r"bad file entry '\.\./escape'"):
        open_bundle(str(root), tmp_path / "cache")
    assert not (tmp_path / "escape").exists()


def test_open_caches_by_digest_and_checks_the_pin(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    digest = verify_bundle(root).digest
    cached = open_bundle(str(root), tmp_path / "cache", digest=digest)
    assert cached.root == tmp_path / "cache" / digest and cached.file("initrd").read_bytes() == FILES["initramfs.cpio"]
    with pytest.raises(FailedPreconditionError, match="not the pinned"):
        open_bundle(str(root), tmp_path / "cache", digest="0" * 64)
    # the cached copy is checked again at every use
    (cached.root / "Image").write_bytes(b"tampered")
    with pytest.raises(FailedPreconditionError, match="Image does not match"):
        open_bundle(str(root), tmp_path / "cache")
    with pytest.raises(InvalidArgumentError, match="absolute path"):
        open_bundle("relative/bundle", tmp_path / "cache")


def test_the_flat_release_layout_is_read_by_its_manifest_name(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    flat = tmp_path / "release"
    flat.mkdir()
    for p in root.iterdir():
        shutil.copy(p, flat / f"vz-guest-arm64-vfkit.{p.name}")
    bundle = open_bundle(str(flat / "vz-guest-arm64-vfkit.manifest.json"), tmp_path / "cache")
    assert sorted(p.name for p in bundle.root.iterdir()) == ["Image", "initramfs.cpio", MANIFEST]


async def test_vfkit_needs_a_bundle_of_its_format_and_architecture(tmp_path: Path) -> None:
    from vz_drivers.vfkit._backend import VfkitBackend
    from vz_drivers.vfkit._host import HostSupport

    mac = HostSupport(
        system="Darwin", macos_version=(15, 1), architecture="arm64", reason="", rosetta=False, nested=False
    )
    none = VfkitBackend(host=mac, state_dir=str(tmp_path / "s"))
    with pytest.raises(UnavailableError, match="needs the option guest=<bundle>"):
        none._open_guest()
    wrong = VfkitBackend(host=mac, state_dir=str(tmp_path / "s"), guest=str(_bundle(tmp_path / "h", "amd64", "hyperv")))
    with pytest.raises(FailedPreconditionError, match="is for amd64 hyperv; this host needs arm64 vfkit"):
        wrong._open_guest()
    right = VfkitBackend(host=mac, state_dir=str(tmp_path / "s"), guest=str(_bundle(tmp_path / "v")))
    assert right._open_guest().format == "vfkit"


def test_the_vfkit_and_hyperv_declarations_name_no_host_linux_path() -> None:
    from vz_drivers.hyperv.registration import DECLARATION as HYPERV
    from vz_drivers.vfkit.registration import DECLARATION as VFKIT

    for declaration in (HYPERV, VFKIT):
        names = set(declaration.options)
        assert {"guest", "guest_sha256"} <= names
        assert not names & {"kernel", "initrd", "modules", "busybox", "efi_stub"}
        for option in declaration.options.values():
            for host_path in ("/boot", "/lib/modules", "/bin/busybox", "systemd/boot"):
                assert host_path not in f"{option.default} {option.help}", (declaration.name, option.name)
