from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from images_testlib import store_snapshot

from vz_core.errors import InvalidArgumentError, NotFoundError, RuntimeFailureError, UnsupportedError
from vz_drivers._images import (
    ImageConfig,
    ImageStore,
    OciLayoutWriter,
    build_docker_archive,
    build_oci_layout,
)

CONFIG = ImageConfig(
    entrypoint=("/bin/app",), cmd=("--serve",), env=("A=1", "B=two"), working_dir="/srv", user="1000:1000"
)


def _tree(base: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return base


@pytest.fixture
def two_layers(tmp_path: Path) -> list[Path]:
    lower = _tree(tmp_path / "l1", {"etc/motd": "lower\n", "srv/data.txt": "v1\n", "bin/app": "#!/bin/sh\n"})
    (lower / "bin" / "app").chmod(0o755)
    upper = _tree(tmp_path / "l2", {"srv/data.txt": "v2\n", "srv/new.txt": "new\n"})
    return [lower, upper]


async def test_oci_layout_import_by_tag(store: ImageStore, tmp_path: Path, two_layers: list[Path]) -> None:
    layout = tmp_path / "layout"
    digest = build_oci_layout(layout, two_layers, config=CONFIG, tag="v1", architecture="amd64")
    image = await store.resolve(f"oci:{layout}:v1")
    assert image.digest == digest
    assert image.ref == f"oci:{layout}:v1"
    assert image.config == CONFIG
    assert (image.os, image.architecture) == ("linux", "amd64")
    assert len(image.layers) == 2
    assert all(store.has_blob(d) for d in image.layers)
    root = await store.rootfs(image)
    assert (root / "srv" / "data.txt").read_text() == "v2\n"
    assert (root / "srv" / "new.txt").read_text() == "new\n"
    assert (root / "etc" / "motd").read_text() == "lower\n"
    assert os.access(root / "bin" / "app", os.X_OK)
    assert [i.ref for i in store.list()] == [f"oci:{layout}:v1"]


async def test_oci_layout_by_digest_and_untagged(store: ImageStore, tmp_path: Path, two_layers: list[Path]) -> None:
    layout = tmp_path / "layout"
    digest = build_oci_layout(layout, two_layers, tag=None, architecture="amd64")
    assert (await store.resolve(f"oci:{layout}")).digest == digest
    assert (await store.resolve(f"oci:{layout}@{digest}")).digest == digest


async def test_oci_layout_reimport_copies_nothing(store: ImageStore, tmp_path: Path, two_layers: list[Path]) -> None:
    layout = tmp_path / "layout"
    build_oci_layout(layout, two_layers, tag="v1", architecture="amd64")
    image = await store.resolve(f"oci:{layout}:v1")
    inodes = {d: store.blob_path(d).stat().st_ino for d in image.layers}
    await ImageStore(store.root).resolve(f"oci:{layout}:v1")
    assert {d: store.blob_path(d).stat().st_ino for d in image.layers} == inodes


async def test_oci_layout_errors(store: ImageStore, tmp_path: Path, two_layers: list[Path]) -> None:
    layout = tmp_path / "layout"
    build_oci_layout(layout, two_layers, tag="v1", architecture="amd64")
    with pytest.raises(NotFoundError, match="no tag 'v2'; its tags: v1"):
        await store.resolve(f"oci:{layout}:v2")
    with pytest.raises(NotFoundError, match="does not exist"):
        await store.resolve(f"oci:{tmp_path}/missing")
    with pytest.raises(InvalidArgumentError, match="not an OCI image layout"):
        await store.resolve(f"oci:{two_layers[0]}")
    with pytest.raises(UnsupportedError, match="linux/amd64 image, not linux/arm64"):
        await store.resolve(f"oci:{layout}:v1", platform="linux/arm64")
    assert store.list() == []


async def test_multi_platform_layout_selects_the_requested_platform(
    store: ImageStore, tmp_path: Path, two_layers: list[Path]
) -> None:
    writer = OciLayoutWriter(tmp_path / "multi")
    amd = writer.add_image([two_layers[0]], architecture="amd64")
    arm = writer.add_image([two_layers[1]], architecture="arm64")
    writer.tag(writer.add_index([amd, arm]), "multi")
    writer.write_index()
    ref = f"oci:{tmp_path / 'multi'}:multi"
    assert (await store.resolve(ref, platform="linux/amd64")).digest == amd.digest
    arm_image = await store.resolve(ref, platform="linux/arm64")
    assert (arm_image.digest, arm_image.architecture) == (arm.digest, "arm64")
    with pytest.raises(UnsupportedError, match=r"no image for linux/s390x; it has: linux/amd64, linux/arm64"):
        await store.resolve(ref, platform="linux/s390x")
    assert {(i.ref, i.architecture) for i in store.list()} == {(ref, "amd64"), (ref, "arm64")}


async def test_corrupt_layout_blob_is_refused_and_store_unchanged(
    store: ImageStore, tmp_path: Path, two_layers: list[Path]
) -> None:
    layout = tmp_path / "layout"
    build_oci_layout(layout, two_layers, tag="v1", architecture="amd64")
    await store.resolve("vz:default", platform="linux/amd64")
    before = store_snapshot(store.root)
    manifest = json.loads(
        (
            layout / "blobs" / "sha256" / json.loads((layout / "index.json").read_text())["manifests"][0]["digest"][7:]
        ).read_text()
    )
    victim = layout / "blobs" / "sha256" / manifest["layers"][1]["digest"][7:]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(RuntimeFailureError) as info:
        await store.resolve(f"oci:{layout}:v1")
    message = str(info.value)
    assert f"expected {manifest['layers'][1]['digest']}" in message and "got sha256:" in message
    assert store_snapshot(store.root) == before


async def test_docker_archive_import(store: ImageStore, tmp_path: Path, two_layers: list[Path]) -> None:
    archive = tmp_path / "img.tar"
    image_id = build_docker_archive(archive, two_layers, config=CONFIG, repo_tags=["team/app:1"], architecture="amd64")
    image = await store.resolve(f"docker-archive:{archive}:team/app:1")
    assert image.config == CONFIG
    assert image.config_digest == image_id
    root = await store.rootfs(image)
    assert (root / "srv" / "data.txt").read_text() == "v2\n"
    assert (root / "etc" / "motd").read_text() == "lower\n"
    # the single image is also found without a name, and the same archive gives the same digest
    assert (await store.resolve(f"docker-archive:{archive}")).digest == image.digest
    with pytest.raises(NotFoundError, match="no image tagged 'team/app:2'; its tags: team/app:1"):
        await store.resolve(f"docker-archive:{archive}:team/app:2")
    with pytest.raises(NotFoundError, match="does not exist"):
        await store.resolve(f"docker-archive:{tmp_path}/none.tar")


async def test_docker_archive_is_reimported_only_when_the_file_changes(
    store: ImageStore, tmp_path: Path, two_layers: list[Path]
) -> None:
    archive = tmp_path / "img.tar"
    build_docker_archive(archive, two_layers, repo_tags=["app:1"], architecture="amd64")
    await store.resolve(f"docker-archive:{archive}")
    recorded = store.index_path.stat().st_mtime_ns
    await store.resolve(f"docker-archive:{archive}")
    assert store.index_path.stat().st_mtime_ns == recorded
    build_docker_archive(archive, [two_layers[0]], repo_tags=["app:1"], architecture="amd64")
    changed = await store.resolve(f"docker-archive:{archive}")
    assert len(changed.layers) == 1


@pytest.mark.parametrize("damage", ["truncate", "garbage", "layer-bytes"])
async def test_corrupt_docker_archive_is_refused_and_store_unchanged(
    store: ImageStore, tmp_path: Path, two_layers: list[Path], damage: str
) -> None:
    archive = tmp_path / "img.tar"
    build_docker_archive(archive, two_layers, repo_tags=["app:1"], architecture="amd64")
    data = archive.read_bytes()
    if damage == "truncate":
        archive.write_bytes(data[: len(data) // 2])
        expected: type[Exception] = InvalidArgumentError
    elif damage == "garbage":
        archive.write_bytes(os.urandom(4096))
        expected = InvalidArgumentError
    else:  # flip a byte inside the first layer's file content: its diff_id no longer matches
        pos = data.index(b"lower\n")
        archive.write_bytes(data[:pos] + b"LOWER\n" + data[pos + 6 :])
        expected = RuntimeFailureError
    await store.resolve("vz:default", platform="linux/amd64")
    before = store_snapshot(store.root)
    with pytest.raises(expected) as info:
        await store.resolve(f"docker-archive:{archive}")
    assert str(archive) in str(info.value) or "expected sha256:" in str(info.value)
    if damage != "layer-bytes":
        assert "docker save" in str(info.value)
    assert store_snapshot(store.root) == before


async def test_docker_archive_written_by_skopeo_imports(
    store: ImageStore, tmp_path: Path, two_layers: list[Path]
) -> None:
    layout = tmp_path / "layout"
    digest = build_oci_layout(layout, two_layers, config=CONFIG, tag="v1", architecture="amd64")
    archive = tmp_path / "skopeo.tar"
    proc = await asyncio.to_thread(
        subprocess.run,
        [
            "skopeo",
            "--override-arch",
            "amd64",
            "copy",
            "-q",
            f"oci:{layout}:v1",
            f"docker-archive:{archive}:team/app:v1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    image = await store.resolve(f"docker-archive:{archive}:team/app:v1")
    assert image.config == CONFIG
    assert image.digest != digest  # docker-archive has no manifest: vz writes its own over the same layers
    root = await store.rootfs(image)
    assert (root / "srv" / "data.txt").read_text() == "v2\n"
