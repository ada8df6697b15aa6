"""The vz image store, shared by the linux_native and qemu drivers.

Resolves image references (``vz:default``, ``oci:``, ``docker-archive:``, registry ``host/repo:tag``) into
locally stored, digest-verified images and unpacks them into cached root filesystems. See docs/images.md.

::

    store = ImageStore()                       # root: vz_core.paths.cache_dir() / "images"
    image = await store.resolve("vz:default")  # -> Image(ref, digest, config, layers, architecture, os)
    rootfs = await store.rootfs(image)         # -> Path, read-only by convention

Errors (vz_core.errors): InvalidArgumentError (malformed reference or image content), NotFoundError (no such
image/tag/file), UnsupportedError (platform or format not handled), PermissionDeniedError (registry refused),
UnavailableError (registry unreachable, busybox-static missing), RuntimeFailureError (digest mismatch).
"""

from __future__ import annotations

from vz_drivers._images._build import (
    Descriptor,
    OciLayoutWriter,
    build_docker_archive,
    build_oci_layout,
    layer_tar,
)
from vz_drivers._images._default import DEFAULT_CONFIG
from vz_drivers._images._ext4 import E2FSPROGS_HINT, find_e2fs_tool, write_ext4
from vz_drivers._images._locks import file_lock
from vz_drivers._images._model import Image, ImageConfig, Platform, host_platform
from vz_drivers._images._reference import (
    DEFAULT_REF,
    DefaultRef,
    DockerArchiveRef,
    ImageReference,
    OciLayoutRef,
    RegistryRef,
    parse_reference,
)
from vz_drivers._images._store import ImageStore, RegistryCredentials, default_store_root

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_REF",
    "E2FSPROGS_HINT",
    "DefaultRef",
    "Descriptor",
    "DockerArchiveRef",
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
    "find_e2fs_tool",
    "host_platform",
    "layer_tar",
    "parse_reference",
    "write_ext4",
]
