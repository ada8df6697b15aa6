"""The built-in image ``vz:developer``: Debian 12 with a Docker engine, built locally with mmdebstrap.

A Developer Machine runs its own Docker engine (docs/user-guide.md, "Docker in a Machine"); this image carries
one. It is built on first use, once per recipe, from the Debian archive apt is configured with (the only network
use is apt through its own client; nothing comes from a container registry):

* ``mmdebstrap --variant=essential`` of Debian 12 (bookworm) plus ``PACKAGES``, each pinned to an exact version
  (``name=version``: apt refuses to build when the archive no longer has it), with ``SOURCE_DATE_EPOCH`` fixed;
* a user ``dev`` (uid/gid 1000, home ``/home/dev``, shell ``/bin/bash``, in the ``docker`` group), as in
  ``vz:default``;
* the tarball is then normalized into one uncompressed layer: entries sorted by name, numeric owners only, every
  mtime clamped to ``SOURCE_DATE_EPOCH``, and what describes the build rather than the image removed (apt's
  package lists and caches, logs, ``/etc/resolv.conf`` and ``/etc/hostname``, device nodes).

The same recipe over the same archive therefore gives the same digest (tests/vz_drivers/test_developer_image.py
builds it twice). The recipe's stamp (``recipe_stamp``) decides when the store rebuilds it: a change of the pins,
the epoch or the normalization rules, never the time of day.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vz_core.errors import RuntimeFailureError, UnavailableError
from vz_drivers._images._build import ImageBlobs, image_blobs
from vz_drivers._images._model import ImageConfig

__all__ = [
    "DEVELOPER_CONFIG",
    "DOCKER_ENGINE_PATHS",
    "PACKAGES",
    "RECIPE_VERSION",
    "SOURCE_DATE_EPOCH",
    "build_developer_image",
    "developer_layer",
    "find_mmdebstrap",
    "has_docker_engine",
    "normalize_layer",
    "recipe_stamp",
]

SUITE = "bookworm"
SOURCE_DATE_EPOCH = 1747699200
"""2025-05-20T00:00:00Z: the date of the Debian snapshot the pins below were taken from."""
RECIPE_VERSION = 1
"""Bumped whenever the build or the normalization changes the image's bytes."""

PACKAGES: tuple[tuple[str, str], ...] = (
    ("bash", "5.2.15-2+b13"),
    ("ca-certificates", "20250419~deb12u2"),
    ("containerd", "1.6.20~ds1-1+deb12u3"),
    ("docker-compose", "1.29.2-3"),
    ("docker.io", "20.10.24+dfsg1-1+deb12u1+b6"),
    ("git", "1:2.39.5-0+deb12u3"),
    ("iproute2", "6.1.0-3"),
    ("iptables", "1.8.9-2"),
    ("nftables", "1.0.6-2+deb12u2"),
    ("passwd", "1:4.13+dfsg1-1+deb12u2"),
    ("procps", "2:4.0.2-3"),
    ("runc", "1.1.5+ds1-1+deb12u1"),
    ("tini", "0.19.0-1+b3"),
)
"""What the image installs beyond Debian's essential set, pinned (``apt-cache policy NAME`` shows candidates)."""

DOCKER_ENGINE_PATHS = ("usr/bin/dockerd", "usr/sbin/dockerd", "usr/local/bin/dockerd")
"""Where an image's Docker engine is looked for (``has_docker_engine``)."""

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEVELOPER_CONFIG = ImageConfig(cmd=("/bin/bash",), env=(f"PATH={_PATH}", "LANG=C.UTF-8"), working_dir="/")

_CUSTOMIZE = (
    'chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash --groups docker dev',
    # the build host's name and resolver must not end up in the image; the Machine's runtime writes its own
    'printf "localhost\\n" > "$1/etc/hostname"',
    'rm -f "$1/etc/resolv.conf"',
)
_DROP_PREFIXES = (
    "var/lib/apt/lists/",
    "var/cache/apt/",
    "var/cache/debconf/",
    "var/cache/ldconfig/",
    "var/log/",
)
_DROP_FILES = frozenset({"etc/resolv.conf"})
_INSTALL_HINT = "install it with `apt-get install mmdebstrap` (scripts/install-deps.sh does)"
_BUILD_TIMEOUT = 3600


def recipe_stamp() -> str:
    """Identifies the recipe: the store rebuilds ``vz:developer`` only when it changes."""
    text = "\n".join(
        [f"v{RECIPE_VERSION}", SUITE, str(SOURCE_DATE_EPOCH), *(f"{n}={v}" for n, v in PACKAGES), *_CUSTOMIZE]
    )
    return "recipe:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def find_mmdebstrap() -> Path:
    """The mmdebstrap program; UnavailableError with the install hint when it is missing."""
    found = shutil.which("mmdebstrap")
    if not found:
        raise UnavailableError(
            f"the image vz:developer is built with mmdebstrap, which is not installed; {_INSTALL_HINT}"
        )
    return Path(found)


