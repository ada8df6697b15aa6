"""Lifecycle, conventions and persistence of the fake driver."""

from __future__ import annotations

import asyncio
import platform
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from fake_testlib import feed, request, run_exec, unique_id
from vz_conformance.fake import FAULT_MODES, FakeDriver

from vz_core import (
    API_MAJOR,
    ExecSpec,
    GpuRequirement,
    HostRequirements,
    Mount,
    MountType,
    RecreateMode,
)
from vz_core.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
    UserError,
)
from vz_core.registry import DriverRegistry


def _rfc3339(text: str) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", text), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# Discovery ---------------------------------------------------------------------------------------------------


async def test_info_declares_the_fake_capabilities(driver: FakeDriver) -> None:
    info = await driver.info()
    assert (info.driver_name, info.runtime_name, info.runtime_version) == ("fake", "fake", "1")
    assert info.driver_version
    assert (info.api_major, info.api_minor) == (API_MAJOR, 3)
    caps = info.capabilities
    assert caps is not None
    assert caps.mount_types == ()
    assert caps.recreate_mode == RecreateMode.DELETE
    assert caps.provisioning_preflight and caps.reuse_preflight and caps.logs
    opted_in = await driver.info(supports_recreate_on_run=True)
    assert opted_in.capabilities is not None
    assert opted_in.capabilities.recreate_mode == RecreateMode.ON_RUN


async def test_extensions(driver: FakeDriver) -> None:
    ext = await driver.extensions()
    assert ext.target_os == ("linux",)
    assert ext.profiles == ("developer",)
    assert ext.accelerator == "none"
    assert not (ext.tty or ext.snapshots or ext.resource_limits or ext.storage_limits)
    assert ext.egress_policies == ()


async def test_preflights_and_target_architecture(driver: FakeDriver) -> None:
    await driver.preflight()
    await driver.provisioning_preflight()
    expected = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
    assert await driver.target_architecture(unique_id()) == expected


async def test_preflight_reports_an_unusable_state_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UnavailableError, match="state directory"):
        await FakeDriver(blocker / "state").preflight()


def test_unknown_fault_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(UserError) as caught:
        FakeDriver(tmp_path, faults=["exec-empty-chunk", "no-such-fault"])
    message = str(caught.value)
    assert "'no-such-fault'" in message
    assert all(name in message for name in FAULT_MODES)


def test_faults_as_comma_separated_string(tmp_path: Path) -> None:
    assert FakeDriver(tmp_path, faults="exec-empty-chunk, raw-id-paths").faults == {"exec-empty-chunk", "raw-id-paths"}


def test_default_state_dir_follows_vz_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VZ_HOME", str(tmp_path))
    assert FakeDriver().state_dir == tmp_path / "drivers" / "fake"


def test_registry_builds_the_fake(tmp_path: Path) -> None:
    drv = DriverRegistry().get("fake").create(state_dir=tmp_path)
    assert isinstance(drv, FakeDriver)
    assert drv.state_dir == tmp_path


def test_registration_does_not_import_the_driver_code() -> None:
    code = (
        "import sys, vz_conformance.fake.registration as r; r.vz_builtin_drivers(); "
        "print('vz_conformance.fake._driver' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


# Lifecycle ---------------------------------------------------------------------------------------------------


async def test_find_absent(driver: FakeDriver) -> None:
    assert await driver.find(unique_id()) is None


async def test_run_image_then_find_running(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, labels=("a=b=c", "flag"), user="nobody", remote_user="dev"))
    found = await driver.find(ws)
    assert found is not None
    assert re.fullmatch(r"[0-9a-f]{64}", found.id)
    _rfc3339(found.created_at)
    _rfc3339(found.state.started_at)
    assert found.state.status == "running"
    assert dict(found.config.labels) == {"a": "b=c", "flag": ""}
    assert found.config.user == "nobody"
    assert found.mounts == ()


async def test_stop_start_delete_are_idempotent(driver: FakeDriver, machine: str) -> None:
    first = await driver.find(machine)
    assert first is not None
    for _ in range(2):
        await driver.stop(machine)
        stopped = await driver.find(machine)
        assert stopped is not None and stopped.state.status == "stopped"
    running = None
    for _ in range(2):
        await driver.start(machine)
        running = await driver.find(machine)
        assert running is not None and running.state.status == "running"
    assert running is not None
    assert running.id == first.id
    assert _rfc3339(running.state.started_at) > _rfc3339(first.state.started_at)
    for _ in range(2):
        await driver.delete(machine)
        assert await driver.find(machine) is None


@pytest.mark.parametrize("call", ["start", "stop", "exec", "logs", "reuse_preflight"])
async def test_calls_on_a_missing_machine_are_not_found(driver: FakeDriver, call: str) -> None:
    ws = unique_id()
    with pytest.raises(NotFoundError) as caught:
        if call == "exec":
            async for _ in driver.exec(ExecSpec(ws, ("true",)), feed(())):
                pass
        elif call == "logs":
            async for _ in driver.logs(ws):
                pass
        elif call == "reuse_preflight":
            await driver.reuse_preflight(ws, "root")
        else:
            await getattr(driver, call)(ws)
    assert caught.value.message and ws in caught.value.message
    assert await driver.find(ws) is None


