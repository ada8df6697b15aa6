"""Bad input and missing host pieces fail clearly, naming what to do, before anything is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from vz_core import HostRequirements, Mount, MountType, RunImageRequest
from vz_core.errors import InvalidArgumentError, NotFoundError, UnavailableError, UnsupportedError
from vz_drivers._guest import find_kernel
from vz_drivers.qemu import QemuDriver
from vz_drivers.qemu._accel import choose_accelerator


def _nothing_created(state_dir: Path) -> bool:
    machines = state_dir / "machines"
    return not machines.exists() or not any(machines.iterdir())


async def test_missing_qemu_is_named_with_what_to_install(tmp_path: Path) -> None:
    driver = QemuDriver(state_dir=tmp_path / "s", qemu=str(tmp_path / "no-qemu"))
    with pytest.raises(UnavailableError, match="apt-get install qemu-system-x86"):
        await driver.preflight()
    info = await driver.info()  # Info never fails: it just has no runtime version
    assert info.runtime_name == "qemu" and info.runtime_version == ""
    ext = await driver.extensions()
    assert ext is not None and ext.accelerator == "" and "QEMU is missing" in ext.accelerator_reason


async def test_missing_kernel_is_named_with_what_to_install(tmp_path: Path) -> None:
    driver = QemuDriver(state_dir=tmp_path / "s", kernel=str(tmp_path / "vmlinuz-none"))
    with pytest.raises(UnavailableError, match="apt-get install linux-image-amd64"):
        await driver.preflight()
    with pytest.raises(UnavailableError, match="linux-image-amd64"):
        find_kernel(boot_dir=tmp_path, modules_root=tmp_path)


async def test_missing_busybox_is_named(tmp_path: Path) -> None:
    dynamic = tmp_path / "busybox"
    dynamic.write_bytes(b"#!/bin/sh\n")
    driver = QemuDriver(state_dir=tmp_path / "s", busybox=str(dynamic))
    with pytest.raises(UnavailableError, match="busybox-static"):
        await driver.preflight()


def test_unknown_and_bad_options_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="bogus"):
        QemuDriver(bogus=1)
    with pytest.raises(InvalidArgumentError, match="accelerator"):
        QemuDriver(accelerator="hvf")
    with pytest.raises(InvalidArgumentError, match="sessions"):
        QemuDriver(sessions=0)


async def test_kvm_required_fails_clearly_where_kvm_cannot_run_the_guest(tmp_path: Path) -> None:
    from vz_core.paths import cache_dir
    from vz_drivers.qemu._qemu import find_qemu

    kernel = find_kernel()
    verdict = await choose_accelerator(
        "auto", qemu=find_qemu().path, kernel=kernel, cache=cache_dir() / "qemu" / "accel"
    )
    driver = QemuDriver(state_dir=tmp_path / "s", accelerator="kvm")
    if verdict.name == "kvm":
        await driver.preflight()
        return
    with pytest.raises(UnavailableError, match="accelerator=kvm was requested") as caught:
        await driver.preflight()
    assert verdict.reason in caught.value.message
    with pytest.raises(UnavailableError, match="accelerator=kvm"):
        await driver.run_image(RunImageRequest(workspace_id="kvm", image="vz:default"))
    assert _nothing_created(tmp_path / "s")


@pytest.mark.parametrize(
    ("requirements", "field"),
    [
        (HostRequirements(cpus=65536), "host_requirements.cpus"),
        (HostRequirements(memory_bytes=1 << 50), "host_requirements.memory_bytes"),
        (HostRequirements(memory_bytes=64 * 1024 * 1024), "host_requirements.memory_bytes"),
        (HostRequirements(cpus=-1), "host_requirements.cpus"),
        (HostRequirements(storage_bytes=1 << 60), "host_requirements.storage_bytes"),
        (HostRequirements(storage_bytes=4096), "host_requirements.storage_bytes"),
    ],
    ids=["cpus", "memory-huge", "memory-tiny", "cpus-negative", "storage-huge", "storage-too-small-for-the-image"],
)
async def test_impossible_resources_are_refused_before_creation(
    tmp_path: Path, image_dir: Path, agent_binary: str, requirements: HostRequirements, field: str
) -> None:
    driver = QemuDriver(state_dir=tmp_path / "s", image_dir=image_dir, agent_binary=agent_binary)
    request = RunImageRequest(workspace_id="impossible", image="vz:default", host_requirements=requirements)
    with pytest.raises(InvalidArgumentError) as caught:
        await driver.run_image(request)
    assert caught.value.details["field"] == field
    assert await driver.find("impossible") is None
    assert _nothing_created(tmp_path / "s")


@pytest.mark.parametrize(
    ("changes", "error", "text"),
    [
        ({"workspace_id": ""}, InvalidArgumentError, "workspace_id"),
        ({"image": ""}, InvalidArgumentError, "image"),
        ({"platform": "linux/arm64"}, UnsupportedError, "linux/amd64"),
        ({"labels": ("vz.egress=sometimes",)}, InvalidArgumentError, "vz.egress"),
        ({"labels": ("vz.profile=hardened",)}, UnsupportedError, "vz.profile"),
        ({"mounts": (Mount(MountType.UNSPECIFIED, "x", "/x"),)}, UnsupportedError, "mount type"),
        ({"mounts": (Mount(MountType.BIND, "/no/such/dir", "/x"),)}, InvalidArgumentError, "does not exist"),
        ({"mounts": (Mount(MountType.TMPFS, "", "/proc/x"),)}, InvalidArgumentError, "reserved"),
        ({"mounts": (Mount(MountType.TMPFS, "", "/x", options=("exec;rm",)),)}, InvalidArgumentError, "tmpfs"),
        ({"mounts": (Mount(MountType.VOLUME, "../escape", "/x"),)}, InvalidArgumentError, "volume name"),
        ({"user": "no-such-user"}, InvalidArgumentError, "does not exist in the image"),
        ({"uid_map": ("0:1000:1",)}, UnsupportedError, "user namespaces"),
        ({"image": "oci:/no/such/layout"}, NotFoundError, "does not exist"),
    ],
    ids=[
        "empty-id",
        "empty-image",
        "other-platform",
        "egress",
        "profile",
        "mount-type",
        "bind-source",
        "reserved-target",
        "tmpfs-option",
        "volume-name",
        "unknown-user",
        "userns",
        "missing-image",
    ],
)
async def test_bad_requests_are_refused_before_creation(
    tmp_path: Path, image_dir: Path, agent_binary: str, changes: dict[str, object], error: type, text: str
) -> None:
    from dataclasses import replace

    driver = QemuDriver(state_dir=tmp_path / "s", image_dir=image_dir, agent_binary=agent_binary)
    request = replace(RunImageRequest(workspace_id="bad", image="vz:default"), **changes)  # type: ignore[arg-type]
    with pytest.raises(error, match=text):
        await driver.run_image(request)
    assert _nothing_created(tmp_path / "s")


async def test_missing_machines_are_not_found(tmp_path: Path) -> None:
    driver = QemuDriver(state_dir=tmp_path / "s")
    assert await driver.find("nope") is None
    await driver.delete("nope")
    for call in (driver.start, driver.stop):
        with pytest.raises(NotFoundError):
            await call("nope")
    with pytest.raises(NotFoundError):
        await driver.reuse_preflight("nope", "root")
    with pytest.raises(InvalidArgumentError):
        await driver.find("")
