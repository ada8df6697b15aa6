"""The content-addressed image store.

Layout under the store root (default ``vz_core.paths.cache_dir() / "images"``)::

    blobs/sha256/<hex>     every manifest, config and layer blob, named by the sha256 of its bytes
    index.json             ref -> platform -> manifest digest (+ a stamp that says when to re-import)
    rootfs/<hex>/          unpacked root filesystem of the manifest <hex> (read-only by convention)
    tmp/                   staging; a blob or import lands here first and is renamed into place when verified
    locks/                 flock files: gc.lock (shared by resolve/rootfs, exclusive for remove), index.lock,
                           blob-<hex>.lock and rootfs-<hex>.lock (one download/unpack at a time)

Every write goes to a temporary file or directory in the store and is renamed into place only once complete and
verified, so a crash or an error never leaves a half-written blob, index or rootfs under its final name.
Within one process, concurrent ``resolve`` calls for the same reference, downloads of the same blob and unpacks
of the same image share one task; across processes (and store instances) the flock files serialise them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import logging
import lzma
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from vz_core.errors import (
    InvalidArgumentError,
    NotFoundError,
    RuntimeFailureError,
    UnsupportedError,
)
from vz_core.paths import cache_dir
from vz_drivers._files import atomic_write, subpath
from vz_drivers._images._build import Descriptor, layer_media_type, oci_manifest, sha256_digest
from vz_drivers._images._default import build_default_image, find_busybox
from vz_drivers._images._dockerconfig import DockerConfig
from vz_drivers._images._locks import file_lock
from vz_drivers._images._model import (
    INDEX_MEDIA_TYPES,
    MANIFEST_MEDIA_TYPES,
    MEDIA_OCI_CONFIG,
    Image,
    ImageConfig,
    Platform,
    check_digest,
    host_platform,
)
from vz_drivers._images._reference import (
    DefaultRef,
    DockerArchiveRef,
    ImageReference,
    OciLayoutRef,
    RegistryRef,
    parse_reference,
)
from vz_drivers._images._registry import MAX_MANIFEST, BlobSink, RegistryClient
from vz_drivers._images._unpack import BlobCorruptError, unpack_layers

__all__ = ["ImageStore", "RegistryCredentials", "default_store_root"]

_log = logging.getLogger("vz.images")
_T = TypeVar("_T")

_MAX_CONFIG = 8 << 20
_CHUNK = 1 << 20
_INDEX_VERSION = 1
_SUPPORTED_LAYER_TYPES = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/vnd.docker.image.rootfs.diff.tar",
        "application/vnd.oci.image.layer.nondistributable.v1.tar",
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    }
)
_ARCHIVE_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    gzip.BadGzipFile,
    UnicodeDecodeError,
    json.JSONDecodeError,
)
_REF_NAME = "org.opencontainers.image.ref.name"


def default_store_root() -> Path:
    """``vz_core.paths.cache_dir() / "images"``."""
    return cache_dir() / "images"


@dataclass(frozen=True)
class RegistryCredentials:
    """Basic credentials for one registry host; the password never appears in repr, logs or errors."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"RegistryCredentials(username={self.username!r}, password=<redacted>)"


