"""The shared cgroup parent: removing it when empty never races a Machine's creation (of any vz on the host)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from vz_drivers.linux_native._cgroup import CgroupParent


def _hierarchies(root: Path) -> list[Path]:
    bases = [root / name for name in ("cpu", "memory", "pids", "freezer")]
    for base in bases:
        base.mkdir(parents=True)
    return bases


def test_the_parent_is_removed_only_when_empty_and_unused(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    bases = _hierarchies(root)
    parent = CgroupParent("vz", root=root, lock_dir=tmp_path)
    for base in bases:
        (base / "vz" / "vz-machine").mkdir(parents=True)
    assert parent.remove_if_unused()
    assert all((base / "vz").is_dir() for base in bases), "a parent that holds a Machine's cgroup stays"
    for base in bases:
        (base / "vz" / "vz-machine").rmdir()
    assert parent.remove_if_unused()
    assert not any((base / "vz").exists() for base in bases)
    assert sorted(p.name for p in root.iterdir()) == ["cpu", "freezer", "memory", "pids"], "nothing else goes"


async def test_a_creation_in_progress_keeps_the_parent(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    bases = _hierarchies(root)
    parent = CgroupParent("vz", root=root, lock_dir=tmp_path)
    other = CgroupParent("vz", root=root, lock_dir=tmp_path)  # another driver (process) on the host
    async with parent.creating():
        (bases[0] / "vz").mkdir()  # runc made the parent in one hierarchy, not yet the Machine's directory
        assert not other.remove_if_unused()
        assert (bases[0] / "vz").is_dir()
        async with other.creating():  # creations never wait for each other
            pass
    assert other.remove_if_unused()
    assert not (bases[0] / "vz").exists()


async def test_creations_racing_removals_never_lose_the_parent(tmp_path: Path) -> None:
    """What ``runc create`` does (make the parent, then the Machine's directory, hierarchy by hierarchy) against
    another driver that removes the empty parent as fast as it can: every creation succeeds."""
    root = tmp_path / "cgroup"
    bases = _hierarchies(root)
    parent = CgroupParent("vz", root=root, lock_dir=tmp_path)
    remover = CgroupParent("vz", root=root, lock_dir=tmp_path)
    stop = threading.Event()
    removals = 0

    def remove() -> None:
        nonlocal removals
        while not stop.is_set():
            if remover.remove_if_unused():
                removals += 1
            time.sleep(0.0001)

    thread = threading.Thread(target=remove)
    thread.start()
    try:
        for i in range(200):
            async with parent.creating():
                for base in bases:
                    (base / "vz").mkdir(exist_ok=True)
                    await asyncio.sleep(0)  # let the remover run between the two mkdirs
                    (base / "vz" / f"vz-{i}").mkdir()  # FileNotFoundError if the parent was taken away
            for base in bases:
                (base / "vz" / f"vz-{i}").rmdir()  # the Machine is deleted; its parent may go now
    finally:
        stop.set()
        thread.join()
    assert removals > 0
