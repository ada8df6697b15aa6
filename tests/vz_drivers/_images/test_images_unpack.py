from __future__ import annotations

import gzip
import hashlib
import os
import stat
import tarfile
from pathlib import Path

import pytest
from images_testlib import Entry, make_tar

from vz_core.errors import InvalidArgumentError, RuntimeFailureError, UnsupportedError
from vz_drivers._images import Image, ImageStore, build_oci_layout

D = tarfile.DIRTYPE
F = tarfile.REGTYPE
L = tarfile.SYMTYPE
H = tarfile.LNKTYPE


async def _image(store: ImageStore, tmp_path: Path, *layers: bytes, compress: bool = True) -> Image:
    layout = tmp_path / f"layout-{hashlib.sha256(b''.join(layers)).hexdigest()[:12]}"
    build_oci_layout(layout, list(layers), tag="t", architecture="amd64", compress=compress)
    return await store.resolve(f"oci:{layout}:t")


def _leftovers(store: ImageStore) -> list[str]:
    return sorted(p.name for p in store.rootfs_dir.iterdir())


async def test_whiteouts_and_opaque_directories(store: ImageStore, tmp_path: Path) -> None:
    lower = make_tar(
        [
            Entry("a/", D, mode=0o755),
            Entry("a/keep", data=b"k"),
            Entry("a/gone", data=b"g"),
            Entry("b/", D, mode=0o755),
            Entry("b/x", data=b"x"),
            Entry("c/", D, mode=0o755),
            Entry("c/old", data=b"o"),
            Entry("c/sub/", D, mode=0o755),
            Entry("c/sub/deep", data=b"d"),
            Entry("d/", D, mode=0o755),
            Entry("d/sub/", D, mode=0o755),
            Entry("d/sub/old", data=b"o"),
        ]
    )
    upper = make_tar(
        [
            Entry("a/.wh.gone"),
            Entry(".wh.b"),
            Entry("c/", D, mode=0o750),
            Entry("c/new", data=b"n"),  # before the marker: must survive it
            Entry("c/.wh..wh..opq"),
            Entry("d/sub/", D, mode=0o755),
            Entry("d/sub/fresh", data=b"f"),
            Entry("d/.wh..wh..opq"),  # opaque d: d/sub comes from this layer, but d/sub/old does not
            Entry("e/.wh.nothing-here"),  # whiteout under a directory that does not exist: ignored
        ]
    )
    root = await store.rootfs(await _image(store, tmp_path, lower, upper))
    assert sorted(os.listdir(root / "a")) == ["keep"]
    assert not (root / "b").exists()
    assert sorted(os.listdir(root / "c")) == ["new"]
    assert stat.S_IMODE((root / "c").stat().st_mode) == 0o750
    assert sorted(os.listdir(root / "d" / "sub")) == ["fresh"]
    assert not any(name.startswith(".wh.") for _, dirs, files in os.walk(root) for name in dirs + files)


async def test_later_layer_replaces_types(store: ImageStore, tmp_path: Path) -> None:
    lower = make_tar([Entry("x/", D), Entry("x/inner", data=b"1"), Entry("y", data=b"file")])
    upper = make_tar([Entry("x", data=b"now a file"), Entry("y/", D), Entry("y/z", data=b"z")])
    root = await store.rootfs(await _image(store, tmp_path, lower, upper))
    assert (root / "x").read_bytes() == b"now a file"
    assert (root / "y" / "z").read_bytes() == b"z"