def _apt_sources() -> list[str]:
    """The host's apt source files (the archive mmdebstrap downloads from), in apt's order."""
    out: list[str] = []
    main = Path("/etc/apt/sources.list")
    if main.is_file() and any(
        line.strip() and not line.lstrip().startswith("#") for line in main.read_text().splitlines()
    ):
        out.append(str(main))
    parts = Path("/etc/apt/sources.list.d")
    if parts.is_dir():
        out.extend(str(p) for p in sorted(parts.iterdir()) if p.suffix in {".list", ".sources"} and p.is_file())
    if not out:
        raise UnavailableError(
            "the image vz:developer is built from the Debian archive apt is configured with, and apt has no "
            "sources (/etc/apt/sources.list, /etc/apt/sources.list.d/); configure a Debian 12 archive"
        )
    return out


def _run_mmdebstrap(program: Path, target: Path) -> None:
    argv = [
        str(program),
        "--variant=essential",
        "--mode=root",
        "--format=tar",
        "--skip=check/signed-by",
        "--include=" + ",".join(f"{n}={v}" for n, v in PACKAGES),
        *(f"--customize-hook={hook}" for hook in _CUSTOMIZE),
        SUITE,
        str(target),
        *_apt_sources(),
    ]
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH), "LC_ALL": "C.UTF-8", "TZ": "UTC"}
    try:
        done = subprocess.run(argv, capture_output=True, env=env, timeout=_BUILD_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeFailureError(f"building vz:developer with mmdebstrap failed to run: {exc}") from exc
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-12:]
        raise RuntimeFailureError(
            "building vz:developer with mmdebstrap failed (exit "
            f"{done.returncode}); when apt no longer offers a pinned version, update PACKAGES in "
            "vz_drivers/_images/_developer.py. Last lines:\n" + "\n".join(tail)
        )


def _kept(member: tarfile.TarInfo) -> bool:
    name = member.name.removeprefix("./").rstrip("/")
    if not name:
        return False
    if member.ischr() or member.isblk() or member.isfifo():
        return False
    if name in _DROP_FILES:
        return False
    return not any(name.startswith(p) for p in _DROP_PREFIXES)


def _members(tf: tarfile.TarFile) -> Iterator[tuple[tarfile.TarInfo, bytes | None]]:
    for member in tf:
        if not _kept(member):
            continue
        data = None
        if member.isreg():
            fh = tf.extractfile(member)
            data = fh.read() if fh is not None else b""
        yield member, data


def normalize_layer(source: Path, *, epoch: int = SOURCE_DATE_EPOCH) -> bytes:
    """Rewrite the tarball at ``source`` into a deterministic, uncompressed layer (module docstring)."""
    entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
    with tarfile.open(source, mode="r:") as tf:
        for member, data in _members(tf):
            name = member.name.removeprefix("./").rstrip("/")
            info = tarfile.TarInfo(name)
            info.type = member.type
            info.mode = member.mode
            info.uid, info.gid = member.uid, member.gid
            info.uname = info.gname = ""
            info.mtime = min(int(member.mtime), epoch)
            info.linkname = member.linkname.removeprefix("./") if member.islnk() else member.linkname
            info.size = len(data) if data is not None else 0
            info.pax_headers = {k: v for k, v in member.pax_headers.items() if k.startswith("SCHILY.xattr.")}
            entries[name] = (info, data)
    # a hard link must follow its target; sorting by name alone could put it first
    order = sorted(entries)
    seen: set[str] = set()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out:
        pending: list[str] = []
        for name in order:
            info, data = entries[name]
            if info.islnk() and info.linkname not in seen and info.linkname in entries:
                pending.append(name)
                continue
            out.addfile(info, io.BytesIO(data) if data is not None else None)
            seen.add(name)
        for name in pending:
            info, data = entries[name]
            out.addfile(info, None)
    return buf.getvalue()


def developer_layer(workdir: Path | None = None) -> bytes:
    """Run mmdebstrap and normalize its tarball: the single layer of ``vz:developer``."""
    program = find_mmdebstrap()
    with tempfile.TemporaryDirectory(prefix="vz-developer-", dir=workdir) as tmp:
        target = Path(tmp) / "rootfs.tar"
        _run_mmdebstrap(program, target)
        return normalize_layer(target)


def build_developer_image(workdir: Path | None = None) -> ImageBlobs:
    """Build the blobs of ``vz:developer`` (amd64 or arm64: the host's architecture, as apt is configured)."""
    return image_blobs([developer_layer(workdir)], config=DEVELOPER_CONFIG)


def has_docker_engine(rootfs: Path) -> bool:
    """True when the unpacked image at ``rootfs`` carries a Docker engine (``dockerd``) as an executable file."""
    for rel in DOCKER_ENGINE_PATHS:
        path = rootfs / rel
        try:
            if path.is_file() and os.access(path, os.X_OK):
                return True
        except OSError:
            continue
    return False
