"""Image reference syntax.

::

    vz:default                                   the embedded busybox image (no download)
    oci:/abs/path/to/layout[:tag|@sha256:<hex>]  an OCI image layout directory
    docker-archive:/abs/path.tar[:repo[:tag]]    a `docker save` tarball
    [docker://]host[:port]/repo[:tag|@sha256:<hex>]
                                                 a registry speaking the OCI distribution API

Registry references are normalized the way Docker does: the first path component is the registry host when
it contains a ``.`` or a ``:``, is ``localhost``, or is a bracketed IPv6 address; otherwise the name is on
Docker Hub (``docker.io``), where a single-component name gets ``library/`` (``alpine`` ->
``docker.io/library/alpine:latest``, ``ubuntu:24.04``, ``library/debian:12``). ``index.docker.io`` is
``docker.io``. A name without tag or digest means ``:latest``. Docker Hub's distribution API is served at
``registry-1.docker.io`` (``RegistryRef.endpoint``), or through the mirrors of the Docker configuration.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import InvalidArgumentError, NotFoundError
from vz_core.rules import EMBEDDED_IMAGES, HOST_RE, PATH_COMPONENT_RE, TAG_RE, names_registry_host
from vz_drivers._images._model import check_digest

__all__ = [
    "DEFAULT_REF",
    "DOCKER_HUB",
    "DOCKER_HUB_ENDPOINT",
    "DefaultRef",
    "DockerArchiveRef",
    "ImageReference",
    "OciLayoutRef",
    "RegistryRef",
    "is_loopback_host",
    "parse_reference",
]

DOCKER_HUB = "docker.io"
"""How references name Docker Hub."""
DOCKER_HUB_ENDPOINT = "registry-1.docker.io"
"""Where Docker Hub serves the distribution API."""
_HUB_ALIASES = ("docker.io", "index.docker.io", "registry-1.docker.io")

DEFAULT_REF = "vz:default"
"""The embedded default image."""

_EMBEDDED = EMBEDDED_IMAGES


@dataclass(frozen=True)
class DefaultRef:
    """``vz:<name>``: an image vz builds locally."""

    name: str = "default"

    def __str__(self) -> str:
        return f"vz:{self.name}"


@dataclass(frozen=True)
class OciLayoutRef:
    """``oci:<abs path>[:tag|@digest]``."""

    path: Path
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        suffix = f"@{self.digest}" if self.digest else (f":{self.tag}" if self.tag else "")
        return f"oci:{self.path}{suffix}"


@dataclass(frozen=True)
class DockerArchiveRef:
    """``docker-archive:<abs path>[:repo[:tag]]``; ``image`` selects one of the archive's RepoTags."""

    path: Path
    image: str | None = None

    def __str__(self) -> str:
        return f"docker-archive:{self.path}" + (f":{self.image}" if self.image else "")


