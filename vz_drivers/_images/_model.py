"""Plain values of the image store: an image's identity, its run configuration, and platforms."""

from __future__ import annotations

import platform as _platform
import re
from dataclasses import dataclass, field

from vz_core.errors import InvalidArgumentError

__all__ = [
    "MEDIA_DOCKER_CONFIG",
    "MEDIA_DOCKER_LAYER_GZIP",
    "MEDIA_DOCKER_MANIFEST",
    "MEDIA_DOCKER_MANIFEST_LIST",
    "MEDIA_OCI_CONFIG",
    "MEDIA_OCI_INDEX",
    "MEDIA_OCI_LAYER",
    "MEDIA_OCI_LAYER_GZIP",
    "MEDIA_OCI_MANIFEST",
    "Image",
    "ImageConfig",
    "Platform",
    "host_platform",
]

MEDIA_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MEDIA_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MEDIA_DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"

INDEX_MEDIA_TYPES = frozenset({MEDIA_OCI_INDEX, MEDIA_DOCKER_MANIFEST_LIST})
MANIFEST_MEDIA_TYPES = frozenset({MEDIA_OCI_MANIFEST, MEDIA_DOCKER_MANIFEST})

_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_PLATFORM_PART = re.compile(r"^[a-z0-9_.-]+$")


def check_digest(digest: str, *, what: str = "digest") -> str:
    """Return ``digest`` if it is ``sha256:<64 lowercase hex>``; otherwise raise InvalidArgumentError."""
    if not _DIGEST_RE.match(digest):
        raise InvalidArgumentError(
            f"{what} {digest!r} is not a sha256 digest; expected 'sha256:' followed by 64 lowercase hex digits",
            details={"field": what},
        )
    return digest


@dataclass(frozen=True)
class ImageConfig:
    """How a Machine runs the image by default (the ``config`` object of an OCI image configuration)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    """``NAME=value`` strings, in image order."""
    working_dir: str = ""
    """Empty means ``/``."""
    user: str = ""
    """``user[:group]`` by name or number; empty means root."""


@dataclass(frozen=True)
class Image:
    """One resolved, locally stored image for one platform.

    ``digest`` is the digest of the platform-specific manifest ("sha256:..."), which names the image in the
    store; ``layers`` are the layer blob digests from the bottom layer up.
    """

    ref: str
    digest: str
    config: ImageConfig
    layers: tuple[str, ...]
    architecture: str
    os: str
    config_digest: str = field(default="", compare=False)

    @property
    def platform(self) -> str:
        """``os/architecture`` of the image, e.g. ``linux/amd64``."""
        return f"{self.os}/{self.architecture}"


@dataclass(frozen=True)
class Platform:
    """An ``os/architecture[/variant]`` target, e.g. ``linux/amd64`` or ``linux/arm64/v8``."""

    os: str
    architecture: str
    variant: str = ""

    @classmethod
    def parse(cls, text: str) -> Platform:
        """Parse ``os/arch[/variant]``; InvalidArgumentError names the expected form on bad input."""
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(_PLATFORM_PART.match(p) for p in parts):
            raise InvalidArgumentError(
                f"platform {text!r} is not of the form os/architecture[/variant], e.g. 'linux/amd64'",
                details={"field": "platform"},
            )
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else "")

    def matches(self, os: str, architecture: str, variant: str = "") -> bool:
        """Whether an image for ``os/architecture/variant`` runs as this platform."""
        if os != self.os or architecture != self.architecture:
            return False
        if not self.variant:
            return True
        normal = {"arm64": "v8"}
        return (variant or normal.get(architecture, "")) == self.variant

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


_MACHINE_TO_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "i686": "386",
    "i386": "386",
}


def host_platform() -> Platform:
    """The platform of this host (``linux/amd64`` on x86-64 Linux)."""
    machine = _platform.machine().lower()
    return Platform(_platform.system().lower(), _MACHINE_TO_ARCH.get(machine, machine))