# -- manifest documents --------------------------------------------------------------------------------------


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise InvalidArgumentError(f"{what} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError(f"{what} is not a JSON object")
    return doc


def _descriptor(raw: Any, what: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise InvalidArgumentError(f"{what} has a descriptor that is not an object")
    digest, size, media = raw.get("digest"), raw.get("size"), raw.get("mediaType", "")
    if not isinstance(digest, str) or not isinstance(size, int) or size < 0 or not isinstance(media, str):
        raise InvalidArgumentError(f"{what} has a descriptor without a valid digest/size")
    if not digest.startswith("sha256:"):
        raise UnsupportedError(f"{what} uses digest algorithm {digest.split(':', 1)[0]!r}; only sha256 is supported")
    check_digest(digest, what=f"digest in {what}")
    platform = raw.get("platform")
    plat = {k: str(v) for k, v in platform.items() if isinstance(v, str)} if isinstance(platform, dict) else None
    annotations = raw.get("annotations")
    ann = {k: str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else None
    return Descriptor(media, digest, size, plat, ann)


def _kind(doc: Mapping[str, Any], served_type: str, what: str) -> str:
    """``"index"`` or ``"manifest"``; UnsupportedError for schema 1 and unknown documents."""
    if doc.get("schemaVersion") == 1:
        raise UnsupportedError(f"{what} is a Docker schema 1 manifest, which vz does not support; re-push the image")
    media = doc.get("mediaType") or served_type
    if media in INDEX_MEDIA_TYPES or (not media and "manifests" in doc):
        return "index"
    if media in MANIFEST_MEDIA_TYPES or (not media and "layers" in doc):
        return "manifest"
    raise UnsupportedError(f"{what} has media type {media!r}, which is not an image manifest or index")


def _manifest_parts(data: bytes, what: str) -> tuple[Descriptor, tuple[Descriptor, ...]]:
    doc = _json(data, what)
    if _kind(doc, "", what) != "manifest":
        raise InvalidArgumentError(f"{what} is an index where an image manifest was expected")
    config = _descriptor(doc.get("config"), what)
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, list):
        raise InvalidArgumentError(f"{what} has no layer list")
    layers = tuple(_descriptor(x, what) for x in raw_layers)
    for layer in layers:
        if layer.media_type and layer.media_type not in _SUPPORTED_LAYER_TYPES:
            raise UnsupportedError(
                f"{what} has a layer of media type {layer.media_type!r}; vz unpacks only tar and tar+gzip layers"
            )
    return config, layers


def _select_platform(doc: Mapping[str, Any], platform: Platform, what: str) -> Descriptor:
    raw = doc.get("manifests")
    if not isinstance(raw, list):
        raise InvalidArgumentError(f"{what} has no manifest list")
    descs = [_descriptor(x, what) for x in raw]
    available = []
    for desc in descs:
        plat = desc.platform or {}
        os_, arch, variant = plat.get("os", ""), plat.get("architecture", ""), plat.get("variant", "")
        if os_ and arch:
            available.append("/".join(p for p in (os_, arch, variant) if p))
        if platform.matches(os_, arch, variant):
            return desc
    raise UnsupportedError(
        f"{what} has no image for {platform}; it has: {', '.join(sorted(set(available))) or 'no platforms'}",
        details={"platform": str(platform)},
    )


def _image_config(doc: Mapping[str, Any], what: str) -> ImageConfig:
    cfg = doc.get("config") or {}
    if not isinstance(cfg, dict):
        raise InvalidArgumentError(f"{what}: 'config' is not an object")

    def strings(key: str) -> tuple[str, ...]:
        value = cfg.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidArgumentError(f"{what}: config.{key} is not a list of strings")
        return tuple(value)

    def string(key: str) -> str:
        value = cfg.get(key) or ""
        if not isinstance(value, str):
            raise InvalidArgumentError(f"{what}: config.{key} is not a string")
        return value

    return ImageConfig(strings("Entrypoint"), strings("Cmd"), strings("Env"), string("WorkingDir"), string("User"))


def _check_platform(doc: Mapping[str, Any], platform: Platform, what: str) -> None:
    os_, arch = doc.get("os"), doc.get("architecture")
    if not isinstance(os_, str) or not isinstance(arch, str):
        raise InvalidArgumentError(f"{what}: the image configuration names no os/architecture")
    if not platform.matches(os_, arch, str(doc.get("variant") or "")):
        raise UnsupportedError(
            f"{what} is a {os_}/{arch} image, not {platform}; choose an image built for {platform}",
            details={"platform": str(platform)},
        )


# -- writing blobs -------------------------------------------------------------------------------------------


class _HashingWriter:
    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.fh.write(data)

    @property
    def digest(self) -> str:
        return "sha256:" + self.hash.hexdigest()


def _mismatch(expected: str, actual: str, source: str) -> RuntimeFailureError:
    return RuntimeFailureError(
        f"digest mismatch for a blob from {source}: expected {expected}, got {actual}; the blob was discarded",
        details={"expected": expected, "actual": actual},
    )


class _Staging:
    """A temporary directory of verified blobs that are renamed into the store together (sync; in a thread)."""

    def __init__(self, store: ImageStore) -> None:
        self._store = store
        self.dir = Path(tempfile.mkdtemp(prefix="import-", dir=store.tmp_dir))
        self._staged: dict[str, Path] = {}

    def add(self, write: Callable[[_HashingWriter], None], *, expected: str | None, source: str) -> tuple[str, int]:
        """Stage the bytes ``write`` produces; verify them against ``expected`` when given."""
        fd, name = tempfile.mkstemp(dir=self.dir)
        with os.fdopen(fd, "wb") as fh:
            writer = _HashingWriter(fh)
            write(writer)
        digest = writer.digest
        if expected is not None and digest != expected:
            os.unlink(name)
            raise _mismatch(expected, digest, source)
        self._staged.setdefault(digest, Path(name))
        return digest, writer.size

    def add_bytes(self, data: bytes) -> str:
        def write(out: _HashingWriter) -> None:
            out.write(data)

        return self.add(write, expected=None, source="vz")[0]

    def commit(self) -> None:
        for digest, path in self._staged.items():
            self._store._commit_blob(path, digest)

    def discard(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class ImageStore:
    """Local, content-addressed image store shared by drivers.

    ``insecure_registries`` names registry hosts (``host`` or ``host:port``) that may be reached over plain
    http or with unverified TLS; loopback hosts always may. ``credentials`` maps a registry ``host[:port]`` to
    basic credentials, used for token requests and basic challenges only. All methods are safe to call
    concurrently, from several tasks, store instances and processes on the same root.
    """

    def __init__(
        self,
        root: Path | None = None,
        *,
        insecure_registries: Iterable[str] = (),
        credentials: Mapping[str, RegistryCredentials] | None = None,
        timeout: float = 60.0,
        max_concurrent_downloads: int = 3,
        docker_config: DockerConfig | None = None,
    ) -> None:
        self.root = Path(root) if root is not None else default_store_root()
        self.insecure_registries = frozenset(insecure_registries)
        self._credentials = dict(credentials or {})
        # The user's Docker configuration (credentials, helpers, Docker Hub mirrors), read on first use.
        self._docker = docker_config
        self._client = RegistryClient(
            insecure_registries=self.insecure_registries,
            credentials=self._lookup_credentials,
            timeout=timeout,
            mirrors=lambda: self.docker_config().mirrors,
        )
        self._max_downloads = max(1, max_concurrent_downloads)
        self._tasks: dict[tuple[str, ...], asyncio.Task[Any]] = {}
        self._images: dict[tuple[str, str], Image] = {}

    def __repr__(self) -> str:
        return f"ImageStore(root={str(self.root)!r})"

    # -- paths --------------------------------------------------------------------------------------------
    blobs_dir = subpath("blobs", "sha256")
    rootfs_dir = subpath("rootfs")
    tmp_dir = subpath("tmp")
    """Staging area on the store's filesystem."""
    locks_dir = subpath("locks")
    index_path = subpath("index.json")

    def blob_path(self, digest: str) -> Path:
        """Where the blob ``digest`` lives (whether or not it is present)."""
        return self.blobs_dir / check_digest(digest).split(":", 1)[1]

    def has_blob(self, digest: str) -> bool:
        """Whether the blob ``digest`` is in the store."""
        return self.blob_path(digest).is_file()

    def _ensure_dirs(self) -> None:
        for d in (self.blobs_dir, self.rootfs_dir, self.tmp_dir, self.locks_dir):
            d.mkdir(parents=True, exist_ok=True)

    def docker_config(self) -> DockerConfig:
        """The user's Docker configuration (``$DOCKER_CONFIG``/``~/.docker/config.json``, daemon mirrors)."""
        if self._docker is None:
            self._docker = DockerConfig()
        return self._docker

    def _lookup_credentials(self, host: str) -> tuple[str, str] | None:
        creds = self._credentials.get(host)
        if creds is None and ":" in host and not host.endswith("]"):
            creds = self._credentials.get(host.rsplit(":", 1)[0])
        if creds is not None:
            return creds.username, creds.password
        return self.docker_config().credentials(host)

    # -- shared tasks ---------------------------------------------------------------------------------------
    async def _shared(self, key: tuple[str, ...], make: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``make()`` once per key at a time; concurrent callers await the same task."""
        task = self._tasks.get(key)
        if task is None:

            async def run() -> _T:
                return await make()

            task = asyncio.ensure_future(run())
            self._tasks[key] = task

            def done(t: asyncio.Task[Any]) -> None:
                if self._tasks.get(key) is t:
                    del self._tasks[key]
                if not t.cancelled():
                    t.exception()  # retrieved: a failure nobody awaits any more is not reported twice

            task.add_done_callback(done)
        result: _T = await asyncio.shield(task)
        return result

    # -- index ----------------------------------------------------------------------------------------------
    def _read_index(self) -> dict[str, dict[str, dict[str, str]]]:
        try:
            doc = json.loads(self.index_path.read_bytes())
        except FileNotFoundError:
            return {}
        except ValueError:
            _log.warning("image index %s is unreadable; treating the store as empty", self.index_path)
            return {}
        refs = doc.get("refs") if isinstance(doc, dict) else None
        return refs if isinstance(refs, dict) else {}

    async def _update_index(self, change: Callable[[dict[str, dict[str, dict[str, str]]]], None]) -> None:
        async with file_lock(self.locks_dir / "index.lock"):
            refs = self._read_index()
            change(refs)
            data = json.dumps({"version": _INDEX_VERSION, "refs": refs}, indent=1, sort_keys=True).encode()
            await asyncio.to_thread(atomic_write, self.index_path, data)

    def _entry(self, ref: str, platform: Platform) -> dict[str, str] | None:
        entry = self._read_index().get(ref, {}).get(str(platform))
        return entry if isinstance(entry, dict) and isinstance(entry.get("digest"), str) else None

    # -- blobs ----------------------------------------------------------------------------------------------
    def _commit_blob(self, path: Path, digest: str) -> None:
        """Rename a verified temporary file into the store (identical content may already be there)."""
        final = self.blob_path(digest)
        if final.exists():
            path.unlink()
            return
        with path.open("rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(path, 0o444)
        os.replace(path, final)

    def _read_blob(self, digest: str, limit: int) -> bytes:
        path = self.blob_path(digest)
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise RuntimeFailureError(f"stored blob {digest} is larger than {limit} bytes; remove the image")
        return data

    def _write_blob_sync(self, digest: str, size: int | None, fetch: Callable[[BlobSink], None], source: str) -> None:
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix=f"blob-{digest[7:19]}-")
        try:
            with os.fdopen(fd, "wb") as fh:
                writer = _HashingWriter(fh)
                fetch(writer)
                fh.flush()
            if writer.digest != digest:
                raise _mismatch(digest, writer.digest, source)
            if size is not None and writer.size != size:
                raise RuntimeFailureError(
                    f"blob {digest} from {source} has {writer.size} bytes, the manifest says {size}; discarded it"
                )
            self._commit_blob(Path(name), digest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)

    async def _ensure_blob(self, digest: str, size: int | None, fetch: Callable[[BlobSink], None], source: str) -> None:
        """Make blob ``digest`` present, downloading it at most once per store (in-process and across)."""
        if self.has_blob(digest):
            return

        async def download() -> None:
            async with file_lock(self.locks_dir / f"blob-{digest[7:]}.lock"):
                if not self.has_blob(digest):
                    await asyncio.to_thread(self._write_blob_sync, digest, size, fetch, source)

        await self._shared(("blob", digest), download)

    def _store_bytes(self, data: bytes, digest: str) -> None:
        def write(out: BlobSink) -> None:
            out.write(data)

        if not self.has_blob(digest):
            self._write_blob_sync(digest, len(data), write, "vz")

    def _complete(self, digest: str) -> bool:
        """Whether the manifest ``digest`` and every blob it names are present."""
        try:
            config, layers = _manifest_parts(self._read_blob(digest, MAX_MANIFEST), f"stored manifest {digest}")
        except (OSError, InvalidArgumentError, UnsupportedError, RuntimeFailureError):
            return False
        return all(self.has_blob(d.digest) for d in (config, *layers))

    def _load(self, ref: str, digest: str) -> Image:
        cached = self._images.get((ref, digest))
        if cached is not None:
            return cached
        what = f"image {ref}"
        config_desc, layers = _manifest_parts(self._read_blob(digest, MAX_MANIFEST), f"manifest of {what}")
        doc = _json(self._read_blob(config_desc.digest, _MAX_CONFIG), f"configuration of {what}")
        image = Image(
            ref=ref,
            digest=digest,
            config=_image_config(doc, f"configuration of {what}"),
            layers=tuple(layer.digest for layer in layers),
            architecture=str(doc.get("architecture", "")),
            os=str(doc.get("os", "")),
            config_digest=config_desc.digest,
        )
        self._images[(ref, digest)] = image
        return image

    # -- resolve --------------------------------------------------------------------------------------------
    async def resolve(self, ref: str, *, platform: str = "linux/amd64", refresh: bool = False) -> Image:
        """Make ``ref`` available locally for ``platform`` and describe it.

        Fetches or imports only what is missing: ``vz:default`` is built once per busybox binary, OCI layouts
        are re-read (blobs already present are not copied again), docker-archives are re-imported when the file
        changes, and registry tags are looked up once and then served from the store until ``refresh=True``.
        Concurrent calls for the same reference share one fetch.

        Raises InvalidArgumentError (malformed reference or image), NotFoundError (unknown image, tag, file),
        UnsupportedError (platform or format not handled), PermissionDeniedError (registry refused access),
        UnavailableError (registry unreachable, busybox-static missing), RuntimeFailureError (a digest did not
        verify: the offending blob is discarded and nothing is recorded).
        """
        parsed = parse_reference(ref)
        plat = Platform.parse(platform)
        key = ("resolve", str(parsed), str(plat), "refresh" if refresh else "")
        return await self._shared(key, lambda: self._resolve(parsed, plat, refresh))

    async def _resolve(self, parsed: ImageReference, platform: Platform, refresh: bool) -> Image:
        self._ensure_dirs()
        name = str(parsed)
        async with file_lock(self.locks_dir / "gc.lock", shared=True):
            entry = self._entry(name, platform)
            stamp = ""
            if isinstance(parsed, DefaultRef):
                busybox = find_busybox()
                stamp = busybox.stamp
                if entry and entry.get("stamp") == stamp and self._complete(entry["digest"]):
                    return self._load(name, entry["digest"])
                host = host_platform()
                if not platform.matches(host.os, host.architecture):
                    raise UnsupportedError(
                        f"vz:default is built from this host's busybox and exists only for {host}, not {platform}",
                        details={"platform": str(platform)},
                    )
                blobs = await asyncio.to_thread(build_default_image, busybox)
                for digest, data in blobs.all():
                    await asyncio.to_thread(self._store_bytes, data, digest)
                digest = blobs.manifest_digest
            elif isinstance(parsed, OciLayoutRef):
                digest = await asyncio.to_thread(self._import_oci, parsed, platform)
            elif isinstance(parsed, DockerArchiveRef):
                try:
                    st = parsed.path.stat()
                except FileNotFoundError:
                    raise NotFoundError(
                        f"docker-archive {parsed.path} does not exist; check the path (create it with `docker save`)",
                        details={"image": name},
                    ) from None
                stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
                if entry and entry.get("stamp") == stamp and self._complete(entry["digest"]):
                    return self._load(name, entry["digest"])
                digest = await asyncio.to_thread(self._import_docker_archive, parsed, platform)
            else:
                if entry and not refresh and self._complete(entry["digest"]):
                    return self._load(name, entry["digest"])
                digest = await self._pull(parsed, platform)
            image = self._load(name, digest)

            def record(refs: dict[str, dict[str, dict[str, str]]]) -> None:
                refs.setdefault(name, {})[str(platform)] = {"digest": digest, "stamp": stamp}

            if entry is None or entry.get("digest") != digest or entry.get("stamp", "") != stamp:
                await self._update_index(record)
            return image

    # -- registry -------------------------------------------------------------------------------------------
    async def _pull(self, ref: RegistryRef, platform: Platform) -> str:
        client = self._client
        what = f"image {ref}"
        served = await asyncio.to_thread(client.get_manifest, ref, ref.reference)
        data = served.data
        digest = sha256_digest(data)
        if ref.digest and digest != ref.digest:
            raise _mismatch(ref.digest, digest, f"registry {ref.host} (manifest of {ref})")
        if served.served_digest and served.served_digest != digest:
            raise _mismatch(served.served_digest, digest, f"registry {ref.host} (manifest of {ref})")
        doc = _json(data, f"manifest of {what}")
        if _kind(doc, served.media_type, f"manifest of {what}") == "index":
            desc = _select_platform(doc, platform, what)
            served = await asyncio.to_thread(client.get_manifest, ref, desc.digest)
            data = served.data
            digest = sha256_digest(data)
            if digest != desc.digest:
                raise _mismatch(desc.digest, digest, f"registry {ref.host} (manifest of {ref} for {platform})")
            if _kind(_json(data, f"manifest of {what}"), served.media_type, what) != "manifest":
                raise InvalidArgumentError(f"{what}: the index for {platform} points at another index")
        config, layers = _manifest_parts(data, f"manifest of {what}")
        source = f"registry {ref.host} ({ref.repository})"

        def fetcher(desc: Descriptor) -> Callable[[BlobSink], None]:
            return lambda out: client.fetch_blob(ref, desc.digest, desc.size, out)

        await self._ensure_blob(config.digest, config.size, fetcher(config), source)
        cfg = _json(self._read_blob(config.digest, _MAX_CONFIG), f"configuration of {what}")
        _check_platform(cfg, platform, what)
        limit = asyncio.Semaphore(self._max_downloads)

        async def fetch_layer(desc: Descriptor) -> None:
            async with limit:
                await self._ensure_blob(desc.digest, desc.size, fetcher(desc), source)

        results = await asyncio.gather(*(fetch_layer(d) for d in layers), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        await asyncio.to_thread(self._store_bytes, data, digest)
        return digest

    # -- OCI layout -----------------------------------------------------------------------------------------
    def _import_oci(self, ref: OciLayoutRef, platform: Platform) -> str:
        layout = ref.path
        what = f"OCI layout {layout}"
        if not layout.exists():
            raise NotFoundError(f"{what} does not exist; check the path", details={"image": str(ref)})
        if not (layout / "oci-layout").is_file() or not (layout / "index.json").is_file():
            raise InvalidArgumentError(
                f"{layout} is not an OCI image layout (it needs 'oci-layout' and 'index.json'); "
                "write one with `skopeo copy ... oci:<dir>:<tag>` or `umoci`",
                details={"image": str(ref)},
            )
        index = _json((layout / "index.json").read_bytes(), f"{what} index.json")
        raw = index.get("manifests")
        if not isinstance(raw, list):
            raise InvalidArgumentError(f"{what}: index.json has no manifest list")
        entries = [_descriptor(x, f"{what} index.json") for x in raw]
        tags = sorted({(e.annotations or {}).get(_REF_NAME, "") for e in entries} - {""})
        if ref.digest:
            chosen = [e for e in entries if e.digest == ref.digest]
            if not chosen:
                if not (layout / "blobs" / "sha256" / ref.digest[7:]).is_file():
                    raise NotFoundError(f"{what} has no manifest {ref.digest}", details={"image": str(ref)})
                chosen = [Descriptor("", ref.digest, -1)]
        elif ref.tag:
            chosen = [e for e in entries if (e.annotations or {}).get(_REF_NAME) == ref.tag]
            if not chosen:
                raise NotFoundError(
                    f"{what} has no tag {ref.tag!r}; its tags: {', '.join(tags) or '(none)'}",
                    details={"image": str(ref)},
                )
        else:
            chosen = entries
            if not chosen:
                raise NotFoundError(f"{what} holds no image", details={"image": str(ref)})
        if len(chosen) > 1:
            with_platform = [(e, e.platform) for e in chosen if e.platform]
            matching = [
                e
                for e, p in with_platform
                if platform.matches(p.get("os", ""), p.get("architecture", ""), p.get("variant", ""))
            ]
            if len(with_platform) == len(chosen) and matching:
                chosen = matching[:1]
            elif ref.tag is None and ref.digest is None:
                raise InvalidArgumentError(
                    f"{what} holds several images; name one as oci:{layout}:<tag> (tags: {', '.join(tags) or 'none'})",
                    details={"image": str(ref)},
                )
            else:
                chosen = chosen[:1]
        desc = chosen[0]

        def read_layout_blob(d: Descriptor, limit: int) -> bytes:
            path = layout / "blobs" / "sha256" / d.digest[7:]
            try:
                with path.open("rb") as fh:
                    data = fh.read(limit + 1)
            except FileNotFoundError:
                raise InvalidArgumentError(
                    f"{what} is incomplete: blob {d.digest} is missing", details={"image": str(ref)}
                ) from None
            if len(data) > limit:
                raise InvalidArgumentError(f"{what}: blob {d.digest} is too large for a manifest or configuration")
            actual = sha256_digest(data)
            if actual != d.digest:
                raise _mismatch(d.digest, actual, what)
            return data

        data = read_layout_blob(desc, MAX_MANIFEST)
        doc = _json(data, f"manifest {desc.digest} in {what}")
        if _kind(doc, desc.media_type, f"manifest {desc.digest} in {what}") == "index":
            desc = _select_platform(doc, platform, f"{what} ({desc.digest})")
            data = read_layout_blob(desc, MAX_MANIFEST)
        manifest_digest = sha256_digest(data)
        config, layers = _manifest_parts(data, f"manifest {manifest_digest} in {what}")
        config_bytes = read_layout_blob(config, _MAX_CONFIG)
        _check_platform(_json(config_bytes, f"configuration in {what}"), platform, what)
        if self.has_blob(manifest_digest) and self._complete(manifest_digest):
            return manifest_digest
        staging = _Staging(self)
        try:
            staging.add_bytes(config_bytes)
            for layer in layers:
                if self.has_blob(layer.digest):
                    continue
                path = layout / "blobs" / "sha256" / layer.digest[7:]
                if not path.is_file():
                    raise InvalidArgumentError(f"{what} is incomplete: layer blob {layer.digest} is missing")

                def copy(out: _HashingWriter, path: Path = path) -> None:
                    with path.open("rb") as src:
                        while chunk := src.read(_CHUNK):
                            out.write(chunk)

                staging.add(copy, expected=layer.digest, source=what)
            staging.add_bytes(data)
            staging.commit()
        finally:
            staging.discard()
        return manifest_digest

    # -- docker-archive -------------------------------------------------------------------------------------
    def _import_docker_archive(self, ref: DockerArchiveRef, platform: Platform) -> str:
        path = ref.path
        what = f"docker-archive {path}"
        hint = "re-create it with `docker save -o <file> <image>`"
        staging: _Staging | None = None
        try:
            with tarfile.open(path, mode="r:*") as tf:
                members = {m.name.removeprefix("./").lstrip("/"): m for m in tf.getmembers()}

                def read_member(name: str, limit: int) -> bytes:
                    member = members.get(name.removeprefix("./").lstrip("/"))
                    if member is None or not member.isreg():
                        raise InvalidArgumentError(f"{what} is corrupt: it has no file {name!r}; {hint}")
                    src = tf.extractfile(member)
                    assert src is not None
                    data = src.read(limit + 1)
                    if len(data) > limit:
                        raise InvalidArgumentError(f"{what}: {name!r} is too large")
                    return data

                manifest = json.loads(read_member("manifest.json", MAX_MANIFEST))
                if not isinstance(manifest, list) or not all(isinstance(e, dict) for e in manifest) or not manifest:
                    raise InvalidArgumentError(f"{what}: manifest.json lists no images; {hint}")
                entry = self._archive_entry(ref, manifest, what)
                config_name, layer_names = entry.get("Config"), entry.get("Layers")
                if not isinstance(config_name, str) or not isinstance(layer_names, list):
                    raise InvalidArgumentError(f"{what}: manifest.json entry lacks Config/Layers; {hint}")
                config_bytes = read_member(config_name, _MAX_CONFIG)
                cfg = _json(config_bytes, f"configuration in {what}")
                _check_platform(cfg, platform, what)
                rootfs = cfg.get("rootfs") if isinstance(cfg.get("rootfs"), dict) else {}
                diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
                if not isinstance(diff_ids, list) or len(diff_ids) != len(layer_names):
                    raise InvalidArgumentError(
                        f"{what} is corrupt: the configuration lists {len(diff_ids or [])} layers, "
                        f"manifest.json {len(layer_names)}; {hint}"
                    )
                staging = _Staging(self)
                config_digest = staging.add_bytes(config_bytes)
                descs: list[Descriptor] = []
                for name, diff_id in zip(layer_names, diff_ids, strict=True):
                    member = members.get(str(name).removeprefix("./").lstrip("/"))
                    if member is None or not member.isreg():
                        raise InvalidArgumentError(f"{what} is corrupt: layer {name!r} is missing; {hint}")
                    src = tf.extractfile(member)
                    assert src is not None
                    head = b""

                    def copy(out: _HashingWriter, src: IO[bytes] = src) -> None:
                        nonlocal head
                        while chunk := src.read(_CHUNK):
                            if not head:
                                head = chunk[:2]
                            out.write(chunk)

                    digest, size = staging.add(copy, expected=None, source=what)
                    actual_diff = self._diff_id(staging, digest, head)
                    if actual_diff != diff_id:
                        raise _mismatch(str(diff_id), actual_diff, f"{what} (layer {name})")
                    descs.append(Descriptor(layer_media_type(head), digest, size))
                manifest_bytes = oci_manifest(Descriptor(MEDIA_OCI_CONFIG, config_digest, len(config_bytes)), descs)
                manifest_digest = staging.add_bytes(manifest_bytes)
                staging.commit()
                return manifest_digest
        except FileNotFoundError:
            raise NotFoundError(f"{what} does not exist; check the path", details={"image": str(ref)}) from None
        except _ARCHIVE_ERRORS as exc:
            raise InvalidArgumentError(
                f"{what} is not a readable docker-archive ({type(exc).__name__}: {exc}); {hint}",
                details={"image": str(ref)},
            ) from None
        finally:
            if staging is not None:
                staging.discard()

    @staticmethod
    def _archive_entry(ref: DockerArchiveRef, manifest: Sequence[dict[str, Any]], what: str) -> dict[str, Any]:
        tags = [t for e in manifest for t in (e.get("RepoTags") or []) if isinstance(t, str)]
        if ref.image is None:
            if len(manifest) == 1:
                return manifest[0]
            raise InvalidArgumentError(
                f"{what} holds {len(manifest)} images; name one as docker-archive:{ref.path}:<repo:tag> "
                f"(tags: {', '.join(tags) or 'none'})"
            )
        want = ref.image if ":" in ref.image.rsplit("/", 1)[-1] else f"{ref.image}:latest"
        for entry in manifest:
            repo_tags = [t for t in (entry.get("RepoTags") or []) if isinstance(t, str)]
            if want in repo_tags or f"docker.io/library/{want}" in repo_tags or f"docker.io/{want}" in repo_tags:
                return entry
        raise NotFoundError(
            f"{what} has no image tagged {want!r}; its tags: {', '.join(tags) or '(none)'}",
            details={"image": str(ref)},
        )

    @staticmethod
    def _diff_id(staging: _Staging, digest: str, head: bytes) -> str:
        path = next(p for d, p in staging._staged.items() if d == digest)
        h = hashlib.sha256()
        with path.open("rb") as raw:
            src: IO[bytes] = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw  # type: ignore[assignment]
            while chunk := src.read(_CHUNK):
                h.update(chunk)
        return "sha256:" + h.hexdigest()

    # -- rootfs ---------------------------------------------------------------------------------------------
    async def rootfs(self, image: Image) -> Path:
        """The unpacked root filesystem of ``image`` (``root/rootfs/<digest hex>``), unpacking it once.

        The directory is shared by every user of the image and must be treated as read-only (use an overlay or
        a copy to write). Raises NotFoundError when the image's blobs are not in this store (resolve it first),
        InvalidArgumentError when a layer is malformed or tries to escape the root filesystem, and
        RuntimeFailureError when a stored layer no longer matches its digest (the blob is removed).
        """
        dest = self.rootfs_dir / check_digest(image.digest, what="image digest")[7:]
        if dest.is_dir():
            return dest
        return await self._shared(("rootfs", image.digest), lambda: self._unpack(image, dest))

    async def _unpack(self, image: Image, dest: Path) -> Path:
        self._ensure_dirs()
        gc_lock = file_lock(self.locks_dir / "gc.lock", shared=True)
        async with gc_lock, file_lock(self.locks_dir / f"rootfs-{image.digest[7:]}.lock"):
            if dest.is_dir():  # noqa: ASYNC240 - one stat, cheaper than a thread hop
                return dest
            missing = [d for d in image.layers if not self.has_blob(d)]
            if missing:
                raise NotFoundError(
                    f"image {image.ref} ({image.digest}) is not complete in this store (missing "
                    f"{', '.join(missing)}); resolve it first",
                    details={"image": image.ref},
                )
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{image.digest[7:19]}-", dir=self.rootfs_dir))
            try:
                os.chmod(tmp, 0o755)
                layers = [(d, self.blob_path(d)) for d in image.layers]
                try:
                    stats = await asyncio.to_thread(unpack_layers, layers, tmp)
                except BlobCorruptError as exc:
                    with contextlib.suppress(FileNotFoundError):
                        self.blob_path(exc.details["digest"]).unlink()
                    raise
                os.rename(tmp, dest)
                _log.debug("unpacked %s into %s (%s)", image.ref, dest, stats)
            finally:
                if tmp.exists():  # noqa: ASYNC240
                    await asyncio.to_thread(shutil.rmtree, tmp, True)
            return dest

    # -- listing and removal --------------------------------------------------------------------------------
    def list(self) -> list[Image]:
        """Every stored reference (one Image per reference and platform), sorted by reference."""
        images = []
        for ref, platforms in sorted(self._read_index().items()):
            for _platform, entry in sorted(platforms.items()):
                digest = entry.get("digest") if isinstance(entry, dict) else None
                if not isinstance(digest, str):
                    continue
                try:
                    images.append(self._load(ref, digest))
                except (OSError, InvalidArgumentError, UnsupportedError, RuntimeFailureError):
                    _log.debug("skipping incomplete image %s (%s)", ref, digest)
        return images

    async def remove(self, ref: str) -> bool:
        """Forget ``ref`` (every platform) and delete blobs and root filesystems nothing else refers to.

        Returns whether ``ref`` was stored. Waits for running ``resolve``/``rootfs`` calls (in any process) to
        finish first. Root filesystems of removed images are deleted, so stop Machines using them first.
        """
        name = str(parse_reference(ref))
        if not self.root.is_dir():
            return False
        self._ensure_dirs()
        found = False
        async with file_lock(self.locks_dir / "gc.lock"):

            def drop(refs: dict[str, dict[str, dict[str, str]]]) -> None:
                nonlocal found
                found = refs.pop(name, None) is not None

            await self._update_index(drop)
            self._images = {k: v for k, v in self._images.items() if k[0] != name}
            await asyncio.to_thread(self._collect_garbage)
        return found

    def _collect_garbage(self) -> None:
        keep_blobs: set[str] = set()
        keep_roots: set[str] = set()
        for platforms in self._read_index().values():
            for entry in platforms.values():
                digest = entry.get("digest") if isinstance(entry, dict) else None
                if not isinstance(digest, str):
                    continue
                keep_roots.add(digest[7:])
                keep_blobs.add(digest[7:])
                try:
                    config, layers = _manifest_parts(self._read_blob(digest, MAX_MANIFEST), digest)
                except (OSError, InvalidArgumentError, UnsupportedError, RuntimeFailureError):
                    continue
                keep_blobs.update(d.digest[7:] for d in (config, *layers))
        for blob in self.blobs_dir.iterdir():
            if blob.name not in keep_blobs:
                blob.unlink(missing_ok=True)
        for root in self.rootfs_dir.iterdir():
            if root.name not in keep_roots:
                shutil.rmtree(root, ignore_errors=True)
        for lock in self.locks_dir.glob("*-*.lock"):
            hexd = lock.stem.split("-", 1)[1]
            if hexd not in keep_blobs and hexd not in keep_roots:
                lock.unlink(missing_ok=True)
        for stale in self.tmp_dir.iterdir():
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
