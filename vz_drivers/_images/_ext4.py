"""An ext4 image written from an image's layer tar streams: ``mke2fs`` with no ``-d``, then ``debugfs -w``.

``mke2fs -d`` copies a host directory, so a root disk made that way carries the host's view of the files: when
vz does not run as root every file belongs to the user running it (setuid binaries and home directories
break), device nodes are missing, and on a case-insensitive host file system names that differ only in case
collapse into one. Here the layers are merged in memory (``_layerfs``) and e2fsprogs' ``debugfs`` writes every
entry with its tar header's exact name, uid, gid, mode (setuid/setgid/sticky included), mtime, xattrs, device
numbers, symlink target and hard links; only regular files' bytes pass through numbered files in a private
spool directory. No privilege, loop device or mount is involved.

debugfs's command language (e2fsprogs ``debugfs/debugfs.c``, ``misc/create_inode.c``, ``lib/ss/parse.c``)
shapes the script: arguments are separated by blanks, a double-quoted argument may hold anything but a line
break (``""`` is a literal quote); ``mknod`` links its name literally into the current directory, so every
entry is created by its base name after ``cd`` to its parent; an argument of the form ``<N>`` names inode N, so
attributes are set through ``./<name>`` or an absolute path; ``ln`` does not count links, so ``links_count`` is
set explicitly, and it does not grow a full directory, so ``expand_dir`` gives the directory room first. A line
is at most 8191 bytes.

**Linear in the entries, also for one large directory.** debugfs looks every new name up in its directory
(``write`` refuses an existing name) and ``ext2fs_link`` scans a directory without an index for room, both
linearly (``lib/ext2fs/lookup.c``, ``link.c``): filling a directory of N entries that way costs N², 10 s of
CPU for 16,000 files in one directory. So each directory gets its subdirectories and its first 12 KiB of
entries (``_SEED_BYTES``) in the first debugfs run; if any directory has more, ``e2fsck -fyD`` then gives every
directory of more than one block an htree (``EXT2_INDEX_FL``), and a second run creates the remaining entries
in a stage directory (``/.vz-stage/e``, which never holds more than the one entry being made, so every lookup
is short), links each into its directory through an alias of it in the stage (``ln ./name ../a``: for an
indexed directory ``ext2fs_link`` inserts by hash, ``dx_link``) and unlinks the stage's name; the stage is
removed, and link counts and the directories' attributes are set last, once every name exists.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from vz_core.errors import InvalidArgumentError, UnavailableError
from vz_drivers._images._layerfs import BLK, CHR, DIR, FIFO, REG, SYMLINK, Inode, LayerTree, merge_layers

__all__ = ["E2FSPROGS_HINT", "find_e2fs_tool", "write_ext4"]

E2FSPROGS_HINT = (
    "install e2fsprogs (Debian/Ubuntu: `apt-get install e2fsprogs`; macOS: `brew install e2fsprogs`), which "
    "provides mke2fs, debugfs and e2fsck"
)
_SBIN_DIRS = (
    "/sbin",
    "/usr/sbin",
    "/opt/homebrew/opt/e2fsprogs/sbin",  # Homebrew's keg-only e2fsprogs (Apple silicon, Intel)
    "/usr/local/opt/e2fsprogs/sbin",
)
_MAX_LINE = 8191
_BANNER = re.compile(r"debugfs \d+\.\d+")
_BYTES_PER_INODE = 16384
_SEED_BYTES = 3 * 4096
"""Entry bytes a directory gets before the rest of it waits for its htree: more than two blocks of the largest
block size, so that ``e2fsck -D`` indexes it (a directory of one block it only compacts)."""
_TYPE_BITS = {DIR: 0o040000, REG: 0o100000, SYMLINK: 0o120000, CHR: 0o020000, BLK: 0o060000, FIFO: 0o010000}
_XATTR_NAMESPACES = ("user.", "trusted.", "security.", "system.posix_acl_access", "system.posix_acl_default")


def find_e2fs_tool(name: str) -> str:
    """The path of e2fsprogs' ``name`` (``mke2fs``, ``debugfs``); UnavailableError naming the fix if missing."""
    found = shutil.which(name) or next((p for d in _SBIN_DIRS if os.access(p := os.path.join(d, name), os.X_OK)), "")
    if not found:
        raise UnavailableError(f"{name} is missing; {E2FSPROGS_HINT}")
    return found


