"""``vz:developer``: built for real with mmdebstrap from the configured Debian archive, once per module (a build
takes minutes), then rebuilt once in a second store to show the digest is reproducible."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from vz_core.errors import UnavailableError
from vz_drivers._images import Image, ImageStore, host_platform, parse_reference
from vz_drivers._images import _developer as developer
from vz_drivers._images._developer import SOURCE_DATE_EPOCH, has_docker_engine, normalize_layer

HOST = str(host_platform())
BUILD_TIMEOUT = 1800

needs_build = pytest.mark.skipif(
    shutil.which("mmdebstrap") is None or os.geteuid() != 0,
    reason="building vz:developer needs mmdebstrap (scripts/install-deps.sh) and root",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[ImageStore, Image, Path]:
    store = ImageStore(tmp_path_factory.mktemp("developer") / "store")

    async def build() -> tuple[Image, Path]:
        image = await store.resolve("vz:developer", platform=HOST)
        return image, await store.rootfs(image)

    image, root = asyncio.run(build())
    return store, image, root


def test_reference_names_the_developer_image() -> None:
    assert str(parse_reference("vz:developer")) == "vz:developer"


def _tar(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in entries:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, *, size: int = 0, mtime: int = 2_000_000_000) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime, info.uname, info.gname = kind, size, mtime, "builder", "builder"
    return info


def test_normalize_sorts_clamps_and_drops_build_state(tmp_path: Path) -> None:
    link = _info("./usr/bin/a-link", tarfile.LNKTYPE)
    link.linkname = "./usr/bin/z-target"
    caps = _info("./usr/bin/ping", size=1)
    caps.pax_headers = {"SCHILY.xattr.security.capability": "x", "atime": "12345"}
    source = _tar(
        [
            (_info("./"), None),
            (_info("./usr/bin/z-target", size=2), b"zz"),
            (link, None),
            (caps, b"p"),
            (_info("./etc/resolv.conf", size=3), b"ns\n"),
            (_info("./var/lib/apt/lists/index", size=1), b"i"),
            (_info("./var/log/dpkg.log", size=1), b"l"),
            (_info("./dev/null", tarfile.CHRTYPE), None),
            (_info("./etc/old", size=1, mtime=5), b"o"),
        ]
    )
    path = tmp_path / "in.tar"
    path.write_bytes(source)
    out = normalize_layer(path)
    assert out == normalize_layer(path)
    with tarfile.open(fileobj=io.BytesIO(out)) as tf:
        members = tf.getmembers()
    names = [m.name for m in members]
    assert names == ["etc/old", "usr/bin/ping", "usr/bin/z-target", "usr/bin/a-link"]
    by_name = {m.name: m for m in members}
    assert by_name["usr/bin/a-link"].linkname == "usr/bin/z-target"
    assert by_name["etc/old"].mtime == 5
    assert by_name["usr/bin/z-target"].mtime == SOURCE_DATE_EPOCH
    assert all(m.uname == "" and m.gname == "" for m in members)
    assert by_name["usr/bin/ping"].pax_headers.get("SCHILY.xattr.security.capability") == "x"
    assert "atime" not in by_name["usr/bin/ping"].pax_headers


def test_missing_mmdebstrap_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vz_drivers._images._developer.shutil.which", lambda name: None)
    with pytest.raises(UnavailableError, match="apt-get install mmdebstrap"):
        developer.find_mmdebstrap()


def test_engine_detection_needs_an_executable_dockerd(tmp_path: Path) -> None:
    assert not has_docker_engine(tmp_path)
    dockerd = tmp_path / "usr" / "bin" / "dockerd"
    dockerd.parent.mkdir(parents=True)
    dockerd.write_text("")
    dockerd.chmod(0o644)
    assert not has_docker_engine(tmp_path)
    dockerd.chmod(0o755)
    assert has_docker_engine(tmp_path)


@needs_build
@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_developer_image_carries_a_docker_engine(built: tuple[ImageStore, Image, Path]) -> None:
    _store, image, root = built
    assert image.ref == "vz:developer" and len(image.layers) == 1
    assert image.config.cmd == ("/bin/bash",)
    assert has_docker_engine(root)
    for tool in ("usr/bin/containerd", "usr/sbin/runc", "usr/bin/docker", "usr/bin/docker-compose", "usr/bin/git"):
        assert (root / tool).is_file(), tool
    assert (root / "usr/sbin/iptables").exists() and (root / "usr/sbin/nft").exists()
    passwd = (root / "etc/passwd").read_text().splitlines()
    assert "dev:x:1000:1000::/home/dev:/bin/bash" in passwd
    docker_group = next(line for line in (root / "etc/group").read_text().splitlines() if line.startswith("docker:"))
    assert docker_group.endswith(":dev")
    assert not (root / "etc/resolv.conf").exists()
    assert not any((root / "var/lib/apt/lists").glob("*Packages*"))
    out = subprocess.run(
        ["chroot", str(root), "/usr/sbin/dockerd", "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith("Docker version 20.10.24")


@needs_build
@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_developer_image_is_cached_and_reproducible(
    built: tuple[ImageStore, Image, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, image, _root = built

    def no_rebuild(*_args: object) -> object:
        raise AssertionError("vz:developer was built again although its recipe did not change")

    with monkeypatch.context() as patch:
        patch.setattr("vz_drivers._images._store.build_developer_image", no_rebuild)
        again = asyncio.run(store.resolve("vz:developer", platform=HOST))
    assert again.digest == image.digest

    fresh = asyncio.run(ImageStore(tmp_path / "second").resolve("vz:developer", platform=HOST))
    assert fresh.digest == image.digest
    assert fresh.layers == image.layers