async def test_modes_ownership_links_and_special_files(store: ImageStore, tmp_path: Path) -> None:
    layer = make_tar(
        [
            Entry("usr/", D, mode=0o755),
            Entry("usr/bin/", D, mode=0o755),
            Entry("usr/bin/suid", data=b"#!", mode=0o4755, uid=0, gid=0),
            Entry("home/", D),
            Entry("home/u/", D, mode=0o700, uid=1234, gid=2345),
            Entry("home/u/f", data=b"mine", mode=0o600, uid=1234, gid=2345),
            Entry("usr/bin/link", L, linkname="suid"),
            Entry("usr/bin/abs", L, linkname="/usr/bin/suid"),
            Entry("usr/bin/hard", H, linkname="usr/bin/suid"),
            Entry("dev/", D),
            Entry("dev/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3),
            Entry("run/", D),
            Entry("run/fifo", tarfile.FIFOTYPE, mode=0o600),
        ]
    )
    root = await store.rootfs(await _image(store, tmp_path, layer))
    suid = (root / "usr" / "bin" / "suid").stat()
    assert stat.S_IMODE(suid.st_mode) == 0o4755
    assert suid.st_mtime == 1_600_000_000
    home = (root / "home" / "u").stat()
    assert (home.st_uid, home.st_gid, stat.S_IMODE(home.st_mode)) == (1234, 2345, 0o700)
    f = (root / "home" / "u" / "f").stat()
    assert (f.st_uid, f.st_gid, stat.S_IMODE(f.st_mode)) == (1234, 2345, 0o600)
    assert os.readlink(root / "usr" / "bin" / "link") == "suid"
    assert os.readlink(root / "usr" / "bin" / "abs") == "/usr/bin/suid"
    assert (root / "usr" / "bin" / "hard").stat().st_ino == suid.st_ino
    assert not (root / "dev" / "null").exists()  # device nodes are skipped; the runtime provides /dev
    assert stat.S_ISFIFO((root / "run" / "fifo").lstat().st_mode)


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        pytest.param([Entry("../evil", data=b"x")], "'..'", id="dotdot-member"),
        pytest.param([Entry("a/../../evil", data=b"x")], "'..'", id="nested-dotdot"),
        pytest.param(
            [Entry("esc", L, linkname="../../../../../../.."), Entry("esc/evil", data=b"x")],
            "escapes the root filesystem",
            id="relative-symlink-escape",
        ),
        pytest.param(
            [Entry("f", data=b"x"), Entry("hl", H, linkname="../../../etc/passwd")],
            "'..'",
            id="hardlink-dotdot",
        ),
        pytest.param([Entry("hl", H, linkname="missing")], "does not exist", id="hardlink-dangling"),
    ],
)
async def test_path_traversal_is_refused(
    store: ImageStore, tmp_path: Path, entries: list[Entry], fragment: str
) -> None:
    image = await _image(store, tmp_path, make_tar(entries))
    with pytest.raises(InvalidArgumentError) as info:
        await store.rootfs(image)
    assert fragment in str(info.value)
    assert image.layers[0] in str(info.value)
    assert _leftovers(store) == []  # no half-unpacked tree, under any name
    assert not (store.root / "evil").exists() and not (tmp_path / "evil").exists()


async def test_absolute_symlink_parent_resolves_inside_the_rootfs(store: ImageStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    layer = make_tar([Entry("target/", D), Entry("abs", L, linkname=str(outside)), Entry("abs/planted", data=b"x")])
    root = await store.rootfs(await _image(store, tmp_path, layer))
    assert not (outside / "planted").exists()
    assert (root / outside.relative_to("/") / "planted").read_bytes() == b"x"


async def test_uncompressed_and_gzip_layers(store: ImageStore, tmp_path: Path) -> None:
    plain = make_tar([Entry("plain", data=b"p")])
    zipped = gzip.compress(make_tar([Entry("zipped", data=b"z")]))
    root = await store.rootfs(await _image(store, tmp_path, plain, zipped, compress=False))
    assert (root / "plain").read_bytes() == b"p" and (root / "zipped").read_bytes() == b"z"


async def test_zstd_layer_is_unsupported(store: ImageStore, tmp_path: Path) -> None:
    image = await _image(store, tmp_path, b"\x28\xb5\x2f\xfd" + b"\0" * 64, compress=False)
    with pytest.raises(UnsupportedError, match="zstd"):
        await store.rootfs(image)


async def test_garbage_layer_is_a_clear_error(store: ImageStore, tmp_path: Path) -> None:
    image = await _image(store, tmp_path, os.urandom(3000), compress=False)
    with pytest.raises(InvalidArgumentError, match="not a valid"):
        await store.rootfs(image)
    assert _leftovers(store) == []


@pytest.mark.parametrize("where", ["middle", "last"])
async def test_corrupted_stored_blob_is_detected_and_removed(store: ImageStore, tmp_path: Path, where: str) -> None:
    image = await _image(store, tmp_path, make_tar([Entry("f", data=os.urandom(4000))]))
    blob = store.blob_path(image.layers[0])
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2 if where == "middle" else -1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(RuntimeFailureError, match=f"expected {image.layers[0]}"):
        await store.rootfs(image)
    assert not blob.exists()
    assert _leftovers(store) == []