class _ScriptError(Exception):
    """Internal: an entry debugfs's command language cannot express."""


def _quote(arg: bytes) -> bytes:
    if b"\n" in arg or b"\r" in arg:
        raise _ScriptError(f"{arg.decode(errors='replace')!r} contains a line break")
    return b'"' + arg.replace(b'"', b'""') + b'"'


class _Script:
    def __init__(self, spool: Path) -> None:
        self.spool = spool
        self.lines: list[bytes] = []
        self.first_path: dict[int, bytes] = {}
        self.link_counts: dict[int, tuple[bytes, int]] = {}
        self.expand_before_link = True
        """False in the stage directory, which never holds more than the one name being made."""
        self._values = 0

    def add(self, *args: bytes) -> None:
        line = b" ".join(args)
        if len(line) > _MAX_LINE:
            raise _ScriptError(f"a path is too long for debugfs ({len(line)} bytes in one command)")
        self.lines.append(line)

    def attributes(self, ref: bytes, inode: Inode, *, owner: tuple[int, int], mode: int | None) -> None:
        """Set ``ref``'s mode (unless ``mode`` is what it already has), owner, mtime and xattrs."""
        if mode != inode.mode:
            self.add(b"sif", ref, b"mode", b"0%o" % (_TYPE_BITS[inode.kind] | inode.mode))
        if inode.uid != owner[0]:
            self.add(b"sif", ref, b"uid", b"%d" % inode.uid)
        if inode.gid != owner[1]:
            self.add(b"sif", ref, b"gid", b"%d" % inode.gid)
        if inode.kind != SYMLINK or inode.mtime:
            self.add(b"sif", ref, b"mtime", b"@%d" % max(inode.mtime, 0))
        for key, value in sorted(inode.xattrs.items()):
            if not key.startswith(_XATTR_NAMESPACES):
                continue
            self._values += 1
            holder = self.spool / f"xattr-{self._values}"
            holder.write_bytes(value)
            self.add(b"ea_set", b"-f", _quote(os.fsencode(holder)), ref, _quote(key.encode("utf-8", "surrogateescape")))

    def entry(self, path: bytes, name: bytes, inode: Inode) -> None:
        """Create ``name`` (of ``path``) in the current directory (its parent)."""
        ref = _quote(b"./" + name)
        first = self.first_path.get(inode.serial)
        if first is not None:  # a further name of a hard-linked inode
            if self.expand_before_link:
                # ``ln`` (unlike the commands that create an inode) fails on a directory without room for the
                # name: give it an empty block first (legal in ext4; e2fsck -D compacts the large ones).
                self.add(b"expand_dir", b'"."')
            self.add(b"ln", _quote(first), _quote(name))
            return
        self.first_path[inode.serial] = path
        if inode.kind == DIR:
            self.add(b"mkdir", _quote(name))
            return  # attributes after its entries (post-order), see ``write_ext4``
        if inode.kind == REG:
            assert inode.data is not None
            st = os.stat(inode.data)
            self.add(b"write", _quote(os.fsencode(inode.data)), _quote(name))
            self.attributes(ref, inode, owner=(st.st_uid, st.st_gid), mode=st.st_mode & 0o7777)
        elif inode.kind == SYMLINK:
            self.add(b"symlink", _quote(name), _quote(inode.target))
            self.attributes(ref, inode, owner=(0, 0), mode=inode.mode)
        elif inode.kind == FIFO:
            self.add(b"mknod", _quote(name), b"p")
            self.attributes(ref, inode, owner=(0, 0), mode=None)
        else:
            kind = b"c" if inode.kind == CHR else b"b"
            self.add(b"mknod", _quote(name), kind, b"%d" % inode.rdev[0], b"%d" % inode.rdev[1])
            self.attributes(ref, inode, owner=(0, 0), mode=None)
        if inode.links > 1:
            self.link_counts[inode.serial] = (path, inode.links)


