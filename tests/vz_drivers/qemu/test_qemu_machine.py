"""A real Machine under QEMU (TCG here): exec, resources, shares, sessions, reattachment, logs, QMP.

One Machine is booted for the module (see ``booted`` in conftest); every test reaches it through a new driver
object, exactly like a relaunched plugin would.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest
from machine_testlib import chunks, run
from qemu_testlib import Booted

from vz_core import ExecSpec
from vz_core.errors import InvalidArgumentError, UnsupportedError

pytestmark = pytest.mark.slow


async def test_boot_to_ready_was_measured_and_find_reports_running(booted: Booted) -> None:
    driver = booted.driver()
    try:
        details = await driver.find(booted.workspace_id)
        assert details is not None and details.state.status == "running"
        assert {(m.type, m.destination) for m in details.mounts} == {
            ("bind", "/workspace"),
            ("bind", "/mnt/ro"),
            ("volume", "/mnt/volume"),
            ("tmpfs", "/mnt/scratch"),
        }
        assert 0 < booted.boot_seconds < 300
    finally:
        await driver.close()


async def test_exec_round_trip_is_binary_safe_and_keeps_streams_apart(booted: Booted) -> None:
    driver = booted.driver()
    try:
        data = bytes(range(256)) * 300 + b"\x00\xff\x80\n\r\x01"
        result = await run(driver, booted.workspace_id, "cat", stdin=data)
        assert result.stdout == data and result.stderr == b""
        assert result.exit is not None and result.exit.success
        assert all(1 <= n <= 32768 for n in result.frames)
        result = await run(driver, booted.workspace_id, "sh", "-c", "echo out; echo err >&2; exit 7")
        assert (result.stdout, result.stderr, result.exit and result.exit.exit_code) == (b"out\n", b"err\n", 7)
        result = await run(driver, booted.workspace_id, "sh", "-c", "kill -KILL $$")
        assert result.exit is not None and result.exit.signal == "SIGKILL"
    finally:
        await driver.close()


async def test_arguments_environment_user_and_workdir(booted: Booted) -> None:
    driver = booted.driver()
    try:
        args = ["two words", "$HOME;$(echo no)", "", "ünï ✓", "a\nb"]
        result = await run(driver, booted.workspace_id, "printf", "%s\\000", *args)
        assert result.stdout.split(b"\0")[:-1] == [a.encode() for a in args]
        result = await run(driver, booted.workspace_id, "sh", "-c", 'printf %s "$VZ_TEST_SECRET"')
        assert result.stdout == b'it\'s a "secret"\nwith a newline'
        result = await run(
            driver,
            booted.workspace_id,
            "sh",
            "-c",
            'id -un; pwd; printf %s "$EXTRA"',
            user="nobody",
            workdir="/tmp",
            environment={"EXTRA": "x y"},
        )
        assert result.stdout == b"nobody\n/tmp\nx y"
        with pytest.raises(InvalidArgumentError):
            await run(driver, booted.workspace_id, "true", user="no-such-user")
        with pytest.raises(UnsupportedError):
            await run(driver, booted.workspace_id, "true", tty=True)
    finally:
        await driver.close()


def _files_at_rest(state_dir: Path, shares: list[Path], needle: bytes) -> tuple[list[Path], list[Path], bytes]:
    held = [p for p in state_dir.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]
    shm = [p for share in shares for p in share.glob("*") if p.is_file()]
    shm_held = [p for p in shm if p.name == "config.sh" or needle in p.read_bytes()]
    record = next(state_dir.rglob("record.json")).read_bytes()
    return held, shm_held if shm else [Path("(no share directory on /dev/shm)")], record


async def test_no_driver_file_keeps_an_environment_value(booted: Booted) -> None:
    """#14 item 7: the record names the variables only; config.sh (on /dev/shm) is gone once the agent serves."""
    driver = booted.driver()
    try:
        # This Machine's share directories only: other tests of the run (other workers) boot guests meanwhile.
        backend = driver._qemu_backend
        shares = [backend._shm_path(record) for record in backend.book.records()]
    finally:
        await driver.close()
    assert shares and all(str(share).startswith(f"/dev/shm/vz-qemu-{os.getuid()}-") for share in shares)
    held, shm_held, record = await asyncio.to_thread(_files_at_rest, booted.state_dir, shares, b'it\'s a "secret"')
    assert held == [] and shm_held == []
    assert b"VZ_TEST_SECRET" in record