@dataclass(frozen=True)
class RegistryRef:
    """``host[:port]/repo[:tag|@digest]``; ``reference`` is the digest when pinned, else the tag."""

    host: str
    repository: str
    tag: str | None = "latest"
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What goes after ``/manifests/`` in the distribution API."""
        return self.digest or self.tag or "latest"

    @property
    def hostname(self) -> str:
        """The host without port or IPv6 brackets."""
        host = self.host
        if host.startswith("["):
            return host[1 : host.index("]")]
        return host.rsplit(":", 1)[0] if ":" in host else host

    @property
    def endpoint(self) -> str:
        """The host that serves the distribution API for ``host`` (Docker Hub: ``registry-1.docker.io``)."""
        return DOCKER_HUB_ENDPOINT if self.host == DOCKER_HUB else self.host

    def __str__(self) -> str:
        if self.digest:
            return f"{self.host}/{self.repository}@{self.digest}"
        return f"{self.host}/{self.repository}:{self.tag or 'latest'}"


ImageReference = DefaultRef | OciLayoutRef | DockerArchiveRef | RegistryRef


def _bad(ref: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"image reference {ref!r} is invalid: {why}. Use vz:default, oci:/abs/layout[:tag|@sha256:...], "
        "docker-archive:/abs/file.tar[:repo:tag] or [host[:port]/]repo[:tag|@sha256:...] (no host: Docker Hub)",
        details={"field": "image"},
    )


def _abs_path(ref: str, text: str) -> Path:
    if not text:
        raise _bad(ref, "the path is empty")
    path = Path(text)
    if not path.is_absolute():
        raise _bad(ref, f"the path {text!r} is not absolute")
    if ".." in path.parts:
        raise _bad(ref, f"the path {text!r} contains '..'")
    return path


def parse_reference(ref: str) -> ImageReference:
    """Parse an image reference; raise InvalidArgumentError (or NotFoundError for unknown ``vz:`` names)."""
    if not isinstance(ref, str) or not ref.strip():
        raise _bad(str(ref), "it is empty")
    if ref != ref.strip() or any(c.isspace() for c in ref):
        raise _bad(ref, "it contains whitespace")
    if ref.startswith("vz:"):
        name = ref[3:]
        if name not in _EMBEDDED:
            raise NotFoundError(
                f"there is no embedded image {ref!r}; the embedded images are: "
                + ", ".join(f"vz:{n}" for n in _EMBEDDED),
                details={"field": "image"},
            )
        return DefaultRef(name)
    if ref.startswith("oci:"):
        return _parse_oci(ref, ref[4:])
    if ref.startswith("docker-archive:"):
        rest = ref[len("docker-archive:") :]
        path_text, sep, image = rest.partition(":")
        if sep and not image:
            raise _bad(ref, "the image name after the archive path is empty")
        return DockerArchiveRef(_abs_path(ref, path_text), image or None)
    text = ref[len("docker://") :] if ref.startswith("docker://") else ref
    return _parse_registry(ref, text)


def _parse_oci(ref: str, rest: str) -> OciLayoutRef:
    if "@" in rest:
        path_text, _, digest = rest.rpartition("@")
        check_digest(digest, what="image digest")
        return OciLayoutRef(_abs_path(ref, path_text), digest=digest)
    head, _, last = rest.rpartition("/")
    if ":" in last:
        name, _, tag = last.partition(":")
        if not TAG_RE.fullmatch(tag):
            raise _bad(ref, f"the tag {tag!r} is not valid (letters, digits, '_', '.', '-'; at most 128)")
        return OciLayoutRef(_abs_path(ref, f"{head}/{name}"), tag=tag)
    return OciLayoutRef(_abs_path(ref, rest))


def _parse_registry(ref: str, text: str) -> RegistryRef:
    name, digest = text, None
    if "@" in text:
        name, _, digest = text.partition("@")
        check_digest(digest, what="image digest")
    host, slash, path = name.partition("/")
    if not slash or not names_registry_host(host):
        # Docker's rule: no registry host named means Docker Hub.
        host, path = DOCKER_HUB, name
    if host.lower() in _HUB_ALIASES:
        host = DOCKER_HUB
        if path and "/" not in path:
            path = "library/" + path
    if not HOST_RE.fullmatch(host):
        raise _bad(ref, f"the registry host {host!r} is not a valid host[:port]")
    tag: str | None = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
        if not TAG_RE.fullmatch(tag):
            raise _bad(ref, f"the tag {tag!r} is not valid (letters, digits, '_', '.', '-'; at most 128)")
    components = path.split("/")
    for component in components:
        if not PATH_COMPONENT_RE.fullmatch(component):
            raise _bad(ref, f"the repository component {component!r} is not valid (lowercase letters, digits, '._-')")
    if digest is None and tag is None:
        tag = "latest"
    return RegistryRef(host, path, None if digest else tag, digest)


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (no port; IPv6 without brackets) is ``localhost``, in 127.0.0.0/8, or ``::1``."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
