"""APFS clones and the base store: refused off macOS, the clone errors, Machine files from a base, restore
images verified by SHA-256 (downloads kept only when they match)."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from vz_core.errors import FailedPreconditionError, UnsupportedError
from vz_drivers.macos_vm._bases import ResolvedBase
from vz_drivers.macos_vm._clone import CLONE_NOFOLLOW, clone_file, libc_clonefile
from vz_drivers.macos_vm._install import BaseStore, InstalledBase


class CopyingClone:
    """Plays clonefile(2): copies the file (this host has no APFS) and records the call."""

    def __init__(self, fail_with: int = 0) -> None:
        self.calls: list[tuple[bytes, bytes, int]] = []
        self.fail_with = fail_with

    def __call__(self, src: bytes, dst: bytes, flags: int) -> int:
        self.calls.append((src, dst, flags))
        if self.fail_with:
            ctypes.set_errno(self.fail_with)
            return -1
        shutil.copyfile(src, dst)
        return 0


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal on hosts without clonefile")
def test_clonefile_is_refused_off_macos(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="macOS only"):
        libc_clonefile()
    (tmp_path / "a").write_bytes(b"x")
    with pytest.raises(UnsupportedError):
        clone_file(tmp_path / "a", tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_clone_calls_clonefile_without_following_links(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"disk")
    fake = CopyingClone()
    clone_file(tmp_path / "a", tmp_path / "b", clonefile=fake)
    assert fake.calls == [(bytes(tmp_path / "a"), bytes(tmp_path / "b"), CLONE_NOFOLLOW)]
    assert (tmp_path / "b").read_bytes() == b"disk"
    with pytest.raises(FileExistsError):
        clone_file(tmp_path / "a", tmp_path / "b", clonefile=fake)
    assert len(fake.calls) == 1


@pytest.mark.parametrize(
    ("err", "kind", "text"),
    [
        (errno.EXDEV, FailedPreconditionError, "one APFS volume"),
        (errno.ENOTSUP, FailedPreconditionError, "not APFS"),
        (errno.EACCES, OSError, "clonefile failed"),
    ],
    ids=["other-volume", "not-apfs", "other"],
)
def test_clone_failures_say_what_to_do(tmp_path: Path, err: int, kind: type[Exception], text: str) -> None:
    (tmp_path / "a").write_bytes(b"disk")
    with pytest.raises(kind, match=text):
        clone_file(tmp_path / "a", tmp_path / "b", clonefile=CopyingClone(fail_with=err))


def _installed(store: BaseStore, base_id: str = "macos-15.1-24B83", *, provisioned: bool = True) -> InstalledBase:
    root = store.bases_dir / base_id
    root.mkdir(parents=True)
    (root / "disk.img").write_bytes(b"system disk")
    (root / "aux.img").write_bytes(b"nvram")
    (root / "hardware-model.bin").write_bytes(b"hw")
    marker = {"sha256": "ab" * 32, "build": "24B83", "min_cpus": 2, "min_memory": 4 << 30}
    (root / "installed.json").write_text(json.dumps(marker))
    if provisioned:
        (root / "provisioned").touch()
    found = store.installed(base_id)
    assert found is not None
    return found


def test_an_installed_base_is_read_from_its_marker(tmp_path: Path) -> None:
    store = BaseStore(tmp_path)
    assert store.installed("macos-15.1-24B83") is None
    base = _installed(store, provisioned=False)
    assert (base.build, base.min_cpus, base.min_memory, base.provisioned) == ("24B83", 2, 4 << 30, False)
    (base.root / "provisioned").touch()
    assert store.installed(base.base_id).provisioned is True  # type: ignore[union-attr]
    (base.root / "installed.json").write_text("{half")
    assert store.installed(base.base_id) is None


def test_a_machine_clones_disk_and_nvram_and_gets_its_own_identifier(tmp_path: Path) -> None:
    store = BaseStore(tmp_path)
    base = _installed(store)
    fake = CopyingClone()
    machine = tmp_path / "machines" / "k"
    machine.mkdir(parents=True)
    files = store.clone_machine(base, machine, b"identifier-1", clonefile=fake)
    assert [Path(dst.decode()).name for _src, dst, _f in fake.calls] == ["disk.img", "aux.img"]
    assert files["disk.img"].read_bytes() == b"system disk"
    assert files["hardware-model.bin"].read_bytes() == b"hw"
    assert files["machine-identifier.bin"].read_bytes() == b"identifier-1"
    assert files["machine-identifier.bin"].stat().st_mode & 0o777 == 0o600


def test_a_local_restore_image_must_match_its_pin(tmp_path: Path) -> None:
    store = BaseStore(tmp_path)
    ipsw = tmp_path / "Restore.ipsw"
    ipsw.write_bytes(b"restore image")
    digest = hashlib.sha256(b"restore image").hexdigest()
    assert store.restore_image(ResolvedBase("b", True, sha256=digest, source=str(ipsw))) == (ipsw, digest)
    with pytest.raises(FailedPreconditionError, match=f"has SHA-256 {digest}, not the pinned"):
        store.restore_image(ResolvedBase("b", True, sha256="0" * 64, source=str(ipsw)))
    unpinned = store.restore_image(ResolvedBase("b", False, source=str(ipsw)))
    assert unpinned == (ipsw, digest)
    with pytest.raises(FailedPreconditionError, match="does not exist"):
        store.restore_image(ResolvedBase("b", True, sha256=digest, source=str(tmp_path / "missing.ipsw")))


def test_a_download_is_kept_by_digest_only_when_it_matches(tmp_path: Path) -> None:
    store = BaseStore(tmp_path)
    payload = b"downloaded restore image"
    digest = hashlib.sha256(payload).hexdigest()
    fetched: list[str] = []

    def fetch(url: str, target: Path) -> None:
        fetched.append(url)
        target.write_bytes(payload)

    url = "https://updates.example.test/R.ipsw"
    path, found = store.restore_image(ResolvedBase("b", True, sha256=digest, source=url), fetch=fetch)
    assert (path, found) == (store.ipsw_dir / f"{digest}.ipsw", digest)
    store.restore_image(ResolvedBase("b", True, sha256=digest, source=url), fetch=fetch)
    assert fetched == [url]  # the second use finds it
    with pytest.raises(FailedPreconditionError, match="nothing was kept"):
        store.restore_image(ResolvedBase("c", True, sha256="1" * 64, source=url), fetch=fetch)
    assert sorted(p.name for p in store.ipsw_dir.iterdir()) == [f"{digest}.ipsw"]
    with pytest.raises(FailedPreconditionError, match="pinned by SHA-256"):
        store.restore_image(ResolvedBase("d", False, source=url), fetch=fetch)
    with pytest.raises(UnsupportedError, match="fetchLatestSupported"):
        store.restore_image(ResolvedBase("latest", False, source="latest"))