def _rec_len(name: bytes) -> int:
    """The bytes a directory entry of ``name`` takes (ext4: 8 + the name rounded up to 4)."""
    return 8 + (len(name) + 3) // 4 * 4


def _stage_name(root: Inode) -> bytes:
    assert root.children is not None
    name = b".vz-stage"
    while name in root.children:
        name += b"_"
    return name


def _scripts(tree: LayerTree, spool: Path) -> tuple[bytes, bytes]:
    """The debugfs command streams: the first runs on the fresh file system, the second (empty when no
    directory is large) after ``e2fsck -fyD`` has given the large directories an htree."""
    script = _Script(spool)
    root = tree.root
    assert root.children is not None
    lost = root.children.get(b"lost+found")
    if lost is not None and lost.kind != DIR:
        script.add(b"rmdir", b"/lost+found")  # mke2fs made one; the image has something else by that name
    # e2fsck would replace a /lost+found that is not a directory: then no directory is filled after an index.
    can_index = lost is None or lost.kind == DIR
    deferred: list[tuple[bytes, list[tuple[bytes, bytes, Inode]]]] = []
    directories: list[tuple[bytes, Inode]] = []

    def visit(path: bytes, directory: Inode) -> None:
        kids = directory.children
        assert kids is not None
        script.add(b"cd", _quote(path))
        # Subdirectories first, while the directory is small (debugfs looks every new name up, linearly).
        names = sorted(kids, key=lambda name: (kids[name].kind != DIR, name))
        subdirs = []
        later: list[tuple[bytes, bytes, Inode]] = []
        seeded = 0
        for name in names:
            child = kids[name]
            child_path = (path if path != b"/" else b"") + b"/" + name
            if child.kind != DIR and can_index and seeded >= _SEED_BYTES:
                later.append((child_path, name, child))
                continue
            seeded += _rec_len(name)
            if path == b"/" and name == b"lost+found" and child.kind == DIR:
                script.first_path[child.serial] = child_path  # mke2fs made it
            else:
                script.entry(child_path, name, child)
            if child.kind == DIR and script.first_path[child.serial] == child_path:
                subdirs.append((child_path, child))
        if later:
            deferred.append((path, later))
        for child_path, child in subdirs:
            visit(child_path, child)
            directories.append((child_path, child))

    visit(b"/", root)
    directories.append((b"/", root))
    first = len(script.lines)
    if deferred:
        # Each large directory now has an htree (more than two blocks of entries when e2fsck -D ran): the rest
        # of its entries are created in a stage directory that stays tiny (every name debugfs looks up is
        # there) and linked into it through an alias of the directory in the stage, which ext2fs_link adds by
        # its hash (dx_link); the stage name is then removed. ``ln``/``unlink`` leave link counts alone.
        stage = b"/" + _stage_name(root)
        script.expand_before_link = False
        script.add(b"mkdir", _quote(stage))
        script.add(b"mkdir", _quote(stage + b"/e"))
        script.add(b"cd", _quote(stage + b"/e"))
        for path, entries in deferred:
            script.add(b"ln", _quote(path), b'"../a"')
            for child_path, name, child in entries:
                script.entry(child_path, name, child)
                script.add(b"ln", _quote(b"./" + name), b'"../a"')
                script.add(b"unlink", _quote(b"./" + name))
            script.add(b"unlink", b'"../a"')
        script.add(b"cd", b'"/"')
        script.add(b"rmdir", _quote(stage + b"/e"))
        script.add(b"rmdir", _quote(stage))
    # Last, once every name exists: hard links' counts (e2fsck would correct a count that is ahead of the
    # names made so far) and directories' attributes, children before parents.
    for _serial, (path, links) in sorted(script.link_counts.items()):
        script.add(b"sif", _quote(path), b"links_count", b"%d" % links)
    for path, directory in directories:
        script.attributes(_quote(path), directory, owner=(0, 0), mode=None)
    lines = script.lines
    if not deferred:
        first = len(lines)  # one stream: no directory waits for an index
    return b"".join(line + b"\n" for line in lines[:first]), b"".join(line + b"\n" for line in lines[first:])


