"""``exec_local`` on a real linux_native Machine: the host's descriptors become the command's own stdio."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import psutil
import pytest
from exec_local_testlib import cat_through_pipes, opened
from machine_testlib import request, run

from vz_core import Driver, ExecExit, ExecSpec
from vz_core.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from vz_drivers.linux_native import LinuxNativeDriver

pytestmark = pytest.mark.root


_DATA = os.urandom(1 << 20) * 16  # 16 MiB


def _spec(*argv: str) -> ExecSpec:
    return ExecSpec(workspace_id="ignored: machine_id wins", argv=argv)


async def test_cat_of_a_pipe_and_a_file_moves_every_byte(driver: LinuxNativeDriver, tmp_path: Path) -> None:
    await driver.run_image(request("fds"))
    exit_, out, err = await cat_through_pipes(driver.exec_local, "fds", _DATA)
    assert exit_.success and err == b""
    assert hashlib.sha256(out).digest() == hashlib.sha256(_DATA).digest()

    source, target = tmp_path / "in", tmp_path / "out"
    source.write_bytes(_DATA)
    with opened((source, os.O_RDONLY), (target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), (os.devnull, os.O_RDWR)) as (
        src,
        dst,
        null,
    ):
        exit_ = await driver.exec_local("fds", _spec("cat"), (src, dst, null))
    assert exit_.success and target.read_bytes() == _DATA


async def test_the_command_writes_to_the_host_pipe_itself(driver: LinuxNativeDriver) -> None:
    """Zero copies: the command's stdout is the very pipe the host passed (same inode), not one of the agent's."""
    await driver.run_image(request("same"))
    out_r, out_w = os.pipe()
    inode = os.fstat(out_w).st_ino
    with opened((os.devnull, os.O_RDWR)) as (null,):
        try:
            exit_ = await driver.exec_local("same", _spec("readlink", "/proc/self/fd/1"), (null, out_w, null))
        finally:
            os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        link = f.read().decode().strip()
    assert exit_.success
    assert link == f"pipe:[{inode}]"


async def test_exit_codes_signals_and_errors(driver: LinuxNativeDriver, tmp_path: Path) -> None:
    await driver.run_image(request("codes"))
    err = tmp_path / "err"
    with opened((os.devnull, os.O_RDWR), (err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)) as (null, e):
        fd = null
        assert await driver.exec_local("codes", _spec("sh", "-c", "exit 7"), (fd, fd, fd)) == ExecExit(7, "")
        assert await driver.exec_local("codes", _spec("sh", "-c", "kill -KILL $$"), (fd, fd, fd)) == ExecExit(
            137, "SIGKILL"
        )
        assert (await driver.exec_local("codes", _spec("no-such-tool"), (fd, fd, e))).exit_code == 127
        with pytest.raises(NotFoundError):
            await driver.exec_local("missing", _spec("true"), (fd, fd, fd))
        with pytest.raises(InvalidArgumentError):
            await driver.exec_local("codes", _spec(), (fd, fd, fd))
        await driver.stop("codes")
        with pytest.raises(FailedPreconditionError):
            await driver.exec_local("codes", _spec("true"), (fd, fd, fd))
    assert "not found" in err.read_text()


async def test_cancel_kills_the_command_and_the_machine_keeps_running(driver: LinuxNativeDriver) -> None:
    await driver.run_image(request("cancel"))
    out_r, out_w = os.pipe()
    with opened((os.devnull, os.O_RDWR)) as (null,):
        task = asyncio.create_task(
            driver.exec_local("cancel", _spec("sh", "-c", "echo $$; exec sleep 3017"), (null, out_w, null))
        )
        try:
            line = await asyncio.to_thread(os.read, out_r, 100)
            inner = int(line)  # the pid inside the Machine's pid namespace
            assert inner > 1
            # An unusual duration: other tests of the run (other workers) may be sleeping meanwhile.
            sleepers = lambda: [  # noqa: E731
                p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "3017"]
            ]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while not sleepers():  # "echo" ran; the exec of sleep follows a moment later
                assert loop.time() < deadline, "the command never started sleeping"
                await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            deadline = loop.time() + 10
            while sleepers():
                assert loop.time() < deadline, "the cancelled command is still running"
                await asyncio.sleep(0.05)
        finally:
            os.close(out_w)
            os.close(out_r)
    assert (await run(driver, "cancel", "true")).exit.success


async def test_a_terminal_is_refused(driver: LinuxNativeDriver) -> None:
    await driver.run_image(request("tty"))
    master, slave = os.openpty()
    try:
        with opened((os.devnull, os.O_RDWR)) as (null,):
            for stdio in ((slave, null, null), (null, null, slave)):
                with pytest.raises(InvalidArgumentError, match="terminal"):
                    await driver.exec_local("tty", _spec("sh", "-c", "echo injected >&2"), stdio)
                with pytest.raises(InvalidArgumentError, match="terminal"):
                    await Driver.exec_local(driver, "tty", _spec("true"), stdio)  # the copying default too
    finally:
        os.close(slave)
        os.close(master)


async def test_the_copying_default_on_a_real_machine(driver: LinuxNativeDriver) -> None:
    """What VM backends run (one copy between descriptors and agent frames), here on a linux_native Machine."""
    await driver.run_image(request("copy"))
    exit_, out, err = await cat_through_pipes(lambda *a: Driver.exec_local(driver, *a), "copy", _DATA)
    assert exit_.success and err == b"" and out == _DATA
    exit_, out, err = await cat_through_pipes(
        lambda *a: Driver.exec_local(driver, *a), "copy", b"", "sh", "-c", "echo out; echo err >&2; exit 3"
    )
    assert (exit_, out, err) == (ExecExit(3, ""), b"out\n", b"err\n")
