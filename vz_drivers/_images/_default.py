"""The embedded default image ``vz:default``: busybox, built locally, deterministically, without a download.

One uncompressed layer (so its digest does not depend on the zlib version) holding:

* ``/bin/busybox`` copied from the host's static busybox (Debian ``busybox-static``), and a symlink
  ``/bin/<applet> -> busybox`` for every applet it lists (``/bin/sh`` among them), plus ``/usr/bin/env``;
* ``/etc/passwd`` and ``/etc/group`` with root (0), dev (1000, home ``/home/dev``) and nobody (65534);
  ``/etc/hosts``;
* ``/tmp`` (1777), ``/root`` (0700), ``/home/dev`` (owned by 1000:1000) and empty ``/dev``, ``/proc``, ``/sys``.

Every entry has mtime 0, uid/gid set explicitly and entries are sorted, so the image digest is a function of the
busybox binary alone.

Note: Debian 12's busybox (1.35.0) is built without wget's timeout feature and crashes (SIGSEGV) parsing
``wget -T N``; ``timeout N wget ...`` is the substitute inside the image (docs/images.md).
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vz_core.errors import RuntimeFailureError, UnavailableError
from vz_drivers._images._build import ImageBlobs, image_blobs
from vz_drivers._images._model import ImageConfig, host_platform

__all__ = ["BUSYBOX_CANDIDATES", "DEFAULT_CONFIG", "BusyboxBinary", "build_default_image", "find_busybox"]

BUSYBOX_CANDIDATES: tuple[Path, ...] = (Path("/bin/busybox"), Path("/usr/bin/busybox"))
"""Where the static busybox is looked for (``VZ_BUSYBOX`` overrides)."""

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_CONFIG = ImageConfig(cmd=("/bin/sh",), env=(f"PATH={DEFAULT_PATH}",), working_dir="/")

_PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    "dev:x:1000:1000:dev:/home/dev:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
)
_GROUP = "root:x:0:\ndev:x:1000:\nnobody:x:65534:\n"
_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
_INSTALL_HINT = "install it with `apt-get install busybox-static` (or point VZ_BUSYBOX at a static busybox)"


@dataclass(frozen=True)
class BusyboxBinary:
    """The busybox the default image is built from, with the stat fields that identify its version."""

    path: Path
    size: int
    mtime_ns: int
    inode: int

    @property
    def stamp(self) -> str:
        """Changes whenever the binary is replaced (package upgrade)."""
        return f"{self.path}:{self.size}:{self.mtime_ns}:{self.inode}"


def _is_static_elf(path: Path) -> bool:
    """True for an ELF executable without a PT_INTERP program header (needs no dynamic loader)."""
    with path.open("rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF":
            return False
        is64, little = head[4] == 2, head[5] == 1
        order: Literal["little", "big"] = "little" if little else "big"
        if is64:
            phoff = int.from_bytes(head[32:40], order)
            phentsize = int.from_bytes(head[54:56], order)
            phnum = int.from_bytes(head[56:58], order)
        else:
            phoff = int.from_bytes(head[28:32], order)
            phentsize = int.from_bytes(head[42:44], order)
            phnum = int.from_bytes(head[44:46], order)
        fh.seek(phoff)
        table = fh.read(phentsize * phnum)
    pt_interp = 3
    return all(int.from_bytes(table[i * phentsize : i * phentsize + 4], order) != pt_interp for i in range(phnum))


def find_busybox() -> BusyboxBinary:
    """Locate a static busybox; UnavailableError (with the apt-get hint) when there is none."""
    override = os.environ.get("VZ_BUSYBOX")
    candidates = (Path(override),) if override else BUSYBOX_CANDIDATES
    for path in candidates:
        try:
            st = path.stat()
        except OSError:
            continue
        if not _is_static_elf(path):
            raise UnavailableError(
                f"{path} is not a statically linked busybox, so it cannot run inside the default image; {_INSTALL_HINT}"
            )
        return BusyboxBinary(path, st.st_size, st.st_mtime_ns, st.st_ino)
    raise UnavailableError(
        "the default image vz:default needs a static busybox, found none at "
        + ", ".join(str(p) for p in candidates)
        + f"; {_INSTALL_HINT}"
    )


def _applets(busybox: Path) -> list[str]:
    try:
        out = subprocess.run([str(busybox), "--list"], capture_output=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeFailureError(
            f"could not list the applets of {busybox} ({exc}); "
            "reinstall it with `apt-get install --reinstall busybox-static`"
        ) from exc
    names = sorted({n for n in out.decode().split() if n and "/" not in n and n not in {".", "..", "busybox"}})
    if "sh" not in names:
        raise UnavailableError(
            f"{busybox} has no 'sh' applet, so it cannot be the default image's shell; {_INSTALL_HINT}"
        )
    return names


def _entry(
    name: str, kind: bytes, *, mode: int, uid: int = 0, gid: int = 0, linkname: str = "", size: int = 0
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    info.mtime = 0
    info.linkname = linkname
    info.size = size
    return info


def default_layer(busybox: Path) -> bytes:
    """The single layer of ``vz:default`` (an uncompressed, deterministic tar)."""
    applets = _applets(busybox)
    data = busybox.read_bytes()
    files: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}

    def add(info: tarfile.TarInfo, content: bytes | None = None) -> None:
        files[info.name] = (info, content)

    for d, mode, owner in (
        ("bin", 0o755, 0),
        ("dev", 0o755, 0),
        ("etc", 0o755, 0),
        ("home", 0o755, 0),
        ("home/dev", 0o755, 1000),
        ("proc", 0o555, 0),
        ("root", 0o700, 0),
        ("sbin", 0o755, 0),
        ("sys", 0o555, 0),
        ("tmp", 0o1777, 0),
        ("usr", 0o755, 0),
        ("usr/bin", 0o755, 0),
        ("usr/sbin", 0o755, 0),
        ("var", 0o755, 0),
        ("var/tmp", 0o1777, 0),
    ):
        add(_entry(d, tarfile.DIRTYPE, mode=mode, uid=owner, gid=owner))
    add(_entry("bin/busybox", tarfile.REGTYPE, mode=0o755, size=len(data)), data)
    for applet in applets:
        add(_entry(f"bin/{applet}", tarfile.SYMTYPE, mode=0o777, linkname="busybox"))
    if "env" in applets:
        add(_entry("usr/bin/env", tarfile.SYMTYPE, mode=0o777, linkname="/bin/busybox"))
    for name, text in (("etc/passwd", _PASSWD), ("etc/group", _GROUP), ("etc/hosts", _HOSTS)):
        raw = text.encode()
        add(_entry(name, tarfile.REGTYPE, mode=0o644, size=len(raw)), raw)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name in sorted(files):
            info, content = files[name]
            tf.addfile(info, io.BytesIO(content) if content is not None else None)
    return buf.getvalue()


def build_default_image(busybox: BusyboxBinary) -> ImageBlobs:
    """Build the blobs of ``vz:default`` for this host's architecture from ``busybox``."""
    return image_blobs([default_layer(busybox.path)], config=DEFAULT_CONFIG, architecture=host_platform().architecture)
