from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from vz_core.errors import UnavailableError, UnsupportedError
from vz_drivers._images import DEFAULT_REF, ImageStore, host_platform

HOST = str(host_platform())


async def test_default_image_config_and_layout(store: ImageStore) -> None:
    image = await store.resolve(DEFAULT_REF, platform=HOST)
    assert image.ref == "vz:default"
    assert image.digest.startswith("sha256:") and len(image.digest) == 71
    assert image.config.cmd == ("/bin/sh",)
    assert image.config.entrypoint == ()
    assert any(e.startswith("PATH=") and "/bin" in e for e in image.config.env)
    assert image.os == "linux" and image.architecture == host_platform().architecture
    assert len(image.layers) == 1

    root = await store.rootfs(image)
    assert root == store.root / "rootfs" / image.digest.removeprefix("sha256:")
    busybox = root / "bin" / "busybox"
    assert busybox.is_file() and busybox.stat().st_mode & 0o111
    assert os.readlink(root / "bin" / "sh") == "busybox"
    assert os.readlink(root / "usr" / "bin" / "env") == "/bin/busybox"
    passwd = (root / "etc" / "passwd").read_text().splitlines()
    assert "root:x:0:0:root:/root:/bin/sh" in passwd
    assert "dev:x:1000:1000:dev:/home/dev:/bin/sh" in passwd
    assert any(line.startswith("nobody:x:65534:65534:") for line in passwd)
    group = (root / "etc" / "group").read_text().splitlines()
    assert {"root:x:0:", "dev:x:1000:", "nobody:x:65534:"} <= set(group)
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777
    home = (root / "home" / "dev").stat()
    assert (home.st_uid, home.st_gid) == (1000, 1000)


async def test_default_image_digest_is_stable_across_builds(tmp_path: Path) -> None:
    first = await ImageStore(tmp_path / "a").resolve(DEFAULT_REF, platform=HOST)
    second = await ImageStore(tmp_path / "b").resolve(DEFAULT_REF, platform=HOST)
    assert first.digest == second.digest
    assert first.layers == second.layers
    layer = first.layers[0].removeprefix("sha256:")
    assert (tmp_path / "a" / "blobs" / "sha256" / layer).read_bytes() == (
        tmp_path / "b" / "blobs" / "sha256" / layer
    ).read_bytes()


@pytest.mark.root
async def test_default_rootfs_runs_busybox_shell(store: ImageStore) -> None:
    root = await store.rootfs(await store.resolve(DEFAULT_REF, platform=HOST))
    out = await asyncio.to_thread(
        subprocess.run,
        [
            shutil.which("chroot") or "/usr/sbin/chroot",
            str(root),
            "/bin/sh",
            "-c",
            "echo hello from $(id -un); ls /home",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["hello", "from", "root", "dev"]


async def test_default_image_is_cached_after_the_first_use(store: ImageStore) -> None:
    image = await store.resolve(DEFAULT_REF, platform=HOST)
    root = await store.rootfs(image)
    index_mtime = store.index_path.stat().st_mtime_ns
    root_inode = root.stat().st_ino
    again = await ImageStore(store.root).resolve(DEFAULT_REF, platform=HOST)
    assert again == image
    assert store.index_path.stat().st_mtime_ns == index_mtime  # nothing rebuilt or re-recorded
    assert (await store.rootfs(again)).stat().st_ino == root_inode


async def test_default_image_is_rebuilt_when_busybox_changes(
    store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "busybox"
    shutil.copy2("/bin/busybox", copy)
    monkeypatch.setenv("VZ_BUSYBOX", str(copy))
    first = await store.resolve(DEFAULT_REF, platform=HOST)
    entry_before = store.index_path.read_text()
    os.utime(copy, ns=(1, 1))
    second = await store.resolve(DEFAULT_REF, platform=HOST)
    assert second.digest == first.digest  # same bytes, same digest
    assert store.index_path.read_text() != entry_before  # the new stamp was recorded


async def test_missing_busybox_is_unavailable_with_install_hint(
    store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VZ_BUSYBOX", str(tmp_path / "nope"))
    with pytest.raises(UnavailableError, match="apt-get install busybox-static"):
        await store.resolve(DEFAULT_REF, platform=HOST)
    assert not store.index_path.exists()


async def test_dynamic_busybox_is_refused(store: ImageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VZ_BUSYBOX", "/bin/ls")  # dynamically linked on Debian
    with pytest.raises(UnavailableError, match="not a statically linked busybox"):
        await store.resolve(DEFAULT_REF, platform=HOST)


async def test_default_image_for_another_platform_is_unsupported(store: ImageStore) -> None:
    other = "linux/arm64" if host_platform().architecture != "arm64" else "linux/amd64"
    with pytest.raises(UnsupportedError, match=other):
        await store.resolve(DEFAULT_REF, platform=other)
