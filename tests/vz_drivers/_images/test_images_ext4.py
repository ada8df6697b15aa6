"""The ext4 root disk written from layer tar streams (``vz_drivers._images._ext4``), by a user who is not root.

The writer runs as ``nobody`` (``setpriv``), and the disk is read back with ``debugfs`` (``stat``, ``ls``,
``ea_list``, ``dump``): every entry of the merged layers must be on it with its tar header's name, type, uid,
gid, mode, mtime, xattrs, device numbers, symlink target, link count and content, and nothing else.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vz_core.errors import InvalidArgumentError
from vz_drivers._images._ext4 import write_ext4

pytestmark = pytest.mark.skipif(
    shutil.which("debugfs") is None or shutil.which("mke2fs") is None, reason="e2fsprogs (debugfs, mke2fs) missing"
)

NOBODY = 65534
CAP_NET_RAW = bytes.fromhex("0100000200200000000000000000000000000000")  # vfs_cap_data v2, +ep


def _ti(name: str, kind: bytes = tarfile.REGTYPE, **kw: object) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    ti.mtime = 1_700_000_000
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


def _layer(dest: Path, entries: list[tuple[tarfile.TarInfo, bytes]]) -> tuple[str, Path]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for ti, data in entries:
            if ti.isreg():
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                tf.addfile(ti)
    blob = gzip.compress(buf.getvalue(), mtime=0)
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    path = dest / digest[7:]
    path.write_bytes(blob)
    return digest, path


def _layers(dest: Path) -> list[tuple[str, Path]]:
    lower = [
        (_ti(".", tarfile.DIRTYPE), b""),
        (_ti("bin", tarfile.DIRTYPE), b""),
        (_ti("bin/su", mode=0o4755), b"\x7fELF setuid root"),
        (_ti("bin/wall", mode=0o2755, gid=5), b"setgid tty"),
        (_ti("tmp", tarfile.DIRTYPE, mode=0o1777), b""),
        (_ti("home", tarfile.DIRTYPE), b""),
        (_ti("home/dev", tarfile.DIRTYPE, mode=0o700, uid=1000, gid=1000), b""),
        (_ti("home/dev/.profile", uid=1000, gid=1000, mode=0o600), b"export PS1=dev\n"),
        (_ti("home/dev/Makefile", uid=1000, gid=1000), b"upper case\n"),
        (_ti("home/dev/makefile", uid=1000, gid=1000), b"lower case\n"),
        (_ti("big", uid=100000, gid=100001), b"x" * 300_000),
        (_ti("dev", tarfile.DIRTYPE), b""),
        (_ti("dev/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3), b""),
        (_ti("dev/sda1", tarfile.BLKTYPE, mode=0o660, gid=6, devmajor=8, devminor=1), b""),
        (_ti("dev/initctl", tarfile.FIFOTYPE, mode=0o600), b""),
        (_ti("usr", tarfile.DIRTYPE), b""),
        (_ti("usr/bin", tarfile.DIRTYPE), b""),
        (
            _ti(
                "usr/bin/ping",
                mode=0o755,
                pax_headers={"SCHILY.xattr.security.capability": CAP_NET_RAW.decode("latin-1")},
            ),
            b"ping",
        ),
        (_ti("usr/bin/perl5.36", mode=0o755), b"perl"),
        (_ti("usr/bin/perl", tarfile.LNKTYPE, linkname="usr/bin/perl5.36"), b""),
        (_ti("usr/bin/sh", tarfile.SYMTYPE, linkname="../../bin/dash"), b""),
        (_ti("tagged", pax_headers={"SCHILY.xattr.user.origin": "layer one"}), b"tagged"),
        (_ti('odd "name" with spaces', uid=7), b"odd"),
        (_ti("<5>"), b"not inode 5"),
        (_ti("etc", tarfile.DIRTYPE), b""),
        (_ti("etc/gone"), b"whited out"),
        (_ti("etc/opaque", tarfile.DIRTYPE), b""),
        (_ti("etc/opaque/old"), b"hidden by the opaque marker"),
        (_ti("lib", tarfile.SYMTYPE, linkname="usr/lib"), b""),
        (_ti("usr/lib", tarfile.DIRTYPE), b""),
    ]
    upper = [
        (_ti("etc/.wh.gone"), b""),
        (_ti("etc/opaque/.wh..wh..opq"), b""),
        (_ti("etc/opaque/new"), b"after the marker"),
        (_ti("lib/libc.so.6", mode=0o755), b"through the symlink"),
        (_ti("bin/su", mode=0o4750, gid=0), b"\x7fELF setuid root, patched"),
    ]
    return [_layer(dest, lower), _layer(dest, upper)]


# -- the expected tree (what the tar headers say after the whiteouts) ------------------------------------
@dataclass
class Want:
    kind: str
    mode: int
    uid: int = 0
    gid: int = 0
    data: bytes = b""
    target: str = ""
    rdev: tuple[int, int] = (0, 0)
    links: int = 1
    xattrs: dict[str, bytes] = field(default_factory=dict)


def _expected() -> dict[str, Want]:
    reg, d = "regular", "directory"
    return {
        "/bin": Want(d, 0o755),
        "/bin/su": Want(reg, 0o4750, data=b"\x7fELF setuid root, patched"),
        "/bin/wall": Want(reg, 0o2755, gid=5, data=b"setgid tty"),
        "/tmp": Want(d, 0o1777),
        "/home": Want(d, 0o755),
        "/home/dev": Want(d, 0o700, 1000, 1000),
        "/home/dev/.profile": Want(reg, 0o600, 1000, 1000, b"export PS1=dev\n"),
        "/home/dev/Makefile": Want(reg, 0o644, 1000, 1000, b"upper case\n"),
        "/home/dev/makefile": Want(reg, 0o644, 1000, 1000, b"lower case\n"),
        "/big": Want(reg, 0o644, 100000, 100001, b"x" * 300_000),
        "/dev": Want(d, 0o755),
        "/dev/null": Want("character special", 0o666, rdev=(1, 3)),
        "/dev/sda1": Want("block special", 0o660, gid=6, rdev=(8, 1)),
        "/dev/initctl": Want("FIFO", 0o600),
        "/usr": Want(d, 0o755),
        "/usr/bin": Want(d, 0o755),
        "/usr/bin/ping": Want(reg, 0o755, data=b"ping", xattrs={"security.capability": CAP_NET_RAW}),
        "/usr/bin/perl5.36": Want(reg, 0o755, data=b"perl", links=2),
        "/usr/bin/perl": Want(reg, 0o755, data=b"perl", links=2),
        "/usr/bin/sh": Want("symlink", 0o777, target="../../bin/dash"),
        "/usr/lib": Want(d, 0o755),
        "/usr/lib/libc.so.6": Want(reg, 0o755, data=b"through the symlink"),
        "/tagged": Want(reg, 0o644, data=b"tagged", xattrs={"user.origin": b"layer one"}),
        '/odd "name" with spaces': Want(reg, 0o644, uid=7, data=b"odd"),
        "/<5>": Want(reg, 0o644, data=b"not inode 5"),
        "/etc": Want(d, 0o755),
        "/etc/opaque": Want(d, 0o755),
        "/etc/opaque/new": Want(reg, 0o644, data=b"after the marker"),
        "/lib": Want("symlink", 0o777, target="usr/lib"),
        "/lost+found": Want(d, 0o700),
    }


# -- reading the disk back with debugfs -------------------------------------------------------------------
def _debugfs(disk: Path, command: str) -> str:
    out = subprocess.run(["debugfs", "-R", command, str(disk)], capture_output=True, check=True)
    return out.stdout.decode("utf-8", "surrogateescape")


def _q(path: str) -> str:
    return '"' + path.replace('"', '""') + '"'


def _names(disk: Path, directory: str) -> Iterator[str]:
    """The entries of ``directory`` (``ls -p``: /inode/mode/uid/gid/name/size/)."""
    for line in filter(None, _debugfs(disk, f"ls -p {_q(directory)}").splitlines()):
        m = re.fullmatch(r"/(\d+)/(\d+)/(\d+)/(\d+)/(.*)/(\d*)/", line)
        assert m, line
        if m.group(1) != "0" and m.group(5) not in (".", ".."):  # inode 0: an unused slot
            yield m.group(5)


def _walk(disk: Path, directory: str = "/") -> Iterator[str]:
    for name in _names(disk, directory):
        path = directory.rstrip("/") + "/" + name
        yield path
        if "Type: directory" in _debugfs(disk, f"stat {_q(path)}"):
            yield from _walk(disk, path)


def _check_entry(disk: Path, path: str, want: Want, scratch: Path) -> None:
    st = _debugfs(disk, f"stat {_q(path)}")
    m = re.search(r"Type: (.+?)\s+Mode:\s+(\d+)", st)
    assert m, st
    assert (m.group(1), int(m.group(2), 8)) == (want.kind, want.mode), path
    m = re.search(r"User:\s+(\d+)\s+Group:\s+(\d+)", st)
    assert m and (int(m.group(1)), int(m.group(2))) == (want.uid, want.gid), path
    links = re.search(r"Links: (\d+)", st)
    assert links, st
    if want.kind != "directory":
        assert int(links.group(1)) == want.links, path
    mtime = re.search(r"mtime: 0x([0-9a-f]+)", st)
    assert mtime, st
    if path != "/lost+found":  # mke2fs made it
        assert int(mtime.group(1), 16) == 1_700_000_000, path
    if want.kind in ("character special", "block special"):
        m = re.search(r"Device major/minor number: (\d+):(\d+)", st)
        assert m and (int(m.group(1)), int(m.group(2))) == want.rdev, (path, st)
    if want.kind == "symlink":
        m = re.search(r'Fast link dest: "(.*)"', st)
        assert m and m.group(1) == want.target, st
    if want.kind == "regular":
        out = scratch / "dumped"
        out.unlink(missing_ok=True)
        _debugfs(disk, f"dump {_q(path)} {out}")
        assert out.read_bytes() == want.data, path
    xattrs: dict[str, bytes] = {}
    for line in _debugfs(disk, f"ea_list {_q(path)}").splitlines():
        m = re.match(r"\s*(\S+) \((\d+)\)(?: = (.*))?$", line)
        if m:
            name = m.group(1)
            out = scratch / "xattr"
            out.unlink(missing_ok=True)
            _debugfs(disk, f"ea_get -f {out} {_q(path)} {name}")
            xattrs[name] = out.read_bytes()
    assert xattrs == want.xattrs, path


def _as_nobody(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    root = os.geteuid() == 0  # when not root, already a user who is not
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if root else []
    return subprocess.run([*prefix, sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory ``nobody`` may write (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="vz-ext4-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


_WRITE = """
import json, sys
from pathlib import Path
from vz_drivers._images._ext4 import write_ext4
layers = [(d, Path(p)) for d, p in json.loads(sys.argv[1])]
print(json.dumps(write_ext4(layers, Path(sys.argv[2]), 64 * 1024 * 1024, image="test")))
"""


def test_root_disk_from_layers_as_nobody_keeps_every_entry(shared_dir: Path, tmp_path: Path) -> None:
    layers = _layers(shared_dir)
    disk = shared_dir / "root.img"
    done = _as_nobody(_WRITE, json.dumps([(d, str(p)) for d, p in layers]), str(disk))
    assert done.returncode == 0, done.stderr
    assert disk.stat().st_uid == (NOBODY if os.geteuid() == 0 else os.geteuid())  # written by nobody
    expected = _expected()
    assert sorted(_walk(disk)) == sorted(expected)
    for path, want in expected.items():
        _check_entry(disk, path, want, tmp_path)
    root = _debugfs(disk, "stat /")
    assert re.search(r"User:\s+0\s+Group:\s+0", root), root
    assert [p.name for p in shared_dir.iterdir() if p.name.startswith(".spool")] == []  # the spool is gone
    fsck = subprocess.run(["e2fsck", "-fn", str(disk)], capture_output=True, text=True, check=False)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


def test_a_name_debugfs_cannot_express_is_refused(tmp_path: Path) -> None:
    layers = [_layer(tmp_path, [(_ti("line\nbreak"), b"x")])]
    disk = tmp_path / "root.img"
    with pytest.raises(InvalidArgumentError, match="line break"):
        write_ext4(layers, disk, 64 * 1024 * 1024, image="odd")
    assert not disk.exists()


def test_a_disk_too_small_is_refused_naming_the_image(tmp_path: Path) -> None:
    layers = [_layer(tmp_path, [(_ti("big"), os.urandom(8 * 1024 * 1024))])]
    disk = tmp_path / "root.img"
    with pytest.raises(InvalidArgumentError, match="'tiny' cannot become a root disk of 4194304 bytes"):
        write_ext4(layers, disk, 4 * 1024 * 1024, image="tiny")
    assert not disk.exists()


# -- large directories: filled after e2fsck -D gave them an htree --------------------------------------
PADDED = ("/", "/bin", "/dev", "/home/dev", "/usr/bin")
PAD = 600  # 24-byte entries: more than the first 12 KiB of a directory, the rest waits for the index


def _padding_layer(dest: Path) -> tuple[str, Path]:
    """Names sorting before every other entry of ``PADDED``: the image's own entries of these directories
    come after the first 12 KiB, so they are written through the stage (the phase after ``e2fsck -D``)."""
    entries = [
        (_ti(f"{d.strip('/')}/0000-pad-{i:04d}".lstrip("/"), mode=0o640, uid=1000), b"p%d" % i)
        for d in PADDED
        for i in range(PAD)
    ]
    # a third name of perl's inode, in a small directory: it is created first, the two in /usr/bin after
    entries.append((_ti("etc/perl-link", tarfile.LNKTYPE, linkname="usr/bin/perl5.36"), b""))
    return _layer(dest, entries)


def _tree(disk: Path, directory: str = "/") -> Iterator[str]:
    """Every path below ``directory`` (``ls -p`` gives each entry's mode: no stat per entry)."""
    for line in filter(None, _debugfs(disk, f"ls -p {_q(directory)}").splitlines()):
        m = re.fullmatch(r"/(\d+)/(\d+)/(\d+)/(\d+)/(.*)/(\d*)/", line)
        assert m, line
        if m.group(1) == "0" or m.group(5) in (".", ".."):
            continue
        path = directory.rstrip("/") + "/" + m.group(5)
        yield path
        if int(m.group(2), 8) & 0o170000 == 0o040000:
            yield from _tree(disk, path)


def test_large_directories_are_indexed_and_keep_every_entry(shared_dir: Path, tmp_path: Path) -> None:
    layers = [*_layers(shared_dir), _padding_layer(shared_dir)]
    disk = shared_dir / "root.img"
    done = _as_nobody(_WRITE, json.dumps([(d, str(p)) for d, p in layers]), str(disk))
    assert done.returncode == 0, done.stderr
    expected = _expected()
    for name in ("/usr/bin/perl5.36", "/usr/bin/perl"):
        expected[name].links = 3
    expected["/etc/perl-link"] = Want("regular", 0o755, data=b"perl", links=3)
    padding = {f"{d.rstrip('/')}/0000-pad-{i:04d}" for d in PADDED for i in range(PAD)}
    assert sorted(_tree(disk)) == sorted(set(expected) | padding)  # no stage directory is left either
    for path, want in expected.items():
        _check_entry(disk, path, want, tmp_path)
    for path in (f"/usr/bin/0000-pad-{PAD - 1:04d}", "/0000-pad-0000"):
        _check_entry(disk, path, Want("regular", 0o640, uid=1000, data=b"p%d" % int(path[-4:])), tmp_path)
    for directory in PADDED:  # the writer gave them an htree (EXT2_INDEX_FL) before filling them
        flags = re.search(r"Flags: 0x([0-9a-f]+)", _debugfs(disk, f"stat {_q(directory)}"))
        assert flags and int(flags.group(1), 16) & 0x1000, directory
    root = _debugfs(disk, "stat /")
    assert re.search(r"User:\s+0\s+Group:\s+0", root) and "Links: 9" in root, (
        root
    )  # 2 + 7 subdirectories: the stage left none
    fsck = subprocess.run(["e2fsck", "-fn", str(disk)], capture_output=True, text=True, check=False)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


def test_a_hard_link_into_a_full_directory_block_gets_room(tmp_path: Path) -> None:
    """debugfs's ``ln`` does not grow a directory: one whose last block is exactly full once refused the name
    ("No free space in the directory"). With 1 KiB blocks (a 64 MiB disk) and 16-byte entries one of these
    directories ends on a full block."""
    entries: list[tuple[tarfile.TarInfo, bytes]] = []
    for n in range(240, 262):
        entries.append((_ti(f"d{n}", tarfile.DIRTYPE), b""))
        entries += [(_ti(f"d{n}/f{i:05d}"), b"x") for i in range(n)]
        entries.append((_ti(f"d{n}/zlink", tarfile.LNKTYPE, linkname=f"d{n}/f00000"), b""))
    disk = tmp_path / "root.img"
    write_ext4([_layer(tmp_path, entries)], disk, 64 * 1024 * 1024, image="links")
    assert "Block size:               1024" in _debugfs(disk, "stats")
    for n in range(240, 262):
        st = _debugfs(disk, f"stat /d{n}/zlink")
        assert "Links: 2" in st and st == _debugfs(disk, f"stat /d{n}/f00000"), n
    fsck = subprocess.run(["e2fsck", "-fn", str(disk)], capture_output=True, text=True, check=False)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