async def test_the_guest_sees_the_requested_cpus_and_memory(booted: Booted) -> None:
    driver = booted.driver()
    try:
        assert (await run(driver, booted.workspace_id, "nproc")).stdout == b"1\n"
        meminfo = (await run(driver, booted.workspace_id, "cat", "/proc/meminfo")).stdout.decode()
        total_kib = int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemTotal:")))
        assert abs(total_kib * 1024 - 384 * 1024 * 1024) <= 128 * 1024 * 1024
        kernel = (await run(driver, booted.workspace_id, "uname", "-r")).stdout.strip().decode()
        assert kernel != os.uname().release, "commands must run on the guest kernel, not the host's"
    finally:
        await driver.close()


async def test_shares_are_read_write_both_ways_and_read_only_is_enforced(booted: Booted) -> None:
    driver = booted.driver()
    try:
        hello = await run(driver, booted.workspace_id, "cat", "/workspace/hello.txt")
        assert hello.stdout == b"hello from the host\n"
        result = await run(driver, booted.workspace_id, "sh", "-c", "echo from the guest > /workspace/guest.txt")
        assert result.exit is not None and result.exit.success
        assert (booted.workspace / "guest.txt").read_text() == "from the guest\n"
        result = await run(driver, booted.workspace_id, "sh", "-c", "echo nope > /mnt/ro/new.txt")
        assert result.exit is not None and not result.exit.success
        assert b"Read-only file system" in result.stderr
        assert not (booted.read_only / "new.txt").exists()
        assert (await run(driver, booted.workspace_id, "cat", "/mnt/ro/fixed.txt")).stdout == b"fixed\n"
        mounts = (await run(driver, booted.workspace_id, "cat", "/proc/mounts")).stdout.decode()
        assert " /mnt/ro 9p ro," in mounts and " /workspace 9p rw," in mounts and " /mnt/scratch tmpfs " in mounts
        assert "/dev/vda / ext4 rw" in mounts
    finally:
        await driver.close()


async def test_concurrent_execs_on_one_connection_and_a_second_driver_on_another_port(booted: Booted) -> None:
    first, second = booted.driver(), booted.driver()
    try:
        results = await asyncio.gather(
            *(run(first, booted.workspace_id, "sh", "-c", f"sleep 0.2; echo {i}") for i in range(6)),
            run(second, booted.workspace_id, "echo", "second"),
        )
        assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(6)] + [b"second\n"]
    finally:
        await first.close()
        await second.close()


async def test_a_closed_exec_is_killed_with_its_children_and_the_machine_keeps_running(booted: Booted) -> None:
    driver = booted.driver()
    try:
        spec = ExecSpec(workspace_id=booted.workspace_id, argv=("sh", "-c", "sleep 1001 & echo ready; exec sleep 1002"))
        events = driver.exec(spec, chunks())
        assert isinstance(events, AsyncGenerator)
        seen = b""
        async for event in events:
            seen += getattr(event, "data", b"")
            if b"ready" in seen:
                break
        await events.aclose()  # what a cancelled caller does: the command and its children must die
        script = 'for i in $(seq 50); do pgrep -f "sleep 100[1]" >/dev/null || exit 0; sleep 0.2; done; exit 1'
        result = await run(driver, booted.workspace_id, "sh", "-c", script)
        assert result.exit is not None and result.exit.success, "the closed exec left processes behind"
        assert (await driver.find(booted.workspace_id)).state.status == "running"  # type: ignore[union-attr]
    finally:
        await driver.close()


async def test_logs_hold_the_main_process_output(booted: Booted) -> None:
    driver = booted.driver()
    try:
        data = b"".join([chunk async for chunk in driver.logs(booted.workspace_id)])
        assert b"main says hello\n" in data and b"main complains\n" in data
    finally:
        await driver.close()


async def test_info_extensions_and_qmp_report_the_accelerator(booted: Booted) -> None:
    driver = booted.driver()
    try:
        info = await driver.info()
        ext = await driver.extensions()
        assert ext is not None and ext.accelerator in ("kvm", "tcg") and ext.accelerator_reason
        assert info.runtime_name == "qemu" and info.runtime_version.endswith(f"({ext.accelerator})")
        assert ext.resource_limits and ext.storage_limits
        status = await driver.qmp_status(booted.workspace_id)
        assert status["status"] == "running"
    finally:
        await driver.close()


async def test_services_are_supervised_in_the_guest_and_outlive_the_driver(booted: Booted) -> None:
    from services_testlib import check_services

    driver = booted.driver()
    try:
        ext = await driver.extensions()
        assert ext is not None and ext.services
    finally:
        await driver.close()
    await check_services(booted.driver, booted.workspace_id, "qemu")
