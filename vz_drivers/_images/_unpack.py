"""Unpacking image layers into a root filesystem directory, safely.

Layers are applied bottom-up. Within a layer, ``.wh.<name>`` deletes ``<name>`` from the layers below and
``.wh..wh..opq`` empties its directory of everything the layers below put there (OCI image spec, "Whiteouts").

Safety: member names and hard-link targets containing ``..`` are refused; paths are resolved inside the root
filesystem the way the Machine will see them (an absolute symlink target means the rootfs root), and a symlink
whose target climbs above the root is refused when something would be written through it. Files are created
with ``O_NOFOLLOW | O_EXCL`` after removing what was there, so nothing is ever written outside ``dest``.
Device nodes are skipped (the runtime provides ``/dev``); modes, ownership (when running as root), mtimes,
symlinks, hard links and FIFOs are preserved. Every layer blob is re-hashed while it is read.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import lzma
import os
import shutil
import stat
import sys
import tarfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from vz_core.errors import InvalidArgumentError, RuntimeFailureError, UnsupportedError
from vz_core.platform.files import BINARY, NOFOLLOW, set_xattr

__all__ = ["BlobCorruptError", "UnpackStats", "unpack_layers"]

_log = logging.getLogger("vz.images")

_WH = ".wh."
_OPAQUE = ".wh..wh..opq"
_MAX_SYMLINK_FOLLOWS = 40
_CHUNK = 1 << 20


class BlobCorruptError(RuntimeFailureError):
    """A stored blob no longer hashes to its digest (``details["digest"]`` names it)."""


@dataclass
class UnpackStats:
    """What an unpack did."""

    entries: int = 0
    skipped_devices: int = 0


class _HashingReader:
    """A read-only file wrapper that hashes everything read through it."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.hash = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self.hash.update(data)
        self.size += len(data)
        return data

    def peek(self, n: int) -> bytes:
        """The first ``n`` bytes of the file, without consuming them (only before any read)."""
        head = self._fh.read(n)
        self._fh.seek(0)
        return head

    def drain(self) -> None:
        while data := self.read(_CHUNK):
            del data


class _LayerError(Exception):
    """Internal: a problem with one member, turned into InvalidArgumentError with the layer digest attached."""


def _norm(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _LayerError(f"member {name!r} contains '..' (path traversal)")
    return parts


class _Unpacker:
    def __init__(self, dest: Path) -> None:
        self.root = str(dest)
        # Owners are applied as root only; Windows has no POSIX owners to apply.
        self.is_root = sys.platform != "win32" and os.geteuid() == 0
        self.dirs: dict[str, tarfile.TarInfo] = {}
        self.created: set[str] = set()
        self.stats = UnpackStats()

    # -- path resolution inside the root ------------------------------------------------------------------
    def resolve_dir(self, parts: Sequence[str], *, create: bool, member: str) -> str | None:
        """Real path of the directory ``parts`` inside the root (symlinks followed within it)."""
        cur: list[str] = []
        todo = list(parts)
        follows = 0
        while todo:
            comp = todo.pop(0)
            if comp in ("", "."):
                continue
            if comp == "..":
                if not cur:
                    raise _LayerError(
                        f"member {member!r} is reached through a symlink that escapes the root filesystem"
                    )
                cur.pop()
                continue
            path = os.path.join(self.root, *cur, comp)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                if not create:
                    return None
                os.mkdir(path, 0o755)
                self.created.add(path)
                cur.append(comp)
                continue
            if stat.S_ISLNK(st.st_mode):
                follows += 1
                if follows > _MAX_SYMLINK_FOLLOWS:
                    raise _LayerError(f"member {member!r}: too many levels of symbolic links")
                target = os.readlink(path)
                if target.startswith("/"):
                    cur = []
                todo = [p for p in target.split("/") if p] + todo
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise _LayerError(f"member {member!r}: {'/'.join([*cur, comp])} is not a directory")
            cur.append(comp)
        return os.path.join(self.root, *cur)

    # -- mutation ------------------------------------------------------------------------------------------
    def remove_any(self, path: str) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)

    def opaque(self, directory: str) -> None:
        with os.scandir(directory) as it:
            entries = list(it)
        for entry in entries:
            if entry.path in self.created:
                if entry.is_dir(follow_symlinks=False):
                    self.opaque(entry.path)
                continue
            self.remove_any(entry.path)

    def apply(self, tf: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = _norm(member.name)
        if not parts:
            if member.isdir():
                self.dirs[self.root] = member
            return
        base = parts[-1]
        if base.startswith(_WH):
            parent = self.resolve_dir(parts[:-1], create=False, member=member.name)
            if parent is None:
                return
            if base == _OPAQUE:
                self.opaque(parent)
            elif not base.startswith(_WH + _WH):
                name = base[len(_WH) :]
                if name in ("", ".", ".."):
                    raise _LayerError(f"whiteout {member.name!r} names no entry")
                self.remove_any(os.path.join(parent, name))
            return
        if member.ischr() or member.isblk():
            self.stats.skipped_devices += 1
            _log.debug("skipping device node %s", member.name)
            return
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk() or member.isfifo()):
            _log.debug("skipping %s of unsupported tar type %r", member.name, member.type)
            return
        parent = self.resolve_dir(parts[:-1], create=True, member=member.name)
        assert parent is not None
        target = os.path.join(parent, base)
        self.stats.entries += 1
        if member.isdir():
            try:
                st = os.lstat(target)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(target)
                    os.mkdir(target, 0o700)
            except FileNotFoundError:
                os.mkdir(target, 0o700)
            self.created.add(target)
            self.dirs[target] = member
            self._owner(target, member)
            return
        self.remove_any(target)
        self.created.add(target)
        if member.isreg():
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | BINARY, 0o600)
            with os.fdopen(fd, "wb") as out:
                src = tf.extractfile(member)
                assert src is not None
                shutil.copyfileobj(src, out, _CHUNK)
        elif member.issym():
            os.symlink(member.linkname, target)
        elif member.islnk():
            link_parts = _norm(member.linkname)
            if not link_parts:
                raise _LayerError(f"hard link {member.name!r} has an empty target")
            link_parent = self.resolve_dir(link_parts[:-1], create=False, member=member.name)
            source = os.path.join(link_parent, link_parts[-1]) if link_parent else None
            if source is None or not os.path.lexists(source):
                raise _LayerError(f"hard link {member.name!r} points at {member.linkname!r}, which does not exist")
            if os.path.isdir(source) and not os.path.islink(source):
                raise _LayerError(f"hard link {member.name!r} points at a directory")
            os.link(source, target, follow_symlinks=False)
            return  # a hard link shares the inode (and attributes) of its source
        elif sys.platform == "win32":
            raise _LayerError(f"member {member.name!r} is a FIFO, which a Windows host cannot create")
        else:
            os.mkfifo(target, 0o600)
        self._owner(target, member)
        if not member.issym():
            os.chmod(target, member.mode & 0o7777)
        os.utime(target, ns=(int(member.mtime) * 10**9,) * 2, follow_symlinks=False)
        self._xattrs(target, member)

    def _owner(self, path: str, member: tarfile.TarInfo) -> None:
        if sys.platform != "win32" and self.is_root:
            os.lchown(path, member.uid, member.gid)

    def _xattrs(self, path: str, member: tarfile.TarInfo) -> None:
        if not self.is_root:
            return
        for key, value in member.pax_headers.items():
            if key.startswith("SCHILY.xattr.security.capability"):
                try:
                    set_xattr(path, key[len("SCHILY.xattr.") :], value.encode("utf-8", "surrogateescape"))
                except OSError as exc:  # e.g. a filesystem without xattrs: run without file capabilities
                    _log.debug("could not set %s on %s: %s", key, path, exc)

    def finish(self) -> None:
        # Deepest first, so setting a parent's mtime is not undone by touching a child.
        for path in sorted(self.dirs, key=lambda p: p.count("/"), reverse=True):
            member = self.dirs[path]
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                continue
            os.chmod(path, member.mode & 0o7777)
            os.utime(path, ns=(int(member.mtime) * 10**9,) * 2)