async def test_delete_of_a_missing_machine_succeeds(driver: FakeDriver) -> None:
    await driver.delete(unique_id())


async def test_run_image_on_an_existing_machine_already_exists(driver: FakeDriver, machine: str) -> None:
    before = await driver.find(machine)
    with pytest.raises(AlreadyExistsError, match="--recreate"):
        await driver.run_image(request(machine))
    assert await driver.find(machine) == before


@pytest.mark.parametrize("call", ["find", "run_image", "start", "stop", "delete", "reuse", "target", "exec", "logs"])
async def test_empty_workspace_id_is_invalid(driver: FakeDriver, state_dir: Path, call: str) -> None:
    with pytest.raises(InvalidArgumentError, match="workspace_id"):
        if call == "run_image":
            await driver.run_image(request(""))
        elif call == "reuse":
            await driver.reuse_preflight("", "root")
        elif call == "target":
            await driver.target_architecture("")
        elif call == "exec":
            async for _ in driver.exec(ExecSpec("", ("true",)), feed(())):
                pass
        elif call == "logs":
            async for _ in driver.logs(""):
                pass
        else:
            await getattr(driver, call)("")
    assert not (state_dir / "machines").exists()


@pytest.mark.parametrize("image", ["", "invalid/image", "invalid/"])
async def test_bad_image_is_invalid_and_creates_nothing(driver: FakeDriver, state_dir: Path, image: str) -> None:
    ws = unique_id()
    with pytest.raises(InvalidArgumentError, match="image"):
        await driver.run_image(request(ws, image=image))
    assert await driver.find(ws) is None
    assert not (state_dir / "machines").exists()


async def test_any_other_image_name_is_accepted(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, image="registry.invalid/anything:latest"))
    assert await driver.find(ws) is not None


@pytest.mark.parametrize(
    "req_kwargs",
    [
        {"mounts": (Mount(MountType.BIND, "/src", "/dst"),)},
        {"mounts": (Mount(MountType.VOLUME, "vol", "/data"),)},
        {"mounts": (Mount(MountType.TMPFS, "", "/scratch"),)},
        {"workspace_mount": Mount(MountType.BIND, "/work", "/workspace")},
    ],
    ids=["bind", "volume", "tmpfs", "workspace"],
)
async def test_any_mount_is_unsupported_and_creates_nothing(
    driver: FakeDriver, state_dir: Path, req_kwargs: dict[str, object]
) -> None:
    ws = unique_id()
    mount = req_kwargs.get("workspace_mount") or req_kwargs["mounts"][0]  # type: ignore[index]
    assert isinstance(mount, Mount)
    with pytest.raises(UnsupportedError) as caught:
        await driver.run_image(request(ws, **req_kwargs))
    assert repr(mount.target) in caught.value.message
    assert mount.type.label in caught.value.message
    assert not (state_dir / "machines").exists()


@pytest.mark.parametrize(
    ("req_kwargs", "culprit"),
    [
        ({"host_requirements": HostRequirements(cpus=2)}, "cpus"),
        ({"host_requirements": HostRequirements(memory_bytes=1 << 30)}, "memory_bytes"),
        ({"host_requirements": HostRequirements(storage_bytes=1 << 30)}, "storage_bytes"),
        ({"host_requirements": HostRequirements(gpu=GpuRequirement.REQUIRED)}, "GPU"),
        ({"platform": "linux/s390x"}, "platform"),
        ({"platform": "windows/amd64"}, "platform"),
        ({"labels": ("vz.profile=hardened",)}, "profile"),
        ({"labels": ("vz.egress=deny",)}, "egress"),
    ],
    ids=["cpus", "memory", "storage", "gpu", "arch", "os", "profile", "egress"],
)
async def test_declared_absent_features_are_unsupported_before_creation(
    driver: FakeDriver, state_dir: Path, req_kwargs: dict[str, object], culprit: str
) -> None:
    ws = unique_id()
    with pytest.raises(UnsupportedError, match=culprit):
        await driver.run_image(request(ws, **req_kwargs))
    assert not (state_dir / "machines").exists()


async def test_zero_requirements_and_the_host_platform_are_fine(driver: FakeDriver) -> None:
    host = await driver.target_architecture("x")
    ws = unique_id()
    await driver.run_image(
        request(
            ws,
            host_requirements=HostRequirements(gpu=GpuRequirement.OPTIONAL),
            platform=f"linux/{host}",
            labels=("vz.profile=developer",),
        )
    )
    assert await driver.find(ws) is not None


