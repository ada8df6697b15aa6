from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from images_testlib import Proxy, closed_port, serve_proxy, store_snapshot

from vz_core.errors import (
    NotFoundError,
    PermissionDeniedError,
    RuntimeFailureError,
    UnavailableError,
    UnsupportedError,
)
from vz_drivers._images import ImageConfig, ImageStore, OciLayoutWriter, RegistryCredentials, build_oci_layout

Pusher = Callable[[Path, str, str], str]
CONFIG = ImageConfig(cmd=("/bin/run",), env=("K=V",), working_dir="/w")


def _layout(tmp_path: Path, name: str, *files: tuple[str, str]) -> Path:
    layers = []
    for i, (rel, text) in enumerate(files):
        d = tmp_path / f"{name}-l{i}"
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
        layers.append(d)
    layout = tmp_path / name
    build_oci_layout(layout, layers, config=CONFIG, tag="v1", architecture="amd64")
    return layout


@pytest.fixture
def pushed(tmp_path: Path, pusher: Pusher, request: pytest.FixtureRequest) -> tuple[str, str]:
    """An image in the registry: (repository, manifest digest); the repository is unique per test."""
    repo = "vz/" + request.node.name.replace("_", "-").replace("[", "-").replace("]", "").lower()[:60]
    layout = _layout(tmp_path, "img", ("etc/hello", "hello\n"), ("srv/data", "data\n"))
    return repo, pusher(layout, repo, "v1")


async def test_pull_by_tag_and_by_digest(store: ImageStore, registry: str, pushed: tuple[str, str]) -> None:
    repo, digest = pushed
    image = await store.resolve(f"{registry}/{repo}:v1")
    assert image.digest == digest
    assert image.ref == f"{registry}/{repo}:v1"
    assert image.config == CONFIG
    root = await store.rootfs(image)
    assert (root / "etc" / "hello").read_text() == "hello\n"
    assert (root / "srv" / "data").read_text() == "data\n"

    other = ImageStore(store.root.parent / "other")
    pinned = await other.resolve(f"{registry}/{repo}@{digest}")
    assert (pinned.digest, pinned.layers) == (digest, image.layers)


async def test_multi_platform_index_pull(store: ImageStore, registry: str, tmp_path: Path, pusher: Pusher) -> None:
    d = tmp_path / "layer"
    (d / "arch").parent.mkdir(parents=True, exist_ok=True)
    writer = OciLayoutWriter(tmp_path / "multi")
    descs = []
    for arch in ("amd64", "arm64"):
        (d / "arch").write_text(arch)
        descs.append(writer.add_image([d], architecture=arch))
    writer.tag(writer.add_index(descs), "multi")
    writer.write_index()
    pusher(tmp_path / "multi", "vz/multi", "multi")
    arm = await store.resolve(f"{registry}/vz/multi:multi", platform="linux/arm64")
    assert (arm.digest, arm.architecture) == (descs[1].digest, "arm64")
    assert (await store.rootfs(arm)).joinpath("arch").read_text() == "arm64"
    with pytest.raises(UnsupportedError, match="no image for linux/riscv64"):
        await store.resolve(f"{registry}/vz/multi:multi", platform="linux/riscv64")


async def test_unknown_tag_repository_and_dead_registry(
    store: ImageStore, registry: str, pushed: tuple[str, str]
) -> None:
    repo, _ = pushed
    with pytest.raises(NotFoundError, match=r"not found in registry .*MANIFEST_UNKNOWN"):
        await store.resolve(f"{registry}/{repo}:nope")
    with pytest.raises(NotFoundError, match="check the repository and tag"):
        await store.resolve(f"{registry}/vz/never-pushed:v1")
    with closed_port() as port, pytest.raises(UnavailableError, match="check that it is running"):
        await store.resolve(f"127.0.0.1:{port}/{repo}:v1")
    assert store.list() == []


async def test_tags_are_served_from_the_store_until_refresh(
    store: ImageStore, proxy: Proxy, pushed: tuple[str, str]
) -> None:
    repo, digest = pushed
    ref = f"{proxy.host}/{repo}:v1"
    await store.resolve(ref)
    manifests, blobs = proxy.manifest_gets(), sum(proxy.blob_gets().values())
    assert (await ImageStore(store.root).resolve(ref)).digest == digest
    assert (proxy.manifest_gets(), sum(proxy.blob_gets().values())) == (manifests, blobs)
    assert (await store.resolve(ref, refresh=True)).digest == digest
    assert proxy.manifest_gets() == manifests + 1
    assert sum(proxy.blob_gets().values()) == blobs  # blobs already present are not fetched again


async def test_bearer_token_flow(store: ImageStore, proxy: Proxy, pushed: tuple[str, str]) -> None:
    repo, digest = pushed
    proxy.token_required = True
    image = await store.resolve(f"{proxy.host}/{repo}:v1")
    assert image.digest == digest
    assert proxy.token_requests, "the client never asked the token service"
    assert {r["scope"] for r in proxy.token_requests} == {f"repository:{repo}:pull"}
    assert all(auth.startswith("Bearer ") for path, auth in proxy.authorization_seen if "/blobs/" in path)
    assert all(r["authorization"] == "" for r in proxy.token_requests)  # anonymous: no credentials configured


