"""Agent modes: chroot (--root), --init supervision and logs, single-stream (--fd), shutdown, long socket paths."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tty
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from agent_helpers import AgentProcess, alive, chunks, descendants, eventually, no_input, run, spec, start_agent

from vz_core import ExecExit, ExecOutput
from vz_core.errors import UnavailableError, UnsupportedError
from vz_drivers._agent import AgentClient
from vz_drivers._agent import _protocol as p

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chroot and mounts need root")


@pytest.fixture
def rootfs(tmp_path: Path, busybox: Path) -> Path:
    """A minimal busybox root filesystem with a user of its own."""
    root = tmp_path / "rootfs"
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "home/tester", "tmp", "root"):
        (root / d).mkdir(parents=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\ntester:x:1234:1234:Tester:/home/tester:/bin/sh\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\ntester:x:1234:\nextra:x:2000:tester\n")
    (root / "marker-inside").write_text("inside\n")
    subprocess.run(["chroot", str(root), "/bin/busybox", "--install", "-s"], check=True)
    return root


@needs_root
async def test_root_runs_commands_chrooted(
    agent_factory: Callable[..., AgentProcess], rootfs: Path, tmp_path: Path
) -> None:
    agent = agent_factory("--root", str(rootfs))
    outside = tmp_path / "marker-outside"
    outside.write_text("outside\n")
    async with await agent.client() as client:
        assert client.info.root == str(rootfs)
        listing = await run(client, "ls", "/")
        assert set(listing.stdout.decode().split()) == {
            "linuxrc",
            "bin",
            "sbin",
            "usr",
            "etc",
            "home",
            "tmp",
            "root",
            "marker-inside",
        }
        assert (await run(client, "cat", "/marker-inside")).stdout == b"inside\n"
        assert (await run(client, "cat", str(outside))).exit.exit_code != 0
        # users and groups come from the root's /etc files; defaults follow the user
        ident = await run(client, "sh", "-c", 'id -u; id -g; id -G; pwd; echo "$HOME $USER"', user="tester")
        assert ident.stdout.decode().splitlines() == [
            "1234",
            "1234",
            "1234 2000",
            "/home/tester",
            "/home/tester tester",
        ]
        # executables are looked up through absolute symlinks inside the root
        assert (await run(client, "sh", "-c", "readlink /bin/sh")).stdout == b"/bin/busybox\n"
        # a per-exec root override runs outside the chroot
        assert (await run(client, "cat", str(outside), root_override="/")).stdout == b"outside\n"


@needs_root
async def test_root_user_unknown_inside_root(agent_factory: Callable[..., AgentProcess], rootfs: Path) -> None:
    from vz_core.errors import InvalidArgumentError

    agent = agent_factory("--root", str(rootfs))
    async with await agent.client() as client:
        # "nobody" exists on the host but not in the root's /etc/passwd
        with pytest.raises(InvalidArgumentError, match="nobody"):
            await run(client, "true", user="nobody")


@needs_root
async def test_prepare_root_mounts_and_unmounts(agent_factory: Callable[..., AgentProcess], rootfs: Path) -> None:
    agent = agent_factory("--root", str(rootfs), "--prepare-root")
    async with await agent.client() as client:
        result = await run(
            client, "sh", "-c", "test -r /proc/self/stat && test -c /dev/null && ls /sys/kernel >/dev/null"
        )
        assert result.exit.success, result.stderr
    assert agent.stop() == 0
    mounts = await asyncio.to_thread(Path("/proc/self/mountinfo").read_text)
    assert str(rootfs) not in mounts


def _full_output(lines: int) -> bytes:
    return "".join(f"line {i}\n" for i in range(lines)).encode() + b"END\n"


async def _wait_main_exit(client: AgentClient) -> ExecExit:
    while True:
        status = await client.status()
        if status.main_exit is not None:
            return status.main_exit
        await asyncio.sleep(0.02)


async def test_init_main_log_is_captured_and_bounded(
    agent_factory: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    log = tmp_path / "main.log"
    limit = 128 * 1024
    script = 'i=0; while [ $i -lt 30000 ]; do echo "line $i"; i=$((i+1)); done; echo END >&2; exit 7'
    agent = agent_factory("--init", "--log", str(log), "--log-max", str(limit), "--", "sh", "-c", script)
    async with await agent.client() as client:
        assert client.info.init
        assert client.info.main_pid > 0
        assert await asyncio.wait_for(_wait_main_exit(client), 30) == ExecExit(7, "")
        content = b"".join([chunk async for chunk in client.logs()])
    full = _full_output(30000)
    assert len(full) > 2 * limit
    assert full.endswith(content)  # a contiguous tail: the oldest output was dropped first
    assert limit // 2 <= len(content) <= limit
    sizes = await asyncio.to_thread(lambda: (log.stat().st_size, Path(f"{log}.1").stat().st_size))
    assert max(sizes) <= limit // 2


async def test_init_logs_merge_stdout_and_stderr(agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    log = tmp_path / "main.log"
    agent = agent_factory("--init", "--log", str(log), "--", "sh", "-c", "echo out; echo err >&2; exec sleep 300")

    async with await agent.client() as client:

        async def logged() -> bytes:
            while True:
                content = b"".join([chunk async for chunk in client.logs()])
                if content.count(b"\n") >= 2:
                    return content
                await asyncio.sleep(0.02)

        assert await asyncio.wait_for(logged(), 10) == b"out\nerr\n"
        status = await client.status()
        assert status.main_running
        assert status.main_exit is None
    assert agent.stop() == 128 + 15  # the main process ended by SIGTERM


async def test_logs_unsupported_without_log(client: AgentClient) -> None:
    with pytest.raises(UnsupportedError, match="--log"):
        async for _ in client.logs():
            pass


async def test_orphans_are_reaped(agent: AgentProcess, client: AgentClient) -> None:
    result = await run(client, "sh", "-c", "(exec sleep 0.2) & echo $!")
    orphan = int(result.stdout)

    assert psutil.Process(orphan).ppid() == agent.pid  # reparented to the agent, a child subreaper
    # Once it exits it must be reaped: an unreaped zombie would keep its pid in the process table.
    await eventually(lambda: not psutil.pid_exists(orphan), 10, "the orphan to exit and be reaped by the agent")
    assert not [c for c in psutil.Process(agent.pid).children() if c.status() == psutil.STATUS_ZOMBIE]


async def test_sigterm_stops_main_and_execs(agent_factory: Callable[..., AgentProcess]) -> None:
    agent = agent_factory(
        "--init", "--stop-timeout", "1s", "--", "sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"
    )
    async with await agent.client() as client:
        events = client.exec(spec("sh", "-c", "echo ready; exec sleep 300"), no_input())
        assert await anext(events) == ExecOutput("stdout", b"ready\n")
        tree = descendants(agent.pid)
        code = await asyncio.to_thread(agent.stop)
        assert code == 128 + 9  # the main process ignored SIGTERM and was killed after the grace
        assert not alive(tree)
        with pytest.raises(UnavailableError):
            await anext(events)


async def test_exit_with_main(agent_factory: Callable[..., AgentProcess]) -> None:
    agent = agent_factory("--init", "--exit-with-main", "--", "sh", "-c", "exit 5")
    assert await asyncio.to_thread(agent.proc.wait, 10) == 5
    assert not agent.socket.exists()


async def test_shutdown_stops_everything_and_acknowledges(agent_factory: Callable[..., AgentProcess]) -> None:
    agent = agent_factory("--init", "--", "sleep", "300")
    client = await agent.client()
    events = client.exec(spec("sh", "-c", "echo ready; exec sleep 300"), no_input())
    assert await anext(events) == ExecOutput("stdout", b"ready\n")
    tree = descendants(agent.pid)
    assert len(tree) == 2
    await asyncio.wait_for(client.shutdown(grace=2), 20)
    assert client.closed
    assert await asyncio.to_thread(agent.proc.wait, 10) == 128 + 15
    assert not alive(tree)
    with pytest.raises(UnavailableError):
        await anext(events)


async def test_long_socket_path(agent_binary: Path, tmp_path: Path) -> None:
    workdir = tmp_path / ("d" * 100) / ("e" * 60)
    workdir.mkdir(parents=True)
    assert len(str(workdir / "a.sock")) > 108
    agent = start_agent(agent_binary, workdir)
    try:
        async with await agent.client() as client:
            assert (await run(client, "echo", "deep")).stdout == b"deep\n"
    finally:
        assert agent.stop() == 0
    assert not (workdir / "a.sock").exists()


# ---------------------------------------------------------------- single stream (--fd), like virtio-serial


@pytest.fixture
def stream_agent(agent_binary: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], socket.socket]]:
    host, guest = socket.socketpair()
    with open(tmp_path / "agent.stderr", "wb") as err:
        proc = subprocess.Popen(
            [str(agent_binary), "serve", "--fd", str(guest.fileno())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            pass_fds=(guest.fileno(),),
        )
    guest.close()
    try:
        yield proc, host
    finally:
        host.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_fd_mode_sends_ready_and_resynchronises(
    stream_agent: tuple[subprocess.Popen[bytes], socket.socket],
) -> None:
    proc, host = stream_agent
    reader, writer = await asyncio.open_connection(sock=host)
    ready = p.frame(p.T_READY, 0, p.READY_PAYLOAD)
    assert await reader.readexactly(len(ready)) == ready
    writer.write(b"stale bytes of an earlier session")  # the agent must skip them and wait for HELLO
    client = await AgentClient.from_streams(reader, writer, wait_ready=True, timeout=10)
    try:
        assert client.info.mode == "stream"
        result = await run(client, "cat", stdin=chunks(b"\x00\xff over one stream"))
        assert result.stdout == b"\x00\xff over one stream"
        events = client.exec(spec("sh", "-c", "echo ready; exec sleep 300"), no_input())
        assert await anext(events) == ExecOutput("stdout", b"ready\n")
        tree = descendants(proc.pid)
    finally:
        await client.close()
    # The stream ended: the agent kills what ran and exits.
    assert await asyncio.to_thread(proc.wait, 10) == 0
    assert not alive(tree)


async def test_fd_mode_client_waits_for_a_booting_agent(agent_binary: Path, tmp_path: Path) -> None:
    host, guest = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=host)
    connecting = asyncio.create_task(AgentClient.from_streams(reader, writer, wait_ready=True, timeout=20))
    await asyncio.sleep(0)  # the HELLO is sent before the agent exists, like a VM still booting
    proc = subprocess.Popen(  # noqa: ASYNC220 - must start while the HELLO is already waiting
        [str(agent_binary), "serve", "--fd", str(guest.fileno())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        pass_fds=(guest.fileno(),),
    )
    guest.close()
    try:
        client = await connecting
        assert (await run(client, "echo", "booted")).stdout == b"booted\n"
        await client.close()
        assert await asyncio.to_thread(proc.wait, 10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- character device (--device), on a raw pty


async def _open_device_host(master: int) -> AgentClient:
    """A client over duplicates of the pty master, like a host attached to a virtio-serial port."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    read_file = os.fdopen(os.dup(master), "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), read_file)
    write_file = os.fdopen(os.dup(master), "wb", buffering=0)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, write_file)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return await AgentClient.from_streams(reader, writer, wait_ready=True, timeout=10)


