"""The vfkit and hyperv drivers run on macOS and Windows: nothing of theirs may name a Linux host's kernel, module
tree, busybox or EFI stub (those come from the verified guest bundle), nor call the helpers that look for them
on the host (the qemu driver's way: ``find_kernel``, ``find_busybox``, ``build_initramfs``)."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

import vz_drivers
from vz_core.registry import DriverDeclaration
from vz_drivers._guest import GUEST_BUSYBOX
from vz_drivers.hyperv import _shares
from vz_drivers.hyperv._scripts import SharesMade
from vz_drivers.hyperv.registration import DECLARATION as HYPERV
from vz_drivers.vfkit.registration import DECLARATION as VFKIT

DRIVERS = ("vfkit", "hyperv")

# Paths of a Linux host system a guest would be assembled from if the driver built it where it runs.
LINUX_HOST_PATH = re.compile(
    r"/boot\b"
    r"|vmlinu[xz]"
    r"|initrd\.img"
    r"|(?:/usr)?/lib/modules\b"
    r"|(?:/usr)?/s?bin/busybox\b"
    r"|/usr/lib/systemd/boot"
    r"|/usr/lib/systemd"
    r"|linux(?:x64|aa64)\.efi\.stub"
    r"|/usr/share/(?:ovmf|qemu|OVMF)"
    r"|/lib/firmware\b"
)

# _guest helpers that read the host's Linux system (kernel, modules, busybox) instead of a bundle.
HOST_LOOKUPS = {"find_kernel", "find_busybox", "build_initramfs"}


def _sources(driver: str) -> list[Path]:
    root = Path(vz_drivers.__file__).parent / driver
    found = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".ps1", ".sh", ".json", ".txt"))
    assert any(p.name == "registration.py" for p in found), f"no sources found under {root}"
    return found


@pytest.mark.parametrize("driver", DRIVERS)
def test_sources_name_no_linux_host_path(driver: str) -> None:
    hits = []
    for path in _sources(driver):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in LINUX_HOST_PATH.finditer(line):
                hits.append(f"{path.name}:{number}: {match.group(0)!r} in {line.strip()!r}")
    assert hits == [], "\n".join(hits)


@pytest.mark.parametrize("driver", DRIVERS)
def test_sources_call_no_host_lookup(driver: str) -> None:
    used = []
    for path in _sources(driver):
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("vz_drivers.qemu"), f"{path.name} imports {node.module}"
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("vz_drivers.qemu") for a in node.names), f"{path.name} imports qemu"
            elif isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            used += [f"{path.name}:{getattr(node, 'lineno', 0)}: {n}" for n in names if n in HOST_LOOKUPS]
    assert used == [], "\n".join(used)


@pytest.mark.parametrize("declaration", [VFKIT, HYPERV], ids=lambda d: d.name)
def test_declared_defaults_name_no_linux_host_path(declaration: DriverDeclaration) -> None:
    options = declaration.options
    assert isinstance(options, Mapping) and options, "the declaration has options"
    for option in options.values():
        for text in (repr(option.default), option.default_text or "", option.help):
            assert not LINUX_HOST_PATH.search(text), f"{declaration.name} option {option.name}: {text!r}"


def test_the_pattern_catches_what_the_drivers_once_named() -> None:
    for path in (
        "/boot/vmlinuz-6.1.0-18-amd64",
        "/lib/modules",
        "/usr/lib/modules/6.1.0",
        "/bin/busybox",
        "/usr/lib/systemd/boot/efi/linuxx64.efi.stub",
    ):
        assert LINUX_HOST_PATH.search(path), path


def test_hyperv_mounts_run_the_bundles_busybox() -> None:
    """The SMB mount exec runs the busybox the guest bundle's initramfs holds (outside the image's root)."""
    made = SharesMade(
        account="HOST\\vz-x", user="vz-x", domain="HOST", host_address="192.0.2.1", shares=(), replaced=()
    )
    share = _shares.Share(name="vz-abc", path="C:\\src", target="/src", read_only=True)
    spec = _shares.mount_spec("ws", made, share, uid=1000, gid=1000)
    assert spec.argv[0] == GUEST_BUSYBOX
    assert f"b={GUEST_BUSYBOX}\n" in spec.argv[3]