async def test_bearer_token_with_basic_credentials(tmp_path: Path, proxy: Proxy, pushed: tuple[str, str]) -> None:
    repo, digest = pushed
    proxy.token_required = True
    proxy.basic_credentials = ("alice", "s3cr3t-pass")
    anonymous = ImageStore(tmp_path / "anon")
    with pytest.raises(PermissionDeniedError) as info:
        await anonymous.resolve(f"{proxy.host}/{repo}:v1")
    assert f"credentials for {proxy.host}" in str(info.value)
    creds = RegistryCredentials("alice", "s3cr3t-pass")
    assert "s3cr3t-pass" not in repr(creds)
    wrong = ImageStore(tmp_path / "wrong", credentials={proxy.host: RegistryCredentials("alice", "bad-pass")})
    with pytest.raises(PermissionDeniedError) as info:
        await wrong.resolve(f"{proxy.host}/{repo}:v1")
    assert "bad-pass" not in str(info.value)
    good = ImageStore(tmp_path / "good", credentials={proxy.host: creds})
    assert (await good.resolve(f"{proxy.host}/{repo}:v1")).digest == digest
    assert "s3cr3t-pass" not in repr(good)


async def test_wrong_blob_digest_is_refused_and_discarded(
    store: ImageStore, proxy: Proxy, registry: str, pushed: tuple[str, str]
) -> None:
    repo, digest = pushed
    manifest = json.loads(store_blob_from_registry(registry, repo, digest))
    victim = manifest["layers"][1]["digest"]
    proxy.corrupt_digests.add(victim)
    await store.resolve("vz:default", platform="linux/amd64")
    with pytest.raises(RuntimeFailureError) as info:
        await store.resolve(f"{proxy.host}/{repo}:v1")
    assert f"expected {victim}, got sha256:" in str(info.value)
    assert "discarded" in str(info.value)
    assert not store.has_blob(victim)
    assert list(store.tmp_dir.iterdir()) == []
    assert [i.ref for i in store.list()] == ["vz:default"]
    # the next pull from an honest server completes
    proxy.corrupt_digests.clear()
    assert (await store.resolve(f"{proxy.host}/{repo}:v1")).digest == digest


async def test_wrong_manifest_digest_is_refused(
    store: ImageStore, proxy: Proxy, registry: str, pushed: tuple[str, str], tmp_path: Path, pusher: Pusher
) -> None:
    repo, digest = pushed
    other = _layout(tmp_path, "other", ("x", "other\n"))
    other_digest = pusher(other, "vz/other", "v1")
    proxy.manifest_override = store_blob_from_registry(registry, "vz/other", other_digest)
    await store.resolve("vz:default", platform="linux/amd64")
    before = store_snapshot(store.root)
    with pytest.raises(RuntimeFailureError) as info:
        await store.resolve(f"{proxy.host}/{repo}@{digest}")
    assert f"expected {digest}, got {other_digest}" in str(info.value)
    assert store_snapshot(store.root) == before
    assert [i.ref for i in store.list()] == ["vz:default"]


async def test_concurrent_pulls_share_one_download(tmp_path: Path, proxy: Proxy, pushed: tuple[str, str]) -> None:
    repo, digest = pushed
    ref = f"{proxy.host}/{repo}:v1"
    store = ImageStore(tmp_path / "s")
    twin = ImageStore(tmp_path / "s")  # a second instance on the same root: coordinated by file locks
    images = await asyncio.gather(store.resolve(ref), store.resolve(ref), twin.resolve(ref), twin.resolve(ref))
    assert {i.digest for i in images} == {digest}
    gets = proxy.blob_gets()
    assert len(gets) == 3  # config + two layers
    assert set(gets.values()) == {1}, gets
    roots = await asyncio.gather(*(s.rootfs(images[0]) for s in (store, store, twin)))
    assert len(set(roots)) == 1


async def test_concurrent_pulls_from_separate_processes_share_one_download(
    tmp_path: Path, proxy: Proxy, pushed: tuple[str, str]
) -> None:
    repo, digest = pushed
    ref = f"{proxy.host}/{repo}:v1"
    code = (
        "import asyncio, sys; from pathlib import Path; from vz_drivers._images import ImageStore\n"
        "s = ImageStore(Path(sys.argv[1]))\n"
        "async def main():\n"
        "    img = await s.resolve(sys.argv[2]); await s.rootfs(img); print(img.digest)\n"
        "asyncio.run(main())\n"
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            str(tmp_path / "s"),
            ref,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(3)
    ]
    outputs = [await asyncio.wait_for(p.communicate(), 60) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err.decode()
        assert out.decode().strip() == digest
    assert set(proxy.blob_gets().values()) == {1}, proxy.blob_gets()


async def test_authorization_is_not_forwarded_on_cross_host_redirects(
    store: ImageStore, proxy: Proxy, registry: str, pushed: tuple[str, str]
) -> None:
    repo, digest = pushed
    proxy.token_required = True
    with serve_proxy(registry) as storage:
        # a different host name for the same loopback machine: another origin as far as HTTP is concerned
        proxy.redirect_blobs_to = storage.host.replace("127.0.0.1", "localhost")
        image = await store.resolve(f"{proxy.host}/{repo}:v1")
    assert image.digest == digest
    blob_requests = [(p, a) for p, a in storage.authorization_seen if "/blobs/" in p]
    assert len(blob_requests) == 3
    assert all(auth == "" for _, auth in blob_requests), "a bearer token leaked to the redirect target"


def store_blob_from_registry(registry: str, repo: str, digest: str) -> bytes:
    import http.client

    conn = http.client.HTTPConnection(registry, timeout=10)
    try:
        conn.request(
            "GET", f"/v2/{repo}/manifests/{digest}", headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read()
    finally:
        conn.close()
