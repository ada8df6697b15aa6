"""An image's root filesystem as a tree of inodes merged from its layer tar streams, without a host directory.

The layers are read bottom-up with the OCI whiteout semantics of ``_unpack`` (``.wh.<name>`` deletes ``<name>``
from the layers below, ``.wh..wh..opq`` empties its directory of what the layers below put there; a parent
path is resolved through the symlinks of the tree, never leaving its root). Every entry keeps what its tar
header says, whoever runs vz and whatever the host file system's case rules: exact names (bytes), uid, gid,
mode with the setuid/setgid/sticky bits, mtime, xattrs (``SCHILY.xattr.*`` and ``LIBARCHIVE.xattr.*``), device
numbers, symlink targets and hard links (one inode, several names). Regular files' contents are spooled to
numbered files in a private work directory (their host names and owners do not matter); the content of a file
that a later layer replaces or deletes is removed at once.

``_ext4`` writes such a tree into an ext4 image.
"""

from __future__ import annotations

import base64
import itertools
import shutil
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vz_drivers._images._unpack import _CHUNK, _LayerError, _norm, read_layers

__all__ = ["Inode", "LayerTree", "merge_layers"]

_WH = ".wh."
_OPAQUE = ".wh..wh..opq"
_MAX_SYMLINK_FOLLOWS = 40
_XATTR_PREFIXES = ("SCHILY.xattr.", "LIBARCHIVE.xattr.")

DIR, REG, SYMLINK, CHR, BLK, FIFO = "dir", "reg", "symlink", "chr", "blk", "fifo"


@dataclass(eq=False)
class Inode:
    """One inode of the merged tree (a hard link is a second name bound to the same object)."""

    kind: str
    mode: int
    """Permission bits with setuid/setgid/sticky (``0o7777``), without the file type."""
    uid: int = 0
    gid: int = 0
    mtime: int = 0
    xattrs: dict[str, bytes] = field(default_factory=dict)
    rdev: tuple[int, int] = (0, 0)
    target: bytes = b""
    """A symlink's target."""
    data: Path | None = None
    """A regular file's spooled content."""
    size: int = 0
    children: dict[bytes, Inode] | None = None
    """A directory's entries by exact name."""
    links: int = 0
    """How many names are bound to this inode."""
    serial: int = 0


