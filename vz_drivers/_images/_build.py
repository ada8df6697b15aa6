"""Building images locally: deterministic layer tarballs, OCI image layouts and docker-archive tarballs.

Everything here is deterministic for the same input (sorted entries, fixed mtimes unless asked otherwise,
gzip without a timestamp, canonical JSON), so the same content always yields the same digests.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vz_drivers._images._model import (
    MEDIA_OCI_CONFIG,
    MEDIA_OCI_INDEX,
    MEDIA_OCI_LAYER,
    MEDIA_OCI_LAYER_GZIP,
    MEDIA_OCI_MANIFEST,
    ImageConfig,
    host_platform,
)

__all__ = [
    "Descriptor",
    "ImageBlobs",
    "OciLayoutWriter",
    "build_docker_archive",
    "build_oci_layout",
    "canonical_json",
    "config_json",
    "image_blobs",
    "layer_media_type",
    "layer_tar",
    "oci_manifest",
    "sha256_digest",
]

_GZIP_MAGIC = b"\x1f\x8b"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys: stable bytes, hence a stable digest."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor."""

    media_type: str
    digest: str
    size: int
    platform: dict[str, str] | None = None
    annotations: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The descriptor as it appears in a manifest or index."""
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.platform:
            out["platform"] = dict(self.platform)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


def _tarinfo_for(path: Path, arcname: str, mtime: int | None, tf: tarfile.TarFile) -> tarfile.TarInfo:
    info = tf.gettarinfo(str(path), arcname)
    if mtime is not None:
        info.mtime = mtime
    info.uname = ""
    info.gname = ""
    return info


def layer_tar(src: Path, *, mtime: int | None = 0, compress: bool = False) -> bytes:
    """A layer tarball of the tree under ``src`` (entries sorted, paths relative to ``src``).

    Keeps modes, uid/gid, symlinks and hard links; ``mtime=None`` keeps file mtimes, otherwise every entry
    gets ``mtime``. Files named ``.wh.<name>`` / ``.wh..wh..opq`` are ordinary entries, so a directory tree
    can express OCI whiteouts. Device nodes and sockets are not supported.
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames.sort()
            base = Path(dirpath)
            rel_dir = base.relative_to(src)
            entries = sorted(dirnames + filenames)
            # os.walk does not descend into symlinked directories; they are archived as links below.
            for name in entries:
                full = base / name
                arcname = str(rel_dir / name) if str(rel_dir) != "." else name
                info = _tarinfo_for(full, arcname, mtime, tf)
                if info.isreg():
                    with full.open("rb") as fh:
                        tf.addfile(info, fh)
                elif info.isdir() or info.issym() or info.islnk() or info.isfifo():
                    tf.addfile(info)
                else:
                    raise ValueError(
                        f"{full}: unsupported file type for a layer ({stat.filemode(full.lstat().st_mode)})"
                    )
    data = buf.getvalue()
    return _gzip(data) if compress else data


def _gzip(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) as gz:
        gz.write(data)
    return out.getvalue()


def layer_media_type(head: bytes) -> str:
    """The OCI layer media type for a layer starting with ``head`` (gzip or plain tar)."""
    return MEDIA_OCI_LAYER_GZIP if head[:2] == _GZIP_MAGIC else MEDIA_OCI_LAYER


def _diff_id(layer: bytes) -> str:
    return sha256_digest(gzip.decompress(layer) if layer[:2] == _GZIP_MAGIC else layer)


def config_json(
    config: ImageConfig, *, diff_ids: Sequence[str], architecture: str, os: str, history: str = "vz"
) -> dict[str, Any]:
    """An OCI image configuration document."""
    cfg: dict[str, Any] = {}
    if config.entrypoint:
        cfg["Entrypoint"] = list(config.entrypoint)
    if config.cmd:
        cfg["Cmd"] = list(config.cmd)
    if config.env:
        cfg["Env"] = list(config.env)
    if config.working_dir:
        cfg["WorkingDir"] = config.working_dir
    if config.user:
        cfg["User"] = config.user
    return {
        "architecture": architecture,
        "os": os,
        "created": "1970-01-01T00:00:00Z",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": history} for _ in diff_ids],
    }


@dataclass(frozen=True)
class ImageBlobs:
    """The blobs of one single-platform image: manifest, config and layers (as stored bytes)."""

    manifest: bytes
    config: bytes
    layers: tuple[bytes, ...]
    manifest_digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "manifest_digest", sha256_digest(self.manifest))

    def all(self) -> list[tuple[str, bytes]]:
        """``(digest, bytes)`` of every blob."""
        return [(sha256_digest(b), b) for b in (self.manifest, self.config, *self.layers)]


def image_blobs(
    layers: Sequence[bytes],
    *,
    config: ImageConfig = ImageConfig(),
    architecture: str | None = None,
    os: str = "linux",
    raw_config: dict[str, Any] | None = None,
) -> ImageBlobs:
    """Manifest + config for ``layers`` (tar or gzip-compressed tar bytes). ``raw_config`` overrides the config."""
    arch = architecture or host_platform().architecture
    cfg = raw_config or config_json(config, diff_ids=[_diff_id(layer) for layer in layers], architecture=arch, os=os)
    config_bytes = canonical_json(cfg)
    manifest = oci_manifest(
        Descriptor(MEDIA_OCI_CONFIG, sha256_digest(config_bytes), len(config_bytes)),
        [Descriptor(layer_media_type(layer[:2]), sha256_digest(layer), len(layer)) for layer in layers],
    )
    return ImageBlobs(manifest, config_bytes, tuple(layers))


