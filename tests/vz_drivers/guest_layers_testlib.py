"""Image layers for the VM drivers' stand-in boots: a non-root user, a setuid-root program, a file owned by 1000.

The program (``/usr/local/bin/euid``) is a static Go binary for the guest's architecture printing its real and
effective uid; installed setuid root, run by the image's user ``dev`` (1000:1000) it prints ``1000 0``. The root
disk is written from these tar streams by the drivers' writer (``vz_drivers._guest.create_root_disk``), never
from a host directory.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

__all__ = ["EXPECTED_ID", "ID_SCRIPT", "base_layer", "euid_binary", "upper_layer", "write_layers"]

_EUID_GO = """package main

import (
\t"fmt"
\t"os"
)

func main() { fmt.Printf("%d %d\\n", os.Getuid(), os.Geteuid()) }
"""

ID_SCRIPT = (
    "b=/bin/busybox; $b id -u; $b id -g; $b id -un; /usr/local/bin/euid; "
    "$b stat -c '%n %u %g %a' /usr/local/bin/euid /home/dev/owned /home/dev; $b cat /home/dev/owned"
)
"""Run as the image's user: who it is, the setuid program's uids, the owners the layers gave."""
EXPECTED_ID = (
    "1000\n1000\ndev\n1000 0\n"  # real uid dev, effective uid root: the setuid bit held
    "/usr/local/bin/euid 0 0 4755\n/home/dev/owned 1000 1000 600\n/home/dev 1000 1000 755\nmine\n"
)


def euid_binary(goarch: str, work: Path) -> bytes:
    """The euid program, built with the Go toolchain for linux/``goarch`` (static: CGO_ENABLED=0)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "euid.go").write_text(_EUID_GO)
    env = {**os.environ, "CGO_ENABLED": "0", "GOOS": "linux", "GOARCH": goarch, "GO111MODULE": "off"}
    subprocess.run(
        ["go", "build", "-trimpath", "-o", str(work / "euid"), str(work / "euid.go")],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    return (work / "euid").read_bytes()


def _tar(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for ti, data in entries:
            tf.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    return buf.getvalue()


def _entry(name: str, kind: bytes, data: bytes = b"", **kw: object) -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.size = len(data) if kind == tarfile.REGTYPE else 0
    ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti, data


def base_layer(busybox: bytes) -> bytes:
    """A busybox userland (the guest architecture's busybox) with root and ``dev`` (1000:1000)."""
    entries = [_entry(d, tarfile.DIRTYPE) for d in ("bin", "dev", "etc", "home", "proc", "run", "sys", "usr")]
    entries += [
        _entry("home/dev", tarfile.DIRTYPE, uid=1000, gid=1000),
        _entry("tmp", tarfile.DIRTYPE, mode=0o1777),
        _entry("bin/busybox", tarfile.REGTYPE, busybox, mode=0o755),
        _entry("bin/sh", tarfile.SYMTYPE, linkname="busybox", mode=0o777),
        _entry(
            "etc/passwd", tarfile.REGTYPE, b"root:x:0:0:root:/root:/bin/sh\ndev:x:1000:1000:dev:/home/dev:/bin/sh\n"
        ),
        _entry("etc/group", tarfile.REGTYPE, b"root:x:0:\ndev:x:1000:\n"),
        _entry("etc/hosts", tarfile.REGTYPE, b"127.0.0.1 localhost\n"),
        _entry("etc/resolv.conf", tarfile.REGTYPE, b"# replaced by the lease\n"),
    ]
    return _tar(entries)


def upper_layer(euid: bytes) -> bytes:
    """The setuid-root program and a file of the user's (mode 0600, 1000:1000)."""
    return _tar(
        [
            _entry("usr/local", tarfile.DIRTYPE),
            _entry("usr/local/bin", tarfile.DIRTYPE),
            _entry("usr/local/bin/euid", tarfile.REGTYPE, euid, mode=0o4755),
            _entry("home/dev/owned", tarfile.REGTYPE, b"mine\n", uid=1000, gid=1000, mode=0o600),
        ]
    )


def write_layers(layers: list[bytes], where: Path) -> list[tuple[str, Path]]:
    """The layers as ``(digest, blob path)`` pairs, what the image store hands the root-disk writer."""
    where.mkdir(parents=True, exist_ok=True)
    out = []
    for number, data in enumerate(layers):
        path = where / f"layer{number}.tar"
        path.write_bytes(data)
        out.append((f"sha256:{hashlib.sha256(data).hexdigest()}", path))
    return out
