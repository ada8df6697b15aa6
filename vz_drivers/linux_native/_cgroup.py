"""The cgroup parent directory that holds every linux_native Machine's cgroup (``/sys/fs/cgroup/*/vz``).

Every vz on the host shares it: each driver, of any state directory, creates its Machines' cgroups in it (runc
makes the parent on demand) and removes it once it is empty, so that a host with no Machine keeps no vz
directory. Those two must not interleave. ``runc create`` makes the parent and then the Machine's own directory
in it, one hierarchy after another; a removal that finds the parent empty in between takes it away, and runc
fails with "unable to apply cgroup configuration: mkdir ...: no such file or directory".

A host-wide lock file orders them: a creation holds it shared for the whole ``runc create`` (creations never wait
for each other), a removal takes it exclusively and only when nobody holds it. A removal that finds the lock
held skips, since a creation is about to use the parent anyway; the last Machine to go removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from vz_drivers._images import file_lock

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_LOCK_DIRS = (Path("/run/lock"), Path("/run"))


def _lock_dir() -> Path:
    for candidate in _LOCK_DIRS:
        if candidate.is_dir() and os.access(candidate, os.W_OK):
            return candidate
    return Path(tempfile.gettempdir())


class CgroupParent:
    """The parent directory ``name`` in every cgroup hierarchy, and the host-wide lock that guards it."""

    def __init__(self, name: str, *, root: Path = _CGROUP_ROOT, lock_dir: Path | None = None) -> None:
        self.name = name
        self.root = root
        self.lock_path = (lock_dir or _lock_dir()) / f"vz-cgroup-{name}.lock"

    def _open(self) -> int:
        return os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @contextlib.asynccontextmanager
    async def creating(self) -> AsyncIterator[None]:
        """Hold the lock shared while a Machine's cgroup is created in the parent (the wait polls: a removal
        holds the lock for a few rmdir calls, and cancelling the wait leaves nothing held)."""
        async with file_lock(self.lock_path, shared=True):
            yield

    def directories(self) -> Iterator[Path]:
        """The parent in each hierarchy: ``<root>/<controller>/<name>`` (v1) and ``<root>/<name>`` (v2)."""
        if not self.root.is_dir():
            return
        for base in sorted(self.root.iterdir()):
            if base.is_dir() and not base.is_symlink():
                yield base / self.name
        yield self.root / self.name

    def remove_if_unused(self) -> bool:
        """Remove the parent wherever it is empty, unless a creation holds the lock; True if it was tried."""
        try:
            fd = self._open()
        except OSError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            for directory in self.directories():
                with contextlib.suppress(OSError):
                    directory.rmdir()  # fails on a parent that still holds a Machine's cgroup, as it should
            return True
        finally:
            os.close(fd)
