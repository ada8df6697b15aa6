from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

import vz_drivers._images as images
from vz_core.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from vz_drivers._images import ImageStore, build_oci_layout, default_store_root, host_platform
from vz_drivers._images._reference import RegistryRef
from vz_drivers._images._registry import RegistryClient

HOST = str(host_platform())


def test_public_api_is_curated() -> None:
    assert sorted(images.__all__) == sorted(
        [
            "DEFAULT_CONFIG",
            "DEFAULT_REF",
            "DefaultRef",
            "Descriptor",
            "DockerArchiveRef",
            "E2FSPROGS_HINT",  # the ext4 writer of root disks (layers to ext4), used by the shared guest builder
            "Image",
            "ImageConfig",
            "ImageReference",
            "ImageStore",
            "OciLayoutRef",
            "OciLayoutWriter",
            "Platform",
            "RegistryCredentials",
            "RegistryRef",
            "build_docker_archive",
            "build_oci_layout",
            "default_store_root",
            "file_lock",
            "find_e2fs_tool",  # the polled cross-process flock, also used by linux_native's cgroup parent
            "host_platform",
            "layer_tar",
            "parse_reference",
            "write_ext4",
        ]
    )
    for name in images.__all__:
        assert getattr(images, name) is not None


def test_default_root_follows_vz_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VZ_HOME", str(tmp_path))
    assert default_store_root() == tmp_path / "cache" / "images"
    assert ImageStore().root == tmp_path / "cache" / "images"


async def test_image_values_are_frozen(store: ImageStore) -> None:
    image = await store.resolve("vz:default", platform=HOST)
    with pytest.raises(dataclasses.FrozenInstanceError):
        image.digest = "x"  # type: ignore[misc]
    assert image.platform == HOST


async def test_store_layout_is_content_addressed(store: ImageStore) -> None:
    image = await store.resolve("vz:default", platform=HOST)
    for digest in (image.digest, image.config_digest, *image.layers):
        blob = store.root / "blobs" / "sha256" / digest.removeprefix("sha256:")
        assert blob.is_file()
        assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == digest
    assert list(store.tmp_dir.iterdir()) == []


async def test_remove_collects_only_unshared_blobs(store: ImageStore, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "etc").mkdir(parents=True)
    (shared / "etc" / "base").write_text("base")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "only-b").write_text("b")
    build_oci_layout(tmp_path / "a", [shared], tag="a", architecture="amd64")
    build_oci_layout(tmp_path / "b", [shared, extra], tag="b", architecture="amd64")
    a = await store.resolve(f"oci:{tmp_path / 'a'}:a")
    b = await store.resolve(f"oci:{tmp_path / 'b'}:b")
    root_b = await store.rootfs(b)
    assert a.layers[0] == b.layers[0]

    assert await store.remove(f"oci:{tmp_path / 'b'}:b") is True
    assert not root_b.exists()
    assert store.has_blob(a.layers[0]) and store.has_blob(a.digest)
    assert not store.has_blob(b.layers[1]) and not store.has_blob(b.digest)
    assert [i.ref for i in store.list()] == [f"oci:{tmp_path / 'a'}:a"]
    assert await store.remove(f"oci:{tmp_path / 'b'}:b") is False
    with pytest.raises(InvalidArgumentError):
        await store.remove("not a ref")


async def test_rootfs_of_an_image_not_in_the_store_is_not_found(store: ImageStore, tmp_path: Path) -> None:
    image = await ImageStore(tmp_path / "elsewhere").resolve("vz:default", platform=HOST)
    with pytest.raises(NotFoundError, match="resolve it first"):
        await store.rootfs(image)


async def test_unreadable_index_is_treated_as_empty(store: ImageStore) -> None:
    await store.resolve("vz:default", platform=HOST)
    store.index_path.write_text("{not json")
    assert store.list() == []
    assert (await store.resolve("vz:default", platform=HOST)).ref == "vz:default"
    assert [i.ref for i in store.list()] == ["vz:default"]


def test_plain_http_policy() -> None:
    client = RegistryClient(insecure_registries=frozenset({"lab.test:5000"}), credentials=lambda h: None, timeout=5)
    assert client.plain_http_allowed("127.0.0.1:5000")
    assert client.plain_http_allowed("localhost")
    assert client.plain_http_allowed("[::1]:5000")
    assert client.plain_http_allowed("lab.test:5000")
    assert not client.plain_http_allowed("registry.example.test")
    assert not client.plain_http_allowed("10.0.0.1:5000")
    # a non-loopback host is never contacted over plain http, even when a redirect asks for it
    with pytest.raises(PermissionDeniedError, match="refusing plain http"):
        client._connect("http://registry.example.test/v2/")


def test_token_realm_over_plain_http_is_refused_for_remote_hosts() -> None:
    client = RegistryClient(insecure_registries=frozenset(), credentials=lambda h: ("u", "p"), timeout=5)
    ref = RegistryRef("registry.example.test", "app")
    with pytest.raises(PermissionDeniedError, match="plain http"):
        client._fetch_token(ref, {"realm": "http://auth.example.test/token"}, "repository:app:pull", ("u", "p"))