def write_ext4(
    layers: Sequence[tuple[str, Path]], target: Path, size: int, *, image: str, label: str = "vz-root"
) -> tuple[int, int]:
    """Write an ext4 image of ``size`` bytes holding the merged ``(digest, blob path)`` layers to ``target``
    (replaced if present); returns the (bytes, inodes) of the tree written.

    The spool of file contents lives in a private directory beside ``target`` and is removed afterwards.
    Raises InvalidArgumentError when the image's layers cannot become an ext4 root filesystem of that size (or
    are malformed), UnavailableError when e2fsprogs is missing. ``target`` is removed on error.
    """
    mke2fs = find_e2fs_tool("mke2fs")
    debugfs = find_e2fs_tool("debugfs")
    spool = Path(tempfile.mkdtemp(prefix=".spool-", dir=target.parent))
    try:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        tree = merge_layers(layers, spool)
        usage = tree.usage()
        try:
            first, second = _scripts(tree, spool)
        except _ScriptError as exc:
            raise InvalidArgumentError(
                f"image {image!r} cannot become a root disk: {exc}", details={"field": "image"}
            ) from None
        e2fsck = find_e2fs_tool("e2fsck") if second else ""
        argv = [mke2fs, "-q", "-F", "-t", "ext4", "-L", label, "-J", "size=16", "-O", "dir_index"]
        argv += ["-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0"]
        if usage[1] * 5 // 4 + 1024 > size // _BYTES_PER_INODE:
            argv += ["-N", str(usage[1] * 5 // 4 + 1024)]
        _run([*argv, str(target), f"{size // 1024}k"], image=image, size=size, target=target, what="mke2fs")
        for number, commands in enumerate((first, second)):
            if not commands:
                continue
            if number:
                # -D gives every directory of more than one block an htree; nothing else is wrong to repair.
                _run([e2fsck, "-f", "-y", "-D", str(target)], image=image, size=size, target=target, what="e2fsck")
            path = spool / f"commands-{number}"
            path.write_bytes(commands)
            _run([debugfs, "-w", "-f", str(path), str(target)], image=image, size=size, target=target, what="debugfs")
        return usage
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        raise
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def _run(argv: list[str], *, image: str, size: int, target: Path, what: str) -> None:
    fsck = what == "e2fsck"
    proc = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if fsck else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    message = proc.stderr.decode(errors="replace").strip()
    if fsck:
        # e2fsck exits 1 when it changed the file system (-D always does) and prints its banner on stderr.
        ok = proc.returncode in (0, 1)
        errors = [] if ok else [line for line in (proc.stdout or b"").decode(errors="replace").splitlines() if line]
        message = ((proc.stdout or b"").decode(errors="replace") + message).strip()
    else:
        # debugfs reports a failed command on stderr and still exits 0; its only other stderr line is its banner.
        ok = proc.returncode == 0
        errors = [line for line in message.splitlines() if line and not _BANNER.match(line)]
    if not ok or errors:
        raise InvalidArgumentError(
            f"image {image!r} cannot become a root disk of {size} bytes: "
            f"{errors[0] if errors else f'{what} failed (exit status {proc.returncode})'}",
            runtime_message=message[-2000:],
            details={"field": "image"},
        )