def _open_layer(reader: _HashingReader, digest: str) -> tarfile.TarFile:
    head = reader.peek(6)
    if head[:4] == b"\x28\xb5\x2f\xfd":
        raise UnsupportedError(f"layer {digest} is zstd-compressed, which vz does not unpack; use gzip layers")
    tf: tarfile.TarFile = tarfile.open(fileobj=reader, mode="r|*")  # type: ignore[call-overload]  # noqa: SIM115
    return tf


_TAR_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    gzip.BadGzipFile,
)


def _corrupt(digest: str, actual: str) -> BlobCorruptError:
    return BlobCorruptError(
        f"stored layer blob is corrupt: expected {digest}, got {actual}; it was removed, resolve the image again",
        details={"digest": digest, "actual": actual},
    )


def read_layers(
    layers: Sequence[tuple[str, Path]],
    start_layer: Callable[[], None],
    apply: Callable[[tarfile.TarFile, tarfile.TarInfo], None],
    verb: str,
) -> None:
    """Read ``(digest, blob path)`` layers bottom-up, calling ``start_layer()`` before each and ``apply(tar,
    member)`` for each member, re-hashing every blob as it is read. ``apply`` raises ``_LayerError`` for unsafe
    content; the errors name the layer (``verb``: what was refused, e.g. "unpack"), and a blob that no longer
    matches its digest is BlobCorruptError rather than blamed on the image."""
    for digest, blob in layers:
        start_layer()
        with blob.open("rb") as fh:
            reader = _HashingReader(fh)
            try:
                with _open_layer(reader, digest) as tf:
                    for member in tf:
                        apply(tf, member)
                reader.drain()
            except _LayerError as exc:
                raise InvalidArgumentError(
                    f"layer {digest} is unsafe or malformed: {exc}; refusing to {verb} it",
                    details={"layer": digest},
                ) from None
            except _TAR_ERRORS as exc:
                with contextlib.suppress(OSError):
                    reader.drain()
                actual = "sha256:" + reader.hash.hexdigest()
                if actual != digest:  # the blob rotted in the store: say so rather than blaming the image
                    raise _corrupt(digest, actual) from None
                raise InvalidArgumentError(
                    f"layer {digest} is not a valid (gzip) tar archive: {exc}; re-create or re-pull the image",
                    details={"layer": digest},
                ) from exc
            actual = "sha256:" + reader.hash.hexdigest()
            if actual != digest:
                raise _corrupt(digest, actual)


def unpack_layers(layers: Sequence[tuple[str, Path]], dest: Path) -> UnpackStats:
    """Apply ``(digest, blob path)`` layers bottom-up into the existing empty directory ``dest``.

    Raises InvalidArgumentError for malformed or malicious layer content (naming the layer and member),
    UnsupportedError for compressions not handled, BlobCorruptError when a blob no longer matches its digest.
    ``dest`` is left in an undefined state on error (callers unpack into a temporary directory).
    """
    unpacker = _Unpacker(dest)
    # opaque markers hide what the layers below made, not this layer's entries
    read_layers(layers, unpacker.created.clear, unpacker.apply, "unpack")
    unpacker.finish()
    return unpacker.stats