@pytest.mark.parametrize(
    ("req_kwargs", "culprit"),
    [
        ({"user": "no-such-user-vz"}, "no-such-user-vz"),
        ({"entrypoint": "no-such-command-vz"}, "no-such-command-vz"),
        ({"environment": {"A=B": "x"}}, "A=B"),
        ({"environment": {"OK": "se\0cret"}}, "'OK'"),
    ],
    ids=["user", "entrypoint", "env-name", "env-value"],
)
async def test_invalid_requests_create_nothing(
    driver: FakeDriver, state_dir: Path, req_kwargs: dict[str, object], culprit: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        await driver.run_image(request(unique_id(), **req_kwargs))
    assert culprit in caught.value.message
    assert "cret" not in caught.value.message
    assert not (state_dir / "machines").exists()


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


WEIRD_IDS = ["a/b", "a_b", "..", "../..", "/", ".", "x y", "ünï/cødé €", "a/../b", "a" * 300]


async def test_weird_ids_work_and_stay_distinct(driver: FakeDriver, state_dir: Path) -> None:
    for ws in WEIRD_IDS:
        await driver.run_image(request(ws, labels=(f"ws={ws}",)))
    found = {ws: await driver.find(ws) for ws in WEIRD_IDS}
    assert all(details is not None for details in found.values())
    assert len({details.id for details in found.values() if details}) == len(WEIRD_IDS)
    assert all(details and details.config.labels["ws"] == ws for ws, details in found.items())
    # Every Machine lives under the state directory, one directory each, nothing escaped.
    assert len([name for name in _names(state_dir / "machines") if not name.startswith(".")]) == len(WEIRD_IDS)
    assert _names(state_dir) == ["locks", "machines"]
    await driver.delete("a/b")
    assert await driver.find("a/b") is None
    assert await driver.find("a_b") is not None


# Persistence and concurrency ---------------------------------------------------------------------------------


async def test_a_new_instance_finds_every_machine_in_the_same_state(state_dir: Path) -> None:
    first = FakeDriver(state_dir)
    running, stopped = unique_id(), unique_id()
    await first.run_image(request(running, labels=("k=v",)))
    await first.run_image(request(stopped))
    await first.stop(stopped)
    await run_exec(first, running, ["sh", "-c", 'echo kept > "$VZ_MACHINE_ROOT/marker"'])

    second = FakeDriver(state_dir)
    assert await second.find(running) == await first.find(running)
    assert await second.find(stopped) == await first.find(stopped)
    details = await second.find(stopped)
    assert details is not None and details.state.status == "stopped"
    result = await run_exec(second, running, ["cat", "marker"])
    assert result.stdout == b"kept\n"


async def test_machine_local_data_survives_stop_start(driver: FakeDriver, machine: str) -> None:
    await run_exec(driver, machine, ["sh", "-c", "echo data > marker"])
    await driver.stop(machine)
    await driver.start(machine)
    assert (await run_exec(driver, machine, ["cat", "marker"])).stdout == b"data\n"


async def test_concurrent_run_image_creates_once(state_dir: Path) -> None:
    # Two instances on one state directory contend on the fcntl lock, two tasks on one on the asyncio lock.
    ws = unique_id()
    one, two = FakeDriver(state_dir), FakeDriver(state_dir)
    results = await asyncio.gather(
        one.run_image(request(ws)),
        two.run_image(request(ws)),
        one.run_image(request(ws)),
        return_exceptions=True,
    )
    assert sum(r is None for r in results) == 1, results
    assert all(isinstance(r, AlreadyExistsError) for r in results if r is not None)


async def test_concurrent_mixed_calls_leave_a_consistent_state(state_dir: Path) -> None:
    ws = unique_id()
    drivers = [FakeDriver(state_dir) for _ in range(3)]
    await drivers[0].run_image(request(ws))
    calls = [d.stop(ws) for d in drivers] + [d.start(ws) for d in drivers] + [d.find(ws) for d in drivers]
    for result in await asyncio.gather(*calls, return_exceptions=True):
        assert not isinstance(result, BaseException), result
    details = await drivers[0].find(ws)
    assert details is not None and details.state.status in ("running", "stopped")


async def test_exec_on_a_stopped_machine_fails_precondition(driver: FakeDriver, machine: str) -> None:
    await driver.stop(machine)
    with pytest.raises(FailedPreconditionError, match="stopped"):
        await run_exec(driver, machine, ["true"])
    details = await driver.find(machine)
    assert details is not None and details.state.status == "stopped"


async def test_record_holds_no_image_secret_in_find(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, environment={"TOKEN": "s3cr3t-value"}))
    assert "s3cr3t-value" not in repr(await driver.find(ws))


def test_one_driver_serves_successive_event_loops(tmp_path: Path) -> None:
    driver = FakeDriver(tmp_path)

    async def contend() -> None:
        await asyncio.gather(driver.run_image(request("ws")), driver.run_image(request("ws")), return_exceptions=True)
        await asyncio.gather(driver.stop("ws"), driver.start("ws"), driver.stop("ws"))

    asyncio.run(contend())
    asyncio.run(contend())  # the same locks, contended again from a new loop
