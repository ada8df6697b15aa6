"""Lifecycle of real Machines: Stop shuts the guest down cleanly, Start boots the same root disk, recreation
resets it and keeps volumes and the workspace, Delete removes everything, and boot failures are reported."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from machine_testlib import run
from qemu_testlib import make_driver, qemu_processes

from vz_core import Mount, MountType, RunImageRequest
from vz_core.errors import FailedPreconditionError, RuntimeFailureError, UnsupportedError
from vz_drivers._machine import machine_key
from vz_drivers.qemu import QemuDriver

pytestmark = pytest.mark.slow


def _fs_state(disk: Path) -> str:
    out = subprocess.run(["dumpe2fs", "-h", str(disk)], capture_output=True, text=True, check=True).stdout
    return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Filesystem state:"))


async def test_stop_start_recreate_delete(
    driver: QemuDriver, state_dir: Path, image_dir: Path, agent_binary: str, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    request = RunImageRequest(
        workspace_id="life",
        image="vz:default",
        workspace_mount=Mount(MountType.BIND, str(workspace), "/workspace"),
        mounts=(Mount(MountType.VOLUME, "life-volume", "/data"), Mount(MountType.TMPFS, "", "/scratch")),
        args=("sh", "-c", "echo main-started; exec sleep 1000000"),
    )
    await driver.run_image(request)
    first = await driver.find("life")
    assert first is not None and first.state.status == "running"
    ext = await driver.extensions()
    assert ext is not None
    expected_cpus = b"1\n" if ext.accelerator == "tcg" else b"2\n"  # the defaults (no host_requirements)
    assert (await run(driver, "life", "nproc")).stdout == expected_cpus
    write = "echo local > /var/tmp/local; echo vol > /data/v; echo ws > /workspace/w; echo tmp > /scratch/t"
    assert (await run(driver, "life", "sh", "-c", write)).exit.success  # type: ignore[union-attr]

    running_log = b""
    for _ in range(100):
        running_log = b"".join([chunk async for chunk in driver.logs("life")])
        if running_log:
            break
        await asyncio.sleep(0.05)
    assert running_log == b"main-started\n"

    # Stop from another driver object: the first one still holds port 0 (the PID-1 agent), so this one talks to
    # a session agent on another port and has the PID-1 agent stop everything with SIGTERM.
    other = make_driver(state_dir, image_dir, agent_binary)
    try:
        await other.stop("life")
    finally:
        await other.close()
    await driver.stop("life")  # idempotent
    stopped = await driver.find("life")
    assert stopped is not None and stopped.state.status == "stopped" and stopped.id == first.id
    assert qemu_processes(state_dir) == []
    # Logs of the stopped Machine: the completed log kept at Stop, read without booting the VM.
    assert b"".join([chunk async for chunk in driver.logs("life")]) == running_log
    assert qemu_processes(state_dir) == []
    disk = state_dir / "machines" / machine_key("life") / "disk.img"
    assert _fs_state(disk) == "clean", "Stop must unmount the root disk before the VM powers off"
    with pytest.raises(FailedPreconditionError):
        await run(driver, "life", "true")

    await driver.start("life")
    await driver.start("life")  # idempotent
    check = "cat /var/tmp/local /data/v /workspace/w; ls -A /scratch"
    assert (await run(driver, "life", "sh", "-c", check)).stdout == b"local\nvol\nws\n"

    await driver.run_image(replace(request, allow_recreate=True))
    replaced = await driver.find("life")
    assert replaced is not None and replaced.id != first.id and replaced.state.status == "running"
    check = "[ -e /var/tmp/local ] && echo still-there; cat /data/v /workspace/w"
    assert (await run(driver, "life", "sh", "-c", check)).stdout == b"vol\nws\n"

    # An invalid replacement is refused before the running Machine is touched.
    bad = replace(request, allow_recreate=True, mounts=(Mount(MountType.UNSPECIFIED, "x", "/x"),))
    with pytest.raises(UnsupportedError):
        await driver.run_image(bad)
    assert await driver.find("life") == replaced

    await driver.delete("life")
    await driver.delete("life")  # idempotent
    assert await driver.find("life") is None
    assert not (state_dir / "machines" / machine_key("life")).exists()
    assert qemu_processes(state_dir) == []
    assert (workspace / "w").read_text() == "ws\n"


async def test_a_guest_that_cannot_boot_is_reported_with_the_console_reason(
    driver: QemuDriver, state_dir: Path
) -> None:
    await driver.run_image(RunImageRequest(workspace_id="broken", image="vz:default"))
    await driver.stop("broken")
    disk = state_dir / "machines" / machine_key("broken") / "disk.img"
    with disk.open("r+b") as f:  # wipe the superblock: the init cannot mount the root disk any more
        f.write(b"\0" * 8192)
    with pytest.raises(RuntimeFailureError, match="cannot mount the root disk"):
        await driver.start("broken")
    details = await driver.find("broken")
    assert details is not None and details.state.status == "stopped"
    assert "cannot mount the root disk" in details.state.error
    assert qemu_processes(state_dir) == []


async def test_a_qemu_stopped_by_the_host_while_booting_says_who_stopped_it(
    driver: QemuDriver, state_dir: Path
) -> None:
    """QEMU's own last words (its -D log) name the signal and the process that sent it."""
    request = RunImageRequest(workspace_id="stopped-early", image="vz:default")
    creation = asyncio.ensure_future(driver.run_image(request))
    try:
        record = state_dir / "machines" / machine_key("stopped-early") / "record.json"
        found = []
        for _ in range(1200):  # until QEMU is up and detached (the record has its pid): the guest is booting
            pid = json.loads(record.read_text()).get("pid", 0) if record.exists() else 0
            found = [proc for proc in qemu_processes(state_dir) if proc.pid == pid]
            if found or creation.done():
                break
            await asyncio.sleep(0.02)
        assert found and not creation.done(), "the test missed the boot"
        found[0].terminate()
        pattern = r"stopped while starting: QEMU said: .*terminating on signal 15"
        with pytest.raises(RuntimeFailureError, match=pattern) as failed:
            await creation
        assert f"from pid {os.getpid()}" in failed.value.message
    finally:
        if not creation.done():
            creation.cancel()
        with contextlib.suppress(BaseException):
            await creation
    assert await driver.find("stopped-early") is None  # a creation that failed leaves nothing
    assert qemu_processes(state_dir) == []


