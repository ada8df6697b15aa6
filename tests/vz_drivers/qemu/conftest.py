"""Fixtures for the qemu driver tests: real QEMU (TCG here), a real guest kernel, real 9p shares.

Booting costs seconds under TCG, so the VM tests share one Machine per module (``booted``), created by a
driver object of its own; each test talks to it through a fresh driver object, which is also how a relaunched
plugin finds a Machine. Every Machine is deleted at the end and no QEMU process may remain.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from qemu_testlib import Booted, make_driver, qemu_processes

from vz_core import HostRequirements, Mount, MountType, RunImageRequest
from vz_drivers.qemu import QemuDriver, cleanup_state


def _require_host() -> None:
    missing = [tool for tool in ("qemu-system-x86_64", "mke2fs") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: apt-get install qemu-system-x86 e2fsprogs")
    if not list(Path("/boot").glob("vmlinuz-*")):
        pytest.fail("no guest kernel in /boot: apt-get install linux-image-amd64")


@pytest.fixture
async def driver(state_dir: Path, image_dir: Path, agent_binary: str) -> AsyncIterator[QemuDriver]:
    """A driver on a private state directory; every Machine it leaves is deleted afterwards."""
    _require_host()
    drv = make_driver(state_dir, image_dir, agent_binary)
    try:
        yield drv
    finally:
        await drv.close()
        await cleanup_state(str(state_dir), image_dir=str(image_dir), agent_binary=agent_binary)
        assert qemu_processes(state_dir) == [], "a QEMU process outlived its Machine"


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory, image_dir: Path, agent_binary: str) -> Iterator[Booted]:
    """One running Machine for a whole module: 1 CPU, 384 MiB, a rw workspace, a ro bind, a volume, a tmpfs."""
    _require_host()
    root = tmp_path_factory.mktemp("qemu-booted")
    workspace = root / "workspace"
    read_only = root / "read-only"
    workspace.mkdir()
    read_only.mkdir()
    (workspace / "hello.txt").write_text("hello from the host\n")
    (read_only / "fixed.txt").write_text("fixed\n")
    state = root / "state"
    request = RunImageRequest(
        workspace_id="booted machine/ü",
        image="vz:default",
        workspace_mount=Mount(MountType.BIND, str(workspace), "/workspace"),
        mounts=(
            Mount(MountType.BIND, str(read_only), "/mnt/ro", read_only=True),
            Mount(MountType.VOLUME, "qemu-test-volume", "/mnt/volume"),
            Mount(MountType.TMPFS, "", "/mnt/scratch"),
        ),
        host_requirements=HostRequirements(cpus=1, memory_bytes=384 * 1024 * 1024),
        environment={"VZ_TEST_SECRET": 'it\'s a "secret"\nwith a newline'},
        entrypoint="sh",
        args=("-c", "echo main says hello; echo main complains >&2; exec sleep 1000000"),
    )

    async def create() -> float:
        drv = make_driver(state, image_dir, agent_binary)
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            await drv.run_image(request)
            return loop.time() - started
        finally:
            await drv.close()

    seconds = asyncio.run(create())
    try:
        yield Booted(request.workspace_id, state, image_dir, agent_binary, workspace, read_only, seconds)
    finally:
        asyncio.run(cleanup_state(str(state), image_dir=str(image_dir), agent_binary=agent_binary))
        left = qemu_processes(state)
        for proc in left:
            proc.kill()
        assert left == [], "a QEMU process outlived the module's Machine"