def oci_manifest(config: Descriptor, layers: Sequence[Descriptor]) -> bytes:
    """Canonical bytes of an OCI image manifest over ``config`` and ``layers``."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_OCI_MANIFEST,
        "config": config.to_json(),
        "layers": [layer.to_json() for layer in layers],
    }
    return canonical_json(manifest)


def _layer_bytes(layer: Path | bytes, compress: bool) -> bytes:
    if isinstance(layer, bytes):
        return _gzip(layer) if compress and layer[:2] != _GZIP_MAGIC else layer
    return layer_tar(layer, compress=compress)


class OciLayoutWriter:
    """Writes an OCI image layout directory: ``oci-layout``, ``index.json``, ``blobs/sha256/*``.

    Use ``add_image`` (and ``add_index`` for multi-platform images), ``tag`` the results, then ``write_index``.
    """

    def __init__(self, dest: Path) -> None:
        self.dest = Path(dest)
        (self.dest / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.dest / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        self._entries: list[Descriptor] = []

    def add_blob(self, data: bytes, media_type: str) -> Descriptor:
        """Store one blob; return its descriptor."""
        digest = sha256_digest(data)
        (self.dest / "blobs" / "sha256" / digest.split(":", 1)[1]).write_bytes(data)
        return Descriptor(media_type, digest, len(data))

    def add_image(
        self,
        layers: Sequence[Path | bytes],
        *,
        config: ImageConfig = ImageConfig(),
        architecture: str | None = None,
        os: str = "linux",
        compress: bool = True,
    ) -> Descriptor:
        """Add a single-platform image built from layer directories or tar bytes; return its manifest."""
        arch = architecture or host_platform().architecture
        blobs = image_blobs(
            [_layer_bytes(layer, compress) for layer in layers], config=config, architecture=arch, os=os
        )
        for data in (blobs.config, *blobs.layers):
            self.add_blob(data, "application/octet-stream")
        desc = self.add_blob(blobs.manifest, MEDIA_OCI_MANIFEST)
        return Descriptor(desc.media_type, desc.digest, desc.size, platform={"os": os, "architecture": arch})

    def add_index(self, manifests: Sequence[Descriptor]) -> Descriptor:
        """Add an image index (multi-platform image) over ``manifests``."""
        index = {"schemaVersion": 2, "mediaType": MEDIA_OCI_INDEX, "manifests": [m.to_json() for m in manifests]}
        return self.add_blob(canonical_json(index), MEDIA_OCI_INDEX)

    def tag(self, desc: Descriptor, name: str | None) -> None:
        """List ``desc`` in ``index.json``, named ``name`` when given."""
        annotations = {REF_NAME_ANNOTATION: name} if name else None
        self._entries.append(Descriptor(desc.media_type, desc.digest, desc.size, desc.platform, annotations))

    def write_index(self) -> None:
        """Write ``index.json`` listing every tagged descriptor."""
        index = {"schemaVersion": 2, "mediaType": MEDIA_OCI_INDEX, "manifests": [e.to_json() for e in self._entries]}
        (self.dest / "index.json").write_bytes(canonical_json(index))


def build_oci_layout(
    dest: Path,
    layers: Sequence[Path | bytes],
    *,
    config: ImageConfig = ImageConfig(),
    tag: str | None = "latest",
    architecture: str | None = None,
    os: str = "linux",
    compress: bool = True,
) -> str:
    """Write a single-image OCI layout at ``dest`` from layer directories or tar bytes; return the manifest digest.

    Directories become layers through ``layer_tar``; ``compress`` gzips layers (bytes already gzip stay as is).
    """
    writer = OciLayoutWriter(dest)
    desc = writer.add_image(layers, config=config, architecture=architecture, os=os, compress=compress)
    writer.tag(Descriptor(desc.media_type, desc.digest, desc.size), tag)
    writer.write_index()
    return desc.digest


def build_docker_archive(
    dest: Path,
    layers: Sequence[Path | bytes],
    *,
    config: ImageConfig = ImageConfig(),
    repo_tags: Sequence[str] = (),
    architecture: str | None = None,
    os: str = "linux",
) -> str:
    """Write a ``docker save``-style tarball (``manifest.json``, ``<id>.json``, ``<id>/layer.tar``) at ``dest``.

    Layers are stored uncompressed (as ``docker save`` does). Returns the image id (the config digest).
    """
    arch = architecture or host_platform().architecture
    raw = [gzip.decompress(b) if b[:2] == _GZIP_MAGIC else b for b in (_layer_bytes(x, False) for x in layers)]
    diff_ids = [sha256_digest(b) for b in raw]
    cfg = canonical_json(config_json(config, diff_ids=diff_ids, architecture=arch, os=os))
    config_hex = sha256_digest(cfg).split(":", 1)[1]
    members: list[tuple[str, bytes]] = [(f"{config_hex}.json", cfg)]
    layer_paths = []
    for diff_id, data in zip(diff_ids, raw, strict=True):
        path = f"{diff_id.split(':', 1)[1]}/layer.tar"
        layer_paths.append(path)
        members.append((path, data))
    manifest = [{"Config": f"{config_hex}.json", "RepoTags": list(repo_tags), "Layers": layer_paths}]
    members.append(("manifest.json", json.dumps(manifest).encode()))
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            if "/" in name:
                d = tarfile.TarInfo(name.split("/", 1)[0])
                d.type = tarfile.DIRTYPE
                d.mode = 0o755
                tf.addfile(d)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return "sha256:" + config_hex
