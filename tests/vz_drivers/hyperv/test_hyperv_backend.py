"""The Hyper-V VM lifecycle (create, start, graceful stop then turn-off, remove) against the stand-in host, the
privilege checks of Preflight, and the driver on this (non-Windows) host: everything fails before mutation."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hyperv_standin import WINDOWS, PsError, StandInHyperV

from vz_core import ExecEvent, ExecExit, ExecOutput, ExecSpec, Mount, MountType, RunImageRequest
from vz_core.errors import (
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RuntimeFailureError,
    RuntimeTimeoutError,
    UnavailableError,
    UnsupportedError,
)
from vz_drivers._machine import AgentMachineDriver, machine_key
from vz_drivers.hyperv import HypervDriver
from vz_drivers.hyperv._driver import VM_PID, HypervBackend
from vz_drivers.hyperv._host import host_support
from vz_drivers.hyperv._records import HypervRecord
from vz_drivers.hyperv.registration import DECLARATION


def _record(backend: HypervBackend, workspace_id: str = "proj/env/../m ü") -> HypervRecord:
    key = machine_key(workspace_id)
    paths = backend.book.paths(key)
    paths.vm_dir.mkdir(parents=True)
    paths.disk.write_bytes(b"")
    return HypervRecord(
        workspace_id=workspace_id,
        key=key,
        machine_id="m",
        created_at="t",
        image_ref="vz:default",
        image_digest="sha256:x",
        argv=["sleep", "inf"],
        environment={"TOKEN": "secret"},
        image_env=[],
        working_dir="/",
        user="root",
        developer_identity="root",
        labels={},
        mounts=[],
        cpus=2,
        memory_bytes=1 << 30,
        egress="allow",
        disk_bytes=1 << 31,
        vsock_port=0x12345678,
        switch="Default Switch",
    )


async def test_create_makes_the_documented_generation_2_vm_and_registers_its_socket_service(
    backend: HypervBackend, standin: StandInHyperV
) -> None:
    record = _record(backend)
    state = await backend.create_vm(record)
    vm = standin.vms[record.vm_name]
    assert record.vm_name == "vz-" + record.key and record.vm_id == vm.id == state.id
    assert record.service_id == "12345678-facb-11e6-bd58-64006a7986d3"
    assert (vm.cpus, vm.memory, vm.dynamic_memory, vm.secure_boot) == (2, 1 << 30, False, "Off")
    assert vm.disks == [str(backend.book.paths(record.key).disk)] and vm.first_boot == vm.disks[0]
    assert vm.com1 == f"\\\\.\\pipe\\{record.vm_name}-com1" and not vm.automatic_checkpoints
    assert vm.switch == "Default Switch" and vm.state == "Off"
    assert standin.registry == {"12345678-facb-11e6-bd58-64006a7986d3": f"vz agent of {record.vm_name}"}
    # The workspace id is never a Hyper-V name, a path or a note (only the Machine's key is).
    assert all(record.workspace_id not in json.dumps(args) for _, args in standin.calls)
    # Nor are the Machine's secrets: they live only in its disk's config.sh.
    assert all("secret" not in json.dumps(args) for _, args in standin.calls)
    ids = json.loads((backend.book.paths(record.key).root / "hyperv.json").read_text())
    assert ids == {
        "vm_name": record.vm_name,
        "vm_id": vm.id,
        "service_id": record.service_id,
        "shares": False,
        "share_paths": [],
    }


async def test_secure_boot_template_when_configured(tmp_path: Path, standin: StandInHyperV) -> None:
    b = HypervBackend(
        state_dir=tmp_path, runner=standin, host=WINDOWS, secure_boot_template="MicrosoftUEFICertificateAuthority"
    )
    record = _record(b)
    record.secure_boot = b.secure_boot_template
    await b.create_vm(record)
    vm = standin.vms[record.vm_name]
    assert (vm.secure_boot, vm.template) == ("On", "MicrosoftUEFICertificateAuthority")


async def test_lifecycle_start_graceful_stop_remove(backend: HypervBackend, standin: StandInHyperV) -> None:
    record = _record(backend)
    await backend.boot(record)  # creates, then starts
    assert standin.vms[record.vm_name].state == "Running"
    assert record.pid == VM_PID and record.pid_start > 0
    record.status = "running"
    assert backend.alive(record)
    first_boot = record.pid_start
    state = await backend.stop_vm(record, graceful=True)
    assert state is not None and state.off
    assert [name for name, _ in standin.calls][-1] == "stop"  # no turn-off needed
    assert not backend.alive(record)
    await backend.boot(record)  # the VM exists: only started, a new boot id
    assert [name for name, _ in standin.calls].count("create") == 1 and record.pid_start != first_boot
    await backend.wait_gone(record, limit=0)  # at the limit: turned off
    assert standin.vms[record.vm_name].state == "Off"
    paths = backend.book.paths(record.key)
    await __import__("asyncio").to_thread(backend.remove_tree, paths)
    assert standin.vms == {} and standin.registry == {} and not paths.root.exists()
    removal = await backend.remove_vm(record.vm_name, record.vm_id, record.service_id)
    assert (removal.removed_vm, removal.removed_service) == (False, False)  # idempotent


async def test_a_guest_that_ignores_shutdown_is_turned_off_after_the_bounded_wait(tmp_path: Path) -> None:
    standin = StandInHyperV(guest_shuts_down=False)
    b = HypervBackend(state_dir=tmp_path, runner=standin, host=WINDOWS, stop_timeout=0.3)
    b.stop_slack = 0.2
    AgentMachineDriver(b)  # a backend boots as a driver's: it keeps each boot's identity key there
    record = _record(b)
    await b.boot(record)
    started = time.monotonic()
    state = await b.stop_vm(record, graceful=True)
    elapsed = time.monotonic() - started
    assert state is not None and state.off
    assert [name for name, _ in standin.calls][-2:] == ["stop", "turn-off"] and standin.forced == [record.vm_name]
    assert 0.5 <= elapsed < 5, elapsed


async def test_a_failed_creation_leaves_no_vm(tmp_path: Path) -> None:
    # A Hyper-V Administrator who is not elevated: New-VM works, the HKLM registration is refused.
    standin = StandInHyperV(elevated=False, hyperv_admin=True)
    b = HypervBackend(state_dir=tmp_path, runner=standin, host=WINDOWS)
    record = _record(b)
    with pytest.raises(PermissionDeniedError, match="elevated prompt"):
        await b.create_vm(record)
    assert standin.vms == {} and standin.registry == {}
    assert [name for name, _ in standin.calls] == ["remove", "create", "remove"]


async def test_leftovers_of_a_crashed_creation_are_removed_first(
    backend: HypervBackend, standin: StandInHyperV
) -> None:
    record = _record(backend)
    await backend.create_vm(record)
    old_id = record.vm_id
    record.vm_id = ""  # the record was never saved with it
    await backend.create_vm(record)
    assert len(standin.vms) == 1 and record.vm_id != old_id


async def test_a_vm_removed_behind_vzs_back_is_made_again_from_the_machines_disk(
    backend: HypervBackend, standin: StandInHyperV
) -> None:
    record = _record(backend)
    await backend.boot(record)
    old_id = record.vm_id
    del standin.vms[record.vm_name]  # Remove-VM in Hyper-V Manager
    await backend.boot(record)
    assert record.vm_id != old_id and standin.vms[record.vm_name].state == "Running"
    assert standin.vms[record.vm_name].disks == [str(backend.book.paths(record.key).disk)]


async def test_start_of_a_vm_that_does_not_start_fails_clearly(backend: HypervBackend, standin: StandInHyperV) -> None:
    record = _record(backend)
    await backend.create_vm(record)
    standin.fail["start"] = PsError(
        "The virtual machine could not be started: not enough memory", "ResourceUnavailable"
    )
    with pytest.raises(UnavailableError, match="not enough memory"):
        await backend.start_vm(record)


# ---------------------------------------------------------------------------------------------- preflight


async def test_preflight_needs_the_module_and_privileges(tmp_path: Path) -> None:
    async def preflight(**knobs: Any) -> None:
        b = HypervBackend(state_dir=tmp_path, runner=StandInHyperV(**knobs), host=WINDOWS)
        await b.preflight()
        await b.provisioning_preflight()

    with pytest.raises(UnavailableError, match="Hyper-V PowerShell module is not installed"):
        await preflight(module=False)
    with pytest.raises(PermissionDeniedError, match=r"Hyper-V Administrators.*S-1-5-32-578"):
        await preflight(elevated=False, hyperv_admin=False)
    b = HypervBackend(state_dir=tmp_path, runner=StandInHyperV(elevated=False), host=WINDOWS)
    await b.preflight()  # a Hyper-V Administrator may start, stop and exec
    with pytest.raises(PermissionDeniedError, match="elevated"):
        await b.provisioning_preflight()


def test_host_support_decision() -> None:
    assert "only on Windows" in host_support("Linux").reason and "Linux" in host_support("Linux").reason
    assert "only on Windows" in host_support("Darwin").reason
    assert "Python 3.12" in host_support("Windows", python=(3, 11)).reason
    real = host_support()
    assert not real.supported and "this host is Linux" in real.reason


async def test_plan_refuses_before_touching_anything(
    backend: HypervBackend, standin: StandInHyperV, tmp_path: Path
) -> None:
    # Shares travel over the switch: a Machine without a network adapter cannot have any.
    ws = RunImageRequest(
        workspace_id="w",
        image="vz:default",
        labels=("vz.egress=deny",),
        workspace_mount=Mount(type=MountType.BIND, source=str(tmp_path), target="/work", read_only=True),
    )
    with pytest.raises(UnsupportedError, match=r"over SMB on the Machine's switch.*vz.egress=deny"):
        await backend.plan(ws, machine_key("w"))
    no_switch = HypervBackend(state_dir=backend.book.root, runner=standin, host=WINDOWS, switch="")
    with pytest.raises(UnsupportedError, match=r"the driver option switch is empty"):
        await no_switch.plan(replace(ws, labels=()), machine_key("w"))
    from vz_core import HostRequirements

    odd = RunImageRequest(
        workspace_id="w", image="vz:default", host_requirements=HostRequirements(memory_bytes=(512 << 20) + 4096)
    )
    with pytest.raises(InvalidArgumentError, match="2 MiB steps"):
        await backend.plan(odd, machine_key("w"))
    # A Hyper-V Machine cannot join an Environment's route domain (no Extensions fact topology).
    joined = RunImageRequest(workspace_id="w", image="vz:default", labels=('vz.network={"v":1}',))
    with pytest.raises(UnsupportedError, match=r"vz\.network .* not supported") as info:
        await backend.plan(joined, machine_key("w"))
    assert info.value.details == {"field": "labels", "label": "vz.network"}
    windows = RunImageRequest(workspace_id="w", image="vz:default", platform="windows/amd64")
    with pytest.raises(UnsupportedError, match=r"runs linux/amd64 Machines \(Hyper-V Generation 2\)"):
        await backend.plan(windows, machine_key("w"))  # Windows Machines are PLANNED
    b = HypervBackend(state_dir=backend.book.root, runner=standin, host=WINDOWS, switch="vz")
    with pytest.raises(UnavailableError, match="switch 'vz' does not exist"):
        await b.plan(RunImageRequest(workspace_id="w", image="vz:default"), machine_key("w"))
    assert {name for name, _ in standin.calls} == {"probe"}  # each backend probed once, nothing else ran
    assert not backend.book.machines_dir.exists()


# ---------------------------------------------------------------------------------------------- this host


async def test_on_this_host_info_answers_and_everything_else_fails_before_mutation(tmp_path: Path) -> None:
    state = tmp_path / "state"
    driver = HypervDriver(state_dir=str(state))
    info = await driver.info()
    assert (info.driver_name, info.runtime_name, info.runtime_version) == ("hyperv", "hyper-v", "")
    ext = await driver.extensions()
    assert ext is not None and ext.facts["host_supported"].startswith("no: ") and "DEV" in ext.facts["status"]
    assert ext.accelerator == "" and "only on Windows" in ext.accelerator_reason
    for call in (driver.preflight(), driver.provisioning_preflight()):
        with pytest.raises(UnsupportedError, match=r"exists only on Windows.*this host is Linux"):
            await call
    with pytest.raises(UnsupportedError, match="only on Windows"):
        await driver.run_image(RunImageRequest(workspace_id="proj/m", image="vz:default"))
    with pytest.raises(InvalidArgumentError, match="needs an image"):
        await driver.run_image(RunImageRequest(workspace_id="proj/m", image=""))
    assert not state.exists(), "a refused RunImage created state"
    assert await driver.find("proj/m") is None
    await driver.delete("proj/m")
    with pytest.raises(NotFoundError):
        await driver.start("proj/m")
    with pytest.raises(NotFoundError):
        async for _ in driver.exec(ExecSpec(workspace_id="proj/m", argv=("true",)), _empty()):
            pass
    await driver.close()


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""


def test_declaration_matrix_and_options() -> None:
    rows = {(r.host_os, r.target_os): r.status for r in DECLARATION.matrix}
    assert rows == {("windows", "linux"): "DEV", ("windows", "windows"): "PLANNED"}
    assert DECLARATION.factory == "vz_drivers.hyperv:HypervDriver"
    with pytest.raises(
        InvalidArgumentError, match=r"unknown hyperv option\(s\): sessions; valid options: .*state_dir.*switch"
    ):
        HypervDriver(sessions=3)
    help_text = DECLARATION.plugin_parser().format_help()
    assert "--switch" in help_text and "--secure-boot-template" in help_text


class _FakeGuest:
    """An agent client whose mount commands hang, or fail quoting their stdin."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.seen: list[tuple[ExecSpec, bytes, str | None]] = []

    async def exec(
        self, spec: ExecSpec, stdin: AsyncIterator[bytes], *, root_override: str | None = None
    ) -> AsyncIterator[ExecEvent]:
        data = b"".join([chunk async for chunk in stdin])
        self.seen.append((spec, data, root_override))
        if self.behaviour == "hang":
            await asyncio.sleep(3600)
        yield ExecOutput("stderr", b"mount: mounting failed for " + data)
        yield ExecExit(32)


