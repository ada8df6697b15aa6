"""Launch, readiness, reattach and the Stop -> HardStop -> kill state machine, against a stand-in vfkit process."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from vfkit_standin import write_executable

from vz_core.errors import RuntimeFailureError, RuntimeTimeoutError
from vz_drivers.vfkit._cmdline import VfkitSpec, build_argv
from vz_drivers.vfkit._process import (
    ReadyListener,
    VfkitProcess,
    exit_status,
    launch,
    process_alive,
    stop_vm,
    wait_gone,
    wait_ready,
)
from vz_drivers.vfkit._rest import VfkitRest


@dataclasses.dataclass
class Machine:
    run: Path
    spec: VfkitSpec

    @property
    def log(self) -> Path:
        return self.run / "vfkit.log"

    @property
    def status(self) -> Path:
        return self.run / "vfkit.status"

    @property
    def console(self) -> Path:
        return Path(self.spec.console_log)


@pytest.fixture
async def launched(short_dir: Path) -> AsyncIterator[list[VfkitProcess]]:
    procs: list[VfkitProcess] = []
    yield procs
    for proc in procs:  # never leave a detached stand-in behind, whatever the test did
        if process_alive(proc.pid, proc.start_time):
            os.kill(proc.pid, signal.SIGKILL)
        await wait_gone(proc.pid, proc.start_time, 10)
    if procs:  # the launcher's waiting shell writes the exit status last: then the directory may go
        assert await exit_status(short_dir / "run" / "vfkit.status") != ""


def _machine(short_dir: Path) -> Machine:
    run = short_dir / "run"
    run.mkdir()
    (run / "disk.img").write_bytes(b"\0" * 4096)
    spec = VfkitSpec(
        cpus=1,
        memory_mib=256,
        kernel=str(short_dir / "Image"),
        initrd=str(short_dir / "initrd"),
        cmdline=("console=hvc0",),
        disk=str(run / "disk.img"),
        console_log=str(run / "console.log"),
        rest_socket=str(run / "rest.sock"),
        agent_socket=str(run / "agent.sock"),
        ready_socket=str(run / "ready.sock"),
    )
    return Machine(run=run, spec=spec)


async def _boot(short_dir: Path, behaviour: str, launched: list[VfkitProcess], *, limit: float = 20) -> Machine:
    vfkit = write_executable(short_dir / "bin", behaviour)
    machine = _machine(short_dir)
    async with ReadyListener(Path(machine.spec.ready_socket)) as ready:
        proc = await launch(
            build_argv(str(vfkit), machine.spec), run_dir=machine.run, log=machine.log, status=machine.status
        )
        launched.append(proc)
        await wait_ready(
            ready,
            proc,
            timeout=limit,
            what="Machine 'm'",
            log=machine.log,
            status=machine.status,
            console=machine.console,
        )
    return machine


async def test_boot_waits_for_the_guests_ready_and_a_new_client_reattaches(
    short_dir: Path, launched: list[VfkitProcess]
) -> None:
    machine = await _boot(short_dir, "obey", launched)
    (proc,) = launched
    # What a relaunched plugin has: the record (pid, start time, executable) and the socket path.
    record = VfkitProcess(pid=proc.pid, start_time=proc.start_time, executable=proc.executable)
    assert process_alive(record.pid, record.start_time, record.executable)
    assert not process_alive(record.pid, record.start_time + 1.0)  # a reused pid never matches
    assert not process_alive(record.pid, record.start_time, "/usr/local/bin/other")
    rest = VfkitRest(machine.spec.rest_socket)
    assert (await rest.state()).running
    inspect = await rest.inspect()
    assert (inspect.cpus, inspect.memory_bytes) == (1, 256 << 20)
    assert os.getsid(proc.pid) != os.getsid(0)  # detached: its own session, it outlives this process
    assert await stop_vm(record, rest, grace=10) == "stop"
    assert not process_alive(proc.pid, proc.start_time)
    assert await exit_status(machine.status) == "0"
    assert await stop_vm(record, rest, grace=10) == "gone"  # idempotent


async def test_stop_escalates_to_hardstop_after_the_grace(short_dir: Path, launched: list[VfkitProcess]) -> None:
    machine = await _boot(short_dir, "ignore-stop", launched)
    rest = VfkitRest(machine.spec.rest_socket)
    assert await stop_vm(launched[0], rest, grace=0.5) == "hardstop"


async def test_stop_kills_a_vfkit_that_refuses_everything(short_dir: Path, launched: list[VfkitProcess]) -> None:
    machine = await _boot(short_dir, "ignore-all", launched)
    rest = VfkitRest(machine.spec.rest_socket)
    assert await stop_vm(launched[0], rest, grace=0.3, hard_grace=0.3) == "kill"
    assert not process_alive(launched[0].pid, launched[0].start_time)


async def test_forced_stop_skips_the_graceful_request(short_dir: Path, launched: list[VfkitProcess]) -> None:
    machine = await _boot(short_dir, "ignore-stop", launched)
    assert await stop_vm(launched[0], VfkitRest(machine.spec.rest_socket), grace=30, graceful=False) == "hardstop"


async def test_a_vfkit_that_dies_while_booting_reports_its_output_and_the_console(
    short_dir: Path, launched: list[VfkitProcess]
) -> None:
    with pytest.raises(RuntimeFailureError) as info:
        await _boot(short_dir, "crash", launched)
    err = info.value
    assert "vfkit exited" in err.message
    assert "exit code 1" in err.message or "exited immediately" in err.message
    assert "storage device attachment is invalid" in err.message  # vfkit's own last line
    assert "storage device attachment is invalid" in err.runtime_message
    assert "Kernel panic - not syncing: stand-in" in err.runtime_message  # the guest console tail


async def test_a_guest_that_never_reports_ready_times_out_with_diagnostics(
    short_dir: Path, launched: list[VfkitProcess]
) -> None:
    with pytest.raises(RuntimeTimeoutError, match="did not report ready within 1 s") as info:
        await _boot(short_dir, "never-ready", launched, limit=1)
    assert "Booting Linux" in info.value.runtime_message
    assert await wait_gone(launched[0].pid, launched[0].start_time, 0.1) is False  # still running: caller decides
    rest = VfkitRest(str(short_dir / "run" / "rest.sock"))
    assert await stop_vm(launched[0], rest, grace=10) == "stop"


def test_a_boot_failure_names_the_guest_inits_reason(tmp_path: Path) -> None:
    # What the guest prints when vfkit's NAT hands out no address (vz_network_dhcp), then powers off.
    from vz_drivers.vfkit._process import boot_failure

    log, status, console = tmp_path / "vfkit.log", tmp_path / "vfkit.status", tmp_path / "console.log"
    log.write_text("INFO[0001] VM is stopped\n")
    status.write_text("0\n")
    console.write_text(
        "udhcpc: sending discover\nVZ-INIT-FAILED: no DHCP lease on eth0 after 10 requests: the VM's NAT network "
        "handed out no address\nreboot: Power down\n"
    )
    error = boot_failure("vfkit exited unexpectedly", log=log, status=status, console=console)
    assert "the guest init failed: no DHCP lease on eth0 after 10 requests" in error.message
    assert "udhcpc: sending discover" in error.runtime_message