@pytest.fixture
def device_agent(agent_binary: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    master, slave = os.openpty()
    tty.setraw(slave)  # a byte stream, like a virtio-serial port
    with open(tmp_path / "agent.stderr", "wb") as err:
        proc = subprocess.Popen(
            [str(agent_binary), "serve", "--device", os.ttyname(slave)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        yield proc, master
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)


async def test_device_mode_and_a_host_that_starts_over(device_agent: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, master = device_agent
    first = await _open_device_host(master)
    assert first.info.mode == "stream"
    data = bytes(range(256)) * 64
    assert (await run(first, "cat", stdin=chunks(data))).stdout == data
    events = first.exec(spec("sh", "-c", "echo ready; exec sleep 300"), no_input())
    assert await anext(events) == ExecOutput("stdout", b"ready\n")
    tree = descendants(proc.pid)
    assert tree
    # The host goes away without the port noticing (its end stays open) and a new one attaches.
    await first.close()
    with pytest.raises(UnavailableError):
        await anext(events)
    second = await _open_device_host(master)
    try:
        await eventually(lambda: not alive(tree), 10, "the first host's exec to be killed")
        assert (await run(second, "echo", "second host")).stdout == b"second host\n"
    finally:
        await second.close()
    proc.terminate()
    assert await asyncio.to_thread(proc.wait, 10) == 0