async def test_qemu_refusing_to_start_leaves_nothing_behind(
    state_dir: Path, image_dir: Path, agent_binary: str, tmp_path: Path
) -> None:
    not_a_kernel = tmp_path / "vmlinuz-bogus"
    not_a_kernel.write_bytes(b"this is not a kernel\n" * 100)
    driver = QemuDriver(
        state_dir=state_dir, image_dir=image_dir, agent_binary=agent_binary, kernel=str(not_a_kernel), accelerator="tcg"
    )
    try:
        with pytest.raises(RuntimeFailureError, match="QEMU refused to start"):
            await driver.run_image(RunImageRequest(workspace_id="no-kernel", image="vz:default"))
        assert await driver.find("no-kernel") is None
        assert qemu_processes(state_dir) == []
        assert not any((state_dir / "machines").iterdir())
    finally:
        await driver.close()


async def test_snapshot_workspace_is_a_point_in_time_copy(driver: QemuDriver, state_dir: Path, tmp_path: Path) -> None:
    """#14 item 5 under QEMU: the 9p share is the copy taken at creation; Delete removes it."""
    worktree = tmp_path / "tree"
    worktree.mkdir()
    (worktree / "a.txt").write_text("at creation\n")
    request = RunImageRequest(
        workspace_id="snap",
        image="vz:default",
        workspace_mount=Mount(MountType.BIND, str(worktree), "/workspace"),
        labels=("vz.workspace=snapshot",),
        args=("sleep", "1000000"),
    )
    await driver.run_image(request)
    try:
        ext = await driver.extensions()
        assert ext is not None and ext.snapshots
        (worktree / "a.txt").write_text("edited on the host later\n")
        assert (await run(driver, "snap", "cat", "/workspace/a.txt")).stdout == b"at creation\n"
        assert (await run(driver, "snap", "sh", "-c", "echo guest > /workspace/g; echo x > /workspace/a.txt")).exit
        assert sorted(p.name for p in worktree.iterdir()) == ["a.txt"]
        assert (worktree / "a.txt").read_text() == "edited on the host later\n"
        copy = state_dir / "machines" / machine_key("snap") / "workspace"
        assert (copy / "g").read_text() == "guest\n"
    finally:
        await driver.delete("snap")
    assert not copy.exists()
