"""linux_native lifecycle, state on disk, recreation and bad input (real runc, mounts and namespaces)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from machine_testlib import request, run, sh, wait_pid_exit

from vz_core import HostRequirements, Mount, MountType, RecreateMode
from vz_core.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedError,
)
from vz_drivers._machine import machine_key
from vz_drivers.linux_native import LinuxNativeDriver
from vz_drivers.linux_native._mounts import mounts_under

pytestmark = pytest.mark.root


def _machine_dirs(state_dir: Path) -> list[str]:
    machines = state_dir / "machines"
    return sorted(p.name for p in machines.iterdir()) if machines.is_dir() else []


async def test_info_and_extensions(driver: LinuxNativeDriver) -> None:
    info = await driver.info()
    assert info.driver_name == "linux_native" and info.runtime_name == "runc" and info.runtime_version
    assert info.capabilities is not None
    assert info.capabilities.recreate_mode == RecreateMode.DELETE
    assert (await driver.info(supports_recreate_on_run=True)).capabilities.recreate_mode == RecreateMode.ON_RUN  # type: ignore[union-attr]
    assert set(info.capabilities.mount_types) == {MountType.BIND, MountType.VOLUME, MountType.TMPFS}
    ext = await driver.extensions()
    assert ext is not None and ext.resource_limits and not ext.storage_limits and not ext.tty
    await driver.preflight()
    await driver.provisioning_preflight()
    assert await driver.target_architecture("anything") in ("amd64", "arm64")


async def test_lifecycle_is_idempotent_and_reports_real_state(driver: LinuxNativeDriver) -> None:
    wid = "lifecycle"
    assert await driver.find(wid) is None
    await driver.run_image(request(wid))
    found = await driver.find(wid)
    assert found is not None and found.state.status == "running" and found.id and found.created_at
    with pytest.raises(AlreadyExistsError):
        await driver.run_image(request(wid))
    for _ in range(2):
        await driver.stop(wid)
        assert (await driver.find(wid)).state.status == "stopped"  # type: ignore[union-attr]
    assert not mounts_under(driver.state_root), "the root filesystem stays mounted only while running"
    with pytest.raises(FailedPreconditionError):
        await run(driver, wid, "true")
    for _ in range(2):
        await driver.start(wid)
        assert (await driver.find(wid)).state.status == "running"  # type: ignore[union-attr]
    assert (await run(driver, wid, "true")).exit.success
    for _ in range(2):
        await driver.delete(wid)
        assert await driver.find(wid) is None
    for call in (driver.start, driver.stop):
        with pytest.raises(NotFoundError):
            await call(wid)
    with pytest.raises(NotFoundError):
        await run(driver, wid, "true")


@pytest.mark.parametrize(
    "wid", ["a/b", "..", "../x", "with space", "ünïcødé ✓"], ids=["slash", "dotdot", "up", "space", "unicode"]
)
async def test_workspace_ids_are_never_paths(driver: LinuxNativeDriver, state_dir: Path, wid: str) -> None:
    await driver.run_image(request(wid))
    try:
        assert _machine_dirs(state_dir) == [machine_key(wid)]
        assert (await driver.find(wid)).state.status == "running"  # type: ignore[union-attr]
        assert await driver.find(wid + "x") is None
    finally:
        await driver.delete(wid)
    assert _machine_dirs(state_dir) == []


async def test_a_new_driver_instance_finds_machines_and_dead_processes_mean_stopped(
    driver: LinuxNativeDriver, state_dir: Path, image_dir: Path, agent_binary: str
) -> None:
    await driver.run_image(request("persist"))
    await sh(driver, "persist", 'echo kept > "$1"', "/var/tmp/marker")
    other = LinuxNativeDriver(state_dir=state_dir, image_dir=image_dir, agent_binary=agent_binary)
    try:
        assert (await other.find("persist")) == (await driver.find("persist"))
        assert (await run(other, "persist", "cat", "/var/tmp/marker")).stdout == b"kept\n"
        record = other._store.load(machine_key("persist"))
        assert record is not None
        os.kill(record.pid, signal.SIGKILL)
        await wait_pid_exit(record.pid)
        assert (await other.find("persist")).state.status == "stopped"  # type: ignore[union-attr]
        assert (await driver.find("persist")).state.status == "stopped"  # type: ignore[union-attr]
        with pytest.raises(FailedPreconditionError):
            await run(other, "persist", "true")
        await other.start("persist")
        assert (await run(driver, "persist", "cat", "/var/tmp/marker")).stdout == b"kept\n"
    finally:
        await other.close()


async def test_root_layer_survives_restart_and_is_discarded_on_recreation(driver: LinuxNativeDriver) -> None:
    wid = "root-layer"
    await driver.run_image(request(wid))
    first = await driver.find(wid)
    await sh(driver, wid, "echo local > /var/tmp/local; echo etc > /etc/vz-marker")
    await driver.stop(wid)
    await driver.start(wid)
    assert (await run(driver, wid, "cat", "/var/tmp/local", "/etc/vz-marker")).stdout == b"local\netc\n"
    await driver.run_image(request(wid, allow_recreate=True))
    second = await driver.find(wid)
    assert first is not None and second is not None and second.id != first.id
    assert (await run(driver, wid, "cat", "/var/tmp/local")).exit.exit_code != 0


async def test_invalid_recreation_leaves_the_old_machine_untouched(driver: LinuxNativeDriver, tmp_path: Path) -> None:
    wid = "keep-old"
    await driver.run_image(request(wid))
    await sh(driver, wid, "echo x > /var/tmp/marker")
    before = await driver.find(wid)
    bad = [
        request(wid, allow_recreate=True, image="oci:/does/not/exist"),
        request(wid, allow_recreate=True, mounts=(Mount(MountType.BIND, str(tmp_path / "missing"), "/m"),)),
        request(wid, allow_recreate=True, host_requirements=HostRequirements(cpus=4096)),
        request(wid, allow_recreate=True, user="no-such-user"),
    ]
    for req in bad:
        with pytest.raises((InvalidArgumentError, NotFoundError)):
            await driver.run_image(req)
        assert await driver.find(wid) == before
    assert (await run(driver, wid, "cat", "/var/tmp/marker")).stdout == b"x\n"
    await driver.stop(wid)
    with pytest.raises(InvalidArgumentError):
        await driver.run_image(request(wid, allow_recreate=True, host_requirements=HostRequirements(memory_bytes=1)))
    assert await driver.find(wid) == await driver.find(wid) and (await driver.find(wid)).state.status == "stopped"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"workspace_id": ""}, InvalidArgumentError),
        ({"image": ""}, InvalidArgumentError),
        ({"image": "oci:/nonexistent/layout"}, NotFoundError),
        ({"image": "not a reference"}, InvalidArgumentError),
        ({"host_requirements": HostRequirements(cpus=1 << 16)}, InvalidArgumentError),
        ({"host_requirements": HostRequirements(memory_bytes=1 << 50)}, InvalidArgumentError),
        ({"host_requirements": HostRequirements(memory_bytes=1024)}, InvalidArgumentError),
        ({"host_requirements": HostRequirements(storage_bytes=1 << 30)}, UnsupportedError),
        ({"mounts": (Mount(MountType.UNSPECIFIED, "x", "/x"),)}, UnsupportedError),
        ({"mounts": (Mount(MountType.BIND, "/nonexistent/vz-source", "/x"),)}, InvalidArgumentError),
        ({"mounts": (Mount(MountType.BIND, "relative", "/x"),)}, InvalidArgumentError),
        ({"mounts": (Mount(MountType.VOLUME, "bad/name", "/x"),)}, InvalidArgumentError),
        ({"mounts": (Mount(MountType.TMPFS, "", "/proc/x"),)}, InvalidArgumentError),
        ({"mounts": (Mount(MountType.TMPFS, "", "relative"),)}, InvalidArgumentError),
        ({"platform": "linux/s390x"}, UnsupportedError),
        ({"labels": ("vz.egress=sometimes",)}, InvalidArgumentError),
        ({"labels": ("vz.profile=paranoid",)}, InvalidArgumentError),
        ({"user": "ghost"}, InvalidArgumentError),
        ({"remote_user": "ghost"}, InvalidArgumentError),
        ({"uid_map": ("0 1000 1",)}, UnsupportedError),
        ({"cap_add": ("NOT_A_CAP",)}, InvalidArgumentError),
        ({"cap_add": ("SYS_ADMIN",)}, UnsupportedError),
        ({"privileged": True}, UnsupportedError),
    ],
    ids=lambda v: str(v)[:40] if not isinstance(v, type) else v.__name__,
)
async def test_bad_requests_fail_before_anything_is_created(
    driver: LinuxNativeDriver, state_dir: Path, kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error) as info:
        await driver.run_image(request(kwargs.pop("workspace_id", "bad-input"), **kwargs))  # type: ignore[arg-type]
    assert str(info.value)
    assert _machine_dirs(state_dir) == []
    assert not mounts_under(state_dir)


async def test_corrupt_docker_archive_is_refused(driver: LinuxNativeDriver, state_dir: Path, tmp_path: Path) -> None:
    archive = tmp_path / "broken.tar"
    archive.write_bytes(b"this is not a tar archive" * 100)
    with pytest.raises(InvalidArgumentError):
        await driver.run_image(request("corrupt", image=f"docker-archive:{archive}"))
    assert _machine_dirs(state_dir) == []


async def test_changed_runc_binary_is_refused(
    state_dir: Path, image_dir: Path, agent_binary: str, tmp_path: Path
) -> None:
    import shutil

    runc = tmp_path / "bin" / "runc"
    runc.parent.mkdir()
    shutil.copy2(shutil.which("runc") or "/usr/sbin/runc", runc)
    drv = LinuxNativeDriver(state_dir=state_dir, image_dir=image_dir, agent_binary=agent_binary, runc=str(runc))
    await drv.preflight()  # trust on first use records the hash
    with runc.open("ab") as fh:
        fh.write(b"\0tampered")
    again = LinuxNativeDriver(state_dir=state_dir, image_dir=image_dir, agent_binary=agent_binary, runc=str(runc))
    with pytest.raises(FailedPreconditionError, match="changed"):
        await again.preflight()
    with pytest.raises(FailedPreconditionError, match="changed"):
        await again.run_image(request("tampered"))
    # The same driver object notices too: the file's identity changed, so it hashes again.
    with pytest.raises(FailedPreconditionError, match="changed"):
        await drv.preflight()
    assert _machine_dirs(state_dir) == []


async def test_snapshot_workspace_is_a_point_in_time_copy(
    driver: LinuxNativeDriver, state_dir: Path, tmp_path: Path
) -> None:
    """#14 item 5: the copy is taken at creation; later host edits stay out, Machine edits never reach the host,
    Stop/Start keep the copy, Delete removes it."""
    worktree = tmp_path / "tree"
    (worktree / "sub").mkdir(parents=True)
    (worktree / "a.txt").write_text("at creation\n")
    (worktree / "sub" / "b.txt").write_text("b\n")
    os.symlink("a.txt", worktree / "link")
    wid = "snap"
    mount = Mount(MountType.BIND, str(worktree), "/workspace")
    await driver.run_image(request(wid, workspace_mount=mount, labels=("vz.workspace=snapshot",)))
    assert (await driver.extensions()) is not None and (await driver.extensions()).snapshots  # type: ignore[union-attr]
    (worktree / "a.txt").write_text("edited on the host later\n")
    (worktree / "new.txt").write_text("new\n")
    seen = await run(
        driver, wid, "sh", "-c", "cat /workspace/a.txt /workspace/sub/b.txt; readlink /workspace/link; ls /workspace"
    )
    assert seen.stdout == b"at creation\nb\na.txt\na.txt\nlink\nsub\n"
    await sh(driver, wid, "echo machine > /workspace/a.txt; echo m > /workspace/from-machine; rm /workspace/sub/b.txt")
    assert (worktree / "a.txt").read_text() == "edited on the host later\n"
    assert not (worktree / "from-machine").exists() and (worktree / "sub" / "b.txt").exists()
    await driver.stop(wid)
    await driver.start(wid)
    assert (await run(driver, wid, "cat", "/workspace/a.txt")).stdout == b"machine\n"
    copy = state_dir / "machines" / machine_key(wid) / "workspace"
    assert copy.is_dir()
    await driver.delete(wid)
    assert not copy.exists()
    assert sorted(p.name for p in worktree.iterdir()) == ["a.txt", "link", "new.txt", "sub"]


async def test_delete_volume_refuses_while_mounted_then_removes_the_data(
    driver: LinuxNativeDriver, state_dir: Path
) -> None:
    wid = "vol-owner"
    await driver.run_image(request(wid, mounts=(Mount(MountType.VOLUME, "vz-test-vol", "/data"),)))
    await sh(driver, wid, "echo kept > /data/f")
    volumes = state_dir / "volumes"
    assert len(list(volumes.iterdir())) == 1
    await driver.stop(wid)
    with pytest.raises(FailedPreconditionError, match="vol-owner"):
        await driver.delete_volume("vz-test-vol")
    assert len(list(volumes.iterdir())) == 1
    await driver.delete(wid)
    await driver.delete_volume("vz-test-vol")
    assert list(volumes.iterdir()) == []
    await driver.delete_volume("vz-test-vol")  # idempotent