async def test_guest_mounts_are_bounded_and_their_errors_never_quote_the_password(
    backend: HypervBackend, tmp_path: Path
) -> None:
    from vz_drivers._machine import AgentLink, MountRecord
    from vz_drivers.hyperv import _scripts as ps

    record = _record(backend)
    record.mounts = [MountRecord("bind", str(tmp_path), "/w", True, str(tmp_path), ())]
    made = ps.SharesMade("DEVBOX\\vz-x", "vz-" + record.key[:16], "DEVBOX", "172.20.96.1", (), ())
    password = "S3cretPasswordValue0123456789abc"
    failing = _FakeGuest("fail")
    link = AgentLink(client=failing, pid=1, pid_start=1)  # type: ignore[arg-type]
    with pytest.raises(RuntimeFailureError, match=r"could not mount /w .*exit 32") as caught:
        await backend.guest_mount(record, link, made, password)
    assert password not in str(caught.value) and "mounting failed for ***" in str(caught.value)
    ((spec, stdin, root),) = failing.seen
    # As root, outside the image's root, the password on stdin only.
    assert (spec.user, root, stdin) == ("0:0", "/", (password + "\n").encode())
    assert password not in repr(spec) and spec.argv[5] == f"//172.20.96.1/vz-{record.key}-0$"
    backend.mount_timeout = 0.2
    hanging = AgentLink(client=_FakeGuest("hang"), pid=1, pid_start=1)  # type: ignore[arg-type]
    with pytest.raises(RuntimeTimeoutError, match=r"mounting /w .* did not finish within 0.2 s"):
        await backend.guest_mount(record, hanging, made, password)
