"""A Machine's way from RunImage to the VM helper, with a Mac's host facts and the stand-in framework handed
to the backend: base checks, clones, the boot configuration, and the helper's refusal on this host (which
must leave no Machine behind)."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from macos_fakes import FakeFoundation, FakeFramework
from test_macos_vm_clone import CopyingClone

from vz_core import HostRequirements, Mount, MountType, RunImageRequest
from vz_core.errors import FailedPreconditionError, InvalidArgumentError, RuntimeFailureError
from vz_drivers._machine import machine_key
from vz_drivers.macos_vm import MacosVmDriver
from vz_drivers.macos_vm._backend import MacosVmBackend
from vz_drivers.macos_vm._host import MacHost
from vz_drivers.macos_vm._plan import GIB, plan_from_json
from vz_drivers.macos_vm._realize import Frameworks, Realizer

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="on a Mac the helper really runs")

SHA = hashlib.sha256(b"base").hexdigest()
BASE = "macos-14.5-23F79"
MAC_14 = MacHost(system="Darwin", machine="arm64", macos=(14, 5), bindings=True)
WS_ID = "proj/env/mac"


def _backend(tmp_path: Path, agent: Path, *, install: bool = True, provisioned: bool = True) -> MacosVmBackend:
    descriptor = {
        "schema_version": 1,
        "bases": {
            BASE: {
                "version": "14.5",
                "build": "23F79",
                "sha256": SHA,
                "size": 4,
                "url": "https://updates.example.test/UniversalMac_14.5_23F79_Restore.ipsw",
            }
        },
        "channels": {"stable": BASE, "previous": None},
    }
    (tmp_path / "bases.json").write_text(json.dumps(descriptor))
    backend = MacosVmBackend(
        {"state_dir": str(tmp_path / "state"), "bases_file": str(tmp_path / "bases.json"), "agent_binary": str(agent)},
        host=MAC_14,
    )
    fw = FakeFramework(limits=(1, 8, 1 << 30, 16 * GIB))
    backend.frameworks = lambda: Frameworks(fw, FakeFoundation)
    backend.clonefile = CopyingClone()
    if install:
        root = tmp_path / "state" / "bases" / BASE
        root.mkdir(parents=True)
        (root / "disk.img").write_bytes(b"system disk")
        (root / "aux.img").write_bytes(b"nvram")
        (root / "hardware-model.bin").write_bytes(b"hw")
        marker = {"sha256": SHA, "build": "23F79", "min_cpus": 2, "min_memory": 4 * GIB}
        (root / "installed.json").write_text(json.dumps(marker))
        if provisioned:
            (root / "provisioned").touch()
    return backend


def _read(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _request(ws: Path, **changes: object) -> RunImageRequest:
    request = RunImageRequest(
        workspace_id=WS_ID,
        image="macos:stable",
        workspace_mount=Mount(MountType.BIND, str(ws), "/workspace"),
        mounts=(Mount(MountType.BIND, str(ws), "/Users/Shared/ro", read_only=True),),
        environment={"TOKEN": "secret value"},
        host_requirements=HostRequirements(cpus=2, memory_bytes=4 * GIB),
    )
    return replace(request, **changes)  # type: ignore[arg-type]


async def test_run_image_reaches_the_helper_and_leaves_nothing_when_it_refuses(
    tmp_path: Path, darwin_program: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    backend = _backend(tmp_path, darwin_program)
    driver = MacosVmDriver.with_backend(backend)
    with pytest.raises(
        RuntimeFailureError, match="the macOS VM helper did not start: the macOS VM helper runs on macOS only"
    ):
        await driver.run_image(_request(ws))
    assert [Path(dst.decode()).name for _s, dst, _f in backend.clonefile.calls] == ["disk.img", "aux.img"]  # type: ignore[union-attr]
    assert not (tmp_path / "state" / "machines" / machine_key(WS_ID)).exists()
    assert await driver.find(WS_ID) is None
    assert (tmp_path / "state" / "bases" / BASE / "disk.img").read_bytes() == b"system disk"  # the base stays


async def test_the_boot_configuration_of_a_machine(tmp_path: Path, darwin_program: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    backend = _backend(tmp_path, darwin_program)
    key = machine_key(WS_ID)
    plan = await backend.plan(_request(ws), key)
    await backend.stage(plan)
    record = plan.record
    paths = backend.book.paths(key)
    paths.root.mkdir(parents=True)
    paths.run.mkdir()
    backend.make_machine_dir(record, plan)
    assert paths.machine_identifier.read_bytes().startswith(b"VZMacMachineIdentifier:")
    vm_plan = backend._write_boot(record, paths, darwin_program)
    assert (vm_plan.cpus, vm_plan.memory_bytes) == (2, 4 * GIB)
    assert plan_from_json(json.loads(paths.plan.read_text())) == vm_plan
    assert paths.plan.stat().st_mode & 0o777 == 0o600
    boot = (paths.cfg / "boot.sh").read_text()
    assert "vz_share vz0 /workspace\nvz_share vz1 /Users/Shared/ro\n" in boot
    assert "--env PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin --env 'TOKEN=secret value'" in boot
    assert (paths.cfg / "boot.sh").stat().st_mode & 0o777 == 0o600
    assert _read(paths.cfg / "vz-agent") == _read(darwin_program)
    config = Realizer(backend.frameworks()).configuration(vm_plan)
    tags = [d.args[0] for d in config.props["DirectorySharingDevices"]]
    assert tags == ["vz0", "vz1", "vzcfg"]
    ro = [d.props["Share"].args[0].args[1] for d in config.props["DirectorySharingDevices"]]
    assert ro == [False, True, True]


async def test_resources_are_checked_against_the_base_before_anything_is_created(
    tmp_path: Path, darwin_program: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    driver = MacosVmDriver.with_backend(_backend(tmp_path, darwin_program))
    with pytest.raises(InvalidArgumentError, match=r"2\.\.8 CPUs"):
        await driver.run_image(_request(ws, host_requirements=HostRequirements(cpus=1)))
    assert not (tmp_path / "state" / "machines").exists() or not any((tmp_path / "state" / "machines").iterdir())


async def test_an_unprovisioned_base_asks_for_the_one_administrator_step(tmp_path: Path, darwin_program: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    driver = MacosVmDriver.with_backend(_backend(tmp_path, darwin_program, provisioned=False))
    with pytest.raises(FailedPreconditionError, match=r"not provisioned.*sudo sh .*provision\.sh") as info:
        await driver.run_image(_request(ws))
    script = Path(info.value.details["script"])
    assert _read(script).startswith(b"#!/bin/sh")
    files = script.parent / "provision"
    assert sorted(p.name for p in files.iterdir()) == ["dev.vz.agent.plist", "vz-boot"]
    assert await driver.find(WS_ID) is None


async def test_a_base_that_is_not_installed_is_installed_by_the_helper(tmp_path: Path, darwin_program: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    ipsw = tmp_path / "Restore.ipsw"
    ipsw.write_bytes(b"base")  # its SHA-256 is the pin
    driver = MacosVmDriver.with_backend(_backend(tmp_path, darwin_program, install=False))
    with pytest.raises(
        RuntimeFailureError, match=r"installing base sha256-[0-9a-f]{32} from .* failed \(exit 2\)"
    ) as info:
        await driver.run_image(_request(ws, image=f"ipsw:{ipsw}@sha256:{SHA}"))
    assert "macOS only" in (info.value.runtime_message or "")
    assert await driver.find(WS_ID) is None


async def test_remove_machines_keeps_the_installed_base(tmp_path: Path, darwin_program: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    backend = _backend(tmp_path, darwin_program)
    plan = await backend.plan(_request(ws), machine_key(WS_ID))
    backend.book.ensure()
    backend.book.save(plan.record)
    driver = MacosVmDriver.with_backend(backend)
    found = await driver.find(WS_ID)
    assert found is not None and found.state.status == "stopped"
    await driver.remove_machines()
    assert await driver.find(WS_ID) is None
    assert backend.bases.installed(BASE) is not None


@pytest.mark.parametrize("stop_mode", ["shutdown", "save"])
async def test_stop_goes_through_the_helpers_control_socket(
    tmp_path: Path, darwin_program: Path, stop_mode: str
) -> None:
    import threading

    from macos_fakes import FakeVM, QueueThread

    from vz_drivers.macos_vm._control import ControlServer, VmController

    ws = tmp_path / "ws"
    ws.mkdir()
    backend = _backend(tmp_path, darwin_program)
    plan = await backend.plan(_request(ws), machine_key(WS_ID))
    record = replace(plan.record, stop_mode=stop_mode)
    paths = backend.book.paths(record.key)
    paths.run.mkdir(parents=True)
    queue = QueueThread()
    stopped = threading.Event()
    vm = FakeVM(stopped)
    controller = VmController(
        vm, dispatch=queue.dispatch, url=lambda p: ("file-url", p), save_restore=True, stopped=stopped
    )
    controller.start()
    server = ControlServer(controller, paths.control)
    server.serve_in_thread()
    try:
        state = await backend.control(record, {"op": "state"}, limit=10)
        assert state["state"] == "running"
        await backend.shutdown(record, None)  # type: ignore[arg-type]  # the agent link is not needed here
    finally:
        server.close()
        queue.close()
    if stop_mode == "save":
        assert vm.calls == ["start", "pause", "save", "stop"]
        assert _read(paths.saved_state) == b"saved state"
    else:
        assert vm.calls == ["start", "requestStop"]
        assert not paths.saved_state.exists()
    assert stopped.is_set()