def _name(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _xattrs(member: tarfile.TarInfo) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for key, value in member.pax_headers.items():
        if key.startswith("SCHILY.xattr."):
            out[key[len("SCHILY.xattr.") :]] = value.encode("utf-8", "surrogateescape")
        elif key.startswith("LIBARCHIVE.xattr."):  # bsdtar: the name URL-encoded, the value base64
            from urllib.parse import unquote

            try:
                out[unquote(key[len("LIBARCHIVE.xattr.") :])] = base64.b64decode(value)
            except ValueError as exc:
                raise _LayerError(f"member {member.name!r} has a malformed {key} header: {exc}") from None
    return out


class LayerTree:
    """The merged tree of an image's layers; regular files' contents live under ``spool``."""

    def __init__(self, spool: Path) -> None:
        self.spool = spool
        self._serials = itertools.count(1)
        self.root = self._new(DIR, 0o755, children={})
        self.root.links = 1
        self._fresh_names: set[tuple[int, bytes]] = set()
        """(directory serial, name) of the entries bound by the layer being applied (an opaque marker keeps
        them)."""

    def _new(self, kind: str, mode: int, **kw: object) -> Inode:
        return Inode(kind, mode, serial=next(self._serials), **kw)  # type: ignore[arg-type]

    # -- binding and unbinding names --------------------------------------------------------------------
    def _bind(self, parent: Inode, name: bytes, inode: Inode) -> None:
        assert parent.children is not None
        self._unbind(parent, name)
        parent.children[name] = inode
        inode.links += 1
        self._fresh_names.add((parent.serial, name))

    def _unbind(self, parent: Inode, name: bytes) -> None:
        assert parent.children is not None
        old = parent.children.pop(name, None)
        if old is not None:
            self._release(old)

    def _release(self, inode: Inode) -> None:
        inode.links -= 1
        if inode.links:
            return
        if inode.children is not None:
            for child in inode.children.values():
                self._release(child)
            inode.children.clear()
        if inode.data is not None:
            inode.data.unlink(missing_ok=True)
            inode.data = None

    # -- path resolution inside the tree ------------------------------------------------------------------
    def _resolve_dir(self, parts: Sequence[bytes], *, create: bool, member: str) -> Inode | None:
        """The directory ``parts`` (symlinks followed inside the tree, as the Machine will see them)."""
        stack: list[Inode] = [self.root]
        todo = list(parts)
        follows = 0
        while todo:
            comp = todo.pop(0)
            if comp in (b"", b"."):
                continue
            if comp == b"..":
                if len(stack) == 1:
                    raise _LayerError(
                        f"member {member!r} is reached through a symlink that escapes the root filesystem"
                    )
                stack.pop()
                continue
            cur = stack[-1]
            assert cur.children is not None
            child = cur.children.get(comp)
            if child is None:
                if not create:
                    return None
                child = self._new(DIR, 0o755, children={})
                self._bind(cur, comp, child)
                stack.append(child)
                continue
            if child.kind == SYMLINK:
                follows += 1
                if follows > _MAX_SYMLINK_FOLLOWS:
                    raise _LayerError(f"member {member!r}: too many levels of symbolic links")
                if child.target.startswith(b"/"):
                    stack = [self.root]
                todo = [p for p in child.target.split(b"/") if p] + todo
                continue
            if child.kind != DIR:
                raise _LayerError(f"member {member!r}: {comp.decode(errors='replace')} is not a directory")
            stack.append(child)
        return stack[-1]

    def _opaque(self, directory: Inode) -> None:
        assert directory.children is not None
        for name, child in list(directory.children.items()):
            if (directory.serial, name) in self._fresh_names:
                if child.kind == DIR:
                    self._opaque(child)
                continue
            self._unbind(directory, name)

    # -- applying a layer ---------------------------------------------------------------------------------
    def start_layer(self) -> None:
        self._fresh_names.clear()

    def apply(self, tf: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = [_name(p) for p in _norm(member.name)]
        if not parts:
            if member.isdir():
                self._attributes(self.root, member)
            return
        base = parts[-1]
        if base.startswith(_WH.encode()):
            parent = self._resolve_dir(parts[:-1], create=False, member=member.name)
            if parent is None:
                return
            if base == _OPAQUE.encode():
                self._opaque(parent)
            elif not base.startswith((_WH + _WH).encode()):
                name = base[len(_WH) :]
                if name in (b"", b".", b".."):
                    raise _LayerError(f"whiteout {member.name!r} names no entry")
                self._unbind(parent, name)
            return
        if not (
            member.isreg()
            or member.isdir()
            or member.issym()
            or member.islnk()
            or member.isfifo()
            or member.ischr()
            or member.isblk()
        ):
            return  # tar types with no file (e.g. GNU volume headers): nothing to make
        parent = self._resolve_dir(parts[:-1], create=True, member=member.name)
        assert parent is not None and parent.children is not None
        existing = parent.children.get(base)
        if member.isdir():
            if existing is not None and existing.kind == DIR:
                self._attributes(existing, member)
                self._fresh_names.add((parent.serial, base))
                return
            inode = self._new(DIR, 0, children={})
            self._attributes(inode, member)
            self._bind(parent, base, inode)
            return
        if member.islnk():
            link_parts = [_name(p) for p in _norm(member.linkname)]
            if not link_parts:
                raise _LayerError(f"hard link {member.name!r} has an empty target")
            link_parent = self._resolve_dir(link_parts[:-1], create=False, member=member.name)
            source = None if link_parent is None else (link_parent.children or {}).get(link_parts[-1])
            if source is None:
                raise _LayerError(f"hard link {member.name!r} points at {member.linkname!r}, which does not exist")
            if source.kind == DIR:
                raise _LayerError(f"hard link {member.name!r} points at a directory")
            if source is not existing:
                self._bind(parent, base, source)
            return
        if member.isreg():
            inode = self._new(REG, 0, size=member.size)
            inode.data = self.spool / str(inode.serial)
            src = tf.extractfile(member)
            assert src is not None
            with open(inode.data, "xb") as out:  # a new numbered file in the private spool directory
                shutil.copyfileobj(src, out, _CHUNK)
        elif member.issym():
            inode = self._new(SYMLINK, 0o777, target=_name(member.linkname))
        elif member.isfifo():
            inode = self._new(FIFO, 0)
        else:
            inode = self._new(CHR if member.ischr() else BLK, 0, rdev=(member.devmajor, member.devminor))
        self._attributes(inode, member)
        self._bind(parent, base, inode)

    @staticmethod
    def _attributes(inode: Inode, member: tarfile.TarInfo) -> None:
        if inode.kind != SYMLINK:
            inode.mode = member.mode & 0o7777
        inode.uid = member.uid
        inode.gid = member.gid
        inode.mtime = int(member.mtime)
        inode.xattrs = _xattrs(member)

    # -- reading the result -------------------------------------------------------------------------------
    def walk(self) -> Iterator[tuple[bytes, Inode]]:
        """Every (absolute path, inode) of the tree, parents before children, names in byte order."""

        def visit(path: bytes, inode: Inode) -> Iterator[tuple[bytes, Inode]]:
            yield path, inode
            if inode.children:
                for name in sorted(inode.children):
                    yield from visit((path if path != b"/" else b"") + b"/" + name, inode.children[name])

        yield from visit(b"/", self.root)

    def usage(self) -> tuple[int, int]:
        """(bytes, inodes) the tree occupies, counting a hard-linked file once."""
        seen: set[int] = set()
        total = inodes = 0
        for _, inode in self.walk():
            if inode.serial in seen:
                continue
            seen.add(inode.serial)
            inodes += 1
            total += inode.size if inode.kind == REG else 4096 if inode.kind == DIR else 0
        return total, inodes


def merge_layers(layers: Sequence[tuple[str, Path]], spool: Path) -> LayerTree:
    """Merge ``(digest, blob path)`` layers bottom-up into a ``LayerTree`` spooling contents under ``spool``
    (an existing private directory). Every blob is re-hashed while it is read.

    Raises InvalidArgumentError for malformed or malicious layer content (naming the layer and member),
    UnsupportedError for compressions not handled, BlobCorruptError when a blob no longer matches its digest.
    """
    tree = LayerTree(spool)
    read_layers(layers, tree.start_layer, tree.apply, "use")
    return tree
