"""The hyperv backend inside the shared agent-Machine layer, end to end, with Hyper-V played by the stand-in.

The stand-in host's "VM" is a real ``vz-agent`` process on this host: START launches it (listening on a Unix
socket the test backend connects to instead of a Hyper-V socket), a graceful STOP or TURN_OFF ends it like the
guest powering off. Everything else is the real driver: RunImage's order, the record, the liveness hooks
(``alive`` through Get-VM, ``wait_gone``, ``kill``), readiness, exec, the log kept at Stop, Start again, Delete
(VM and socket service removed with the Machine's directory). The disk itself is a placeholder here (the real
one is built and booted in test_hyperv_guest.py).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import WINDOWS
from hyperv_standin import FakeVm, StandInHyperV

from vz_core import ExecExit, ExecOutput, ExecSpec, RunImageRequest
from vz_core.errors import FailedPreconditionError
from vz_drivers._agent import AgentClient
from vz_drivers._machine import AgentLink, AgentMachineDriver
from vz_drivers.hyperv._driver import HypervBackend
from vz_drivers.hyperv._records import HypervPaths, HypervRecord


class AgentVms(StandInHyperV):
    """The stand-in Hyper-V host whose running VMs are agent processes of this host."""

    def __init__(self, agent_binary: str, workdir: Path) -> None:
        super().__init__()
        self.agent_binary = agent_binary
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def socket_of(self, name: str) -> Path:
        return self.workdir / f"{name[-8:]}.sock"

    def _power_on(self, vm: FakeVm) -> None:
        sock = self.socket_of(vm.name)
        sock.unlink(missing_ok=True)
        self.procs[vm.name] = subprocess.Popen(
            [
                self.agent_binary,
                "serve",
                "--listen",
                f"unix:{sock}",
                "--init",
                "--log",
                str(self.workdir / "main.log"),
                "--",
                "sh",
                "-c",
                "echo main says hello; exec sleep 1000000",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _power_off(self, vm: FakeVm) -> None:
        proc = self.procs.pop(vm.name, None)
        if proc is not None:
            proc.terminate()  # the guest's poweroff: SIGTERM to the agent, which stops its main process
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    async def _start(self, args: Any, timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is not None and vm.state != "Running":
            self._power_on(vm)
        return await super()._start(args, timeout)

    async def _stop(self, args: Any, timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is not None:
            self._power_off(vm)
        return await super()._stop(args, timeout)

    async def _turn_off(self, args: Any, timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is not None:
            self._power_off(vm)
        return await super()._turn_off(args, timeout)

    async def _remove(self, args: Any, timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is not None:
            self._power_off(vm)
        return await super()._remove(args, timeout)


class LocalAgentBackend(HypervBackend):
    """The real backend, but the agent is reached over the stand-in VM's Unix socket, and the disk is a stub."""

    vms: AgentVms

    async def build_raw_disk(self, record: HypervRecord, rootfs: Path, work: Path) -> Path:
        raw = work / "disk.img"
        await asyncio.to_thread(raw.write_bytes, b"\0" * (1 << 20))
        return raw

    async def boot_image(self) -> Any:
        from vz_drivers.hyperv._efi import find_boot_tools

        return find_boot_tools(), None

    async def connect(self, record: HypervRecord, *, booting: bool) -> AgentLink:
        sock = self.vms.socket_of(record.vm_name)
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(str(sock))
                break
            except OSError:
                if not booting:
                    raise
                await asyncio.sleep(0.05)
        client = await AgentClient.from_streams(reader, writer, timeout=30)
        return AgentLink(client=client, pid=record.pid, pid_start=record.pid_start)


async def _none() -> AsyncIterator[bytes]:
    return
    yield b""


async def _run(driver: AgentMachineDriver[HypervRecord, HypervPaths], ws: str, *argv: str) -> tuple[str, ExecExit]:
    out, final = b"", None
    async for event in driver.exec(ExecSpec(workspace_id=ws, argv=argv), _none()):
        if isinstance(event, ExecOutput):
            out += event.data
        elif isinstance(event, ExecExit):
            final = event
    assert final is not None
    return out.decode(), final


async def test_a_machine_through_the_shared_layer(tmp_path: Path, image_dir: Path, agent_binary: str) -> None:
    vms = AgentVms(agent_binary, tmp_path)
    backend = LocalAgentBackend(
        state_dir=tmp_path / "state", image_dir=image_dir, runner=vms, host=WINDOWS, stop_timeout=1
    )
    backend.vms = vms
    backend.stop_slack = 5
    driver: AgentMachineDriver[HypervRecord, HypervPaths] = AgentMachineDriver(backend)
    ws = "proj/env/../machine ü"
    try:
        await driver.run_image(RunImageRequest(workspace_id=ws, image="vz:default", environment={"TOKEN": "t0k"}))
        record = backend.book.load(next(iter(backend.book.machines_dir.iterdir())).name)
        assert record is not None and record.vm_id
        disk = backend.book.paths(record.key).disk
        assert disk.is_file() and disk.stat().st_mode & 0o077 == 0  # the disk holds the Machine's secrets
        assert list(vms.vms) == [record.vm_name] and list(vms.registry) == [record.service_id]
        found = await driver.find(ws)
        assert found is not None and found.state.status == "running"
        text, final = await _run(driver, ws, "sh", "-c", "echo hi from the agent")
        assert (text, final) == ("hi from the agent\n", ExecExit(0))

        await driver.stop(ws)
        assert vms.vms[record.vm_name].state == "Off" and record.vm_name not in vms.procs
        found = await driver.find(ws)
        assert found is not None and found.state.status == "stopped"
        with pytest.raises(FailedPreconditionError, match="is stopped"):
            await _run(driver, ws, "true")
        kept = b"".join([chunk async for chunk in driver.logs(ws)])
        assert b"main says hello" in kept
        assert "stop" in [name for name, _ in vms.calls] and vms.forced == []  # the graceful path sufficed

        await driver.start(ws)
        assert [name for name, _ in vms.calls].count("create") == 1  # the VM is reused, only started
        text, _ = await _run(driver, ws, "echo", "again")
        assert text == "again\n"

        await driver.delete(ws)
        assert vms.forced == [record.vm_name]  # Delete turns a running Machine off (graceful_replace is off)
        assert vms.vms == {} and vms.registry == {} and vms.procs == {}
        assert await driver.find(ws) is None
        assert list(backend.book.machines_dir.iterdir()) == []
    finally:
        await driver.close()
        for vm in list(vms.vms.values()):
            vms._power_off(vm)
