"""RemoteDriver.exec_local: descriptors to a real plugin process over its local exec socket, or Exec frames."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest
from vz_conformance.fake import FakeDriver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_drivers"))
from exec_local_testlib import cat_through_pipes

from vz_core import ExecExit, ExecOutput, ExecSpec, RunImageRequest
from vz_core.drivers import launcher_for
from vz_core.errors import InvalidArgumentError, NotFoundError, UnavailableError
from vz_core.redact import Redactor
from vz_core.rpc import MAX_WIDE_CHUNK, LocalExecServer, RemoteDriver, connect_in_process, local_exec, send_json

_DATA = os.urandom(1 << 20) * 8  # 8 MiB


@contextlib.contextmanager
def _null() -> Iterator[int]:
    fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _fake_plugin(state: Path, **kwargs: object) -> RemoteDriver:
    return RemoteDriver(launcher_for("fake", options={"state_dir": str(state)}), name="fake", **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def fake_plugin(tmp_path: Path) -> AsyncIterator[RemoteDriver]:
    driver = _fake_plugin(tmp_path / "state")
    try:
        await driver.run_image(RunImageRequest("m", "img"))
        yield driver
    finally:
        await driver.close()


@contextlib.asynccontextmanager
async def _writing_into_a_pipe(driver: RemoteDriver, *, keep_reader: bool = False) -> AsyncIterator[tuple[int, int]]:
    """A command in Machine ``m`` whose stdout is a host pipe, running once it wrote ``go`` into it: yields
    (the pipe's read end, its inode). On exit the command is cancelled, then the write end closed and the read
    end too (with ``keep_reader``: the caller closes it)."""
    out_r, out_w = os.pipe()
    inode = os.fstat(out_w).st_ino
    with _null() as null:
        task = asyncio.create_task(
            driver.exec_local("m", ExecSpec("m", ("sh", "-c", "echo go; exec sleep 30")), (null, out_w, null))
        )
        try:
            assert await asyncio.to_thread(os.read, out_r, 10) == b"go\n"
            yield out_r, inode
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            os.close(out_w)
            if not keep_reader:
                os.close(out_r)


def _holds_pipe(pid: int, inode: int) -> bool:
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{name}") == f"pipe:[{inode}]":
                return True
    return False


async def test_cat_through_the_plugin_moves_every_byte_and_reports_exits(fake_plugin: RemoteDriver) -> None:
    exit_, out, err = await cat_through_pipes(fake_plugin.exec_local, "m", _DATA)
    assert exit_.success and err == b""
    assert hashlib.sha256(out).digest() == hashlib.sha256(_DATA).digest()
    exit_, out, err = await cat_through_pipes(
        fake_plugin.exec_local, "m", b"", "sh", "-c", "echo out; echo err >&2; exit 7"
    )
    assert (exit_, out, err) == (ExecExit(7, ""), b"out\n", b"err\n")
    exit_, _, _ = await cat_through_pipes(fake_plugin.exec_local, "m", b"", "sh", "-c", "kill -TERM $$")
    assert exit_ == ExecExit(143, "SIGTERM")


async def test_the_descriptors_reach_the_plugin_process(fake_plugin: RemoteDriver) -> None:
    """The local exec socket is used: while the command runs the plugin process holds the host's pipe."""
    async with _writing_into_a_pipe(fake_plugin, keep_reader=True) as (out_r, inode):
        assert fake_plugin.connection is not None
        plugin = fake_plugin.connection.pid
        assert _holds_pipe(plugin, inode)
    # Once the exec is over the plugin keeps no copy: the reader sees the end of the pipe.
    assert await asyncio.wait_for(asyncio.to_thread(os.read, out_r, 10), 10) == b""
    os.close(out_r)
    assert not _holds_pipe(plugin, inode)


async def test_files_as_stdin_and_stdout(fake_plugin: RemoteDriver, tmp_path: Path) -> None:
    source, target = tmp_path / "in", tmp_path / "out"
    source.write_bytes(_DATA)
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with _null() as null:
            assert (await fake_plugin.exec_local("m", ExecSpec("m", ("cat",)), (src, dst, null))).success
    finally:
        os.close(src)
        os.close(dst)
    assert target.read_bytes() == _DATA


async def test_errors_keep_their_category_and_lose_secrets(fake_plugin: RemoteDriver) -> None:
    with _null() as null:
        with pytest.raises(NotFoundError) as caught:
            await fake_plugin.exec_local(
                "missing-opensesame", ExecSpec("x", ("true",), environment={"K": "opensesame"}), (null, null, null)
            )
        assert "opensesame" not in str(caught.value)
        with pytest.raises(InvalidArgumentError):
            await fake_plugin.exec_local("m", ExecSpec("m", ()), (null, null, null))
        with pytest.raises(InvalidArgumentError):
            await fake_plugin.exec_local("m", ExecSpec("m", ("true",)), (null, null, 999))
    assert (await cat_through_pipes(fake_plugin.exec_local, "m", b"x"))[1] == b"x"


async def test_cancel_kills_the_command(fake_plugin: RemoteDriver) -> None:
    out_r, out_w = os.pipe()
    with _null() as null:
        task = asyncio.create_task(
            fake_plugin.exec_local("m", ExecSpec("m", ("sh", "-c", "echo $$; exec sleep 300")), (null, out_w, null))
        )
        try:
            pid = int(await asyncio.to_thread(os.read, out_r, 20))
            proc = psutil.Process(pid)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(proc.wait, 10)  # raises TimeoutExpired if the command survived
        finally:
            os.close(out_w)
            os.close(out_r)


async def test_a_terminal_is_refused_by_the_host_and_by_the_plugin(fake_plugin: RemoteDriver) -> None:
    master, slave = os.openpty()
    try:
        with _null() as null:
            with pytest.raises(InvalidArgumentError, match="terminal"):
                await fake_plugin.exec_local("m", ExecSpec("m", ("true",)), (slave, null, null))
            # The plugin refuses it too, for a host that does not check (the socket spoken to directly).
            await fake_plugin.find("m")
            session = fake_plugin._warm
            assert session is not None
            path = await fake_plugin._local_exec_socket(session)
            assert path
            with pytest.raises(InvalidArgumentError, match="terminal"):
                await local_exec(path, "m", ExecSpec("m", ("sh", "-c", "echo injected >&2")), (null, null, slave))
            os.set_blocking(master, False)
            with pytest.raises(BlockingIOError):
                os.read(master, 100)  # nothing reached the terminal
    finally:
        os.close(slave)
        os.close(master)


async def test_exec_frames_when_local_exec_is_off_either_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host_off = _fake_plugin(tmp_path / "s1", local_exec=False)
    monkeypatch.setenv("VZ_PLUGIN_LOCAL_EXEC", "0")
    plugin_off = _fake_plugin(tmp_path / "s2")
    for driver in (host_off, plugin_off):
        try:
            await driver.run_image(RunImageRequest("m", "img"))
            exit_, out, _ = await cat_through_pipes(driver.exec_local, "m", _DATA)
            assert exit_.success and out == _DATA
            async with _writing_into_a_pipe(driver) as (_, inode):
                assert driver.connection is not None
                assert not _holds_pipe(driver.connection.pid, inode)  # the bytes came as frames
        finally:
            await driver.close()


async def test_in_process_pair_serves_local_exec(tmp_path: Path) -> None:
    fake = FakeDriver(tmp_path / "state")
    try:
        async with connect_in_process(fake) as remote:
            await remote.run_image(RunImageRequest("m", "img"))
            exit_, out, _ = await cat_through_pipes(remote.exec_local, "m", _DATA)
            assert exit_.success and out == _DATA
            assert remote._warm is not None and (await remote._local_exec_socket(remote._warm))
    finally:
        await fake.close()


@pytest.mark.parametrize("local", [True, False], ids=["local-socket", "exec-frames"])
async def test_a_paused_reader_keeps_memory_bounded(tmp_path: Path, local: bool) -> None:
    driver = _fake_plugin(tmp_path / "state", local_exec=local)
    out_r, out_w = os.pipe()
    try:
        await driver.run_image(RunImageRequest("m", "img"))
        with _null() as null:
            task = asyncio.create_task(driver.exec_local("m", ExecSpec("m", ("yes",)), (null, out_w, null)))
            try:
                assert await asyncio.to_thread(os.read, out_r, 4) == b"y\ny\n"
                assert driver.connection is not None
                plugin, host = psutil.Process(driver.connection.pid), psutil.Process()
                before = plugin.memory_info().rss, host.memory_info().rss
                await asyncio.sleep(1.0)  # `yes` would move gigabytes in a second if nothing held it back
                grown = plugin.memory_info().rss - before[0], host.memory_info().rss - before[1]
                assert grown[0] < 32 << 20 and grown[1] < 32 << 20, f"grew by {grown} bytes (plugin, host)"
                assert not task.done()
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        os.close(out_w)
        os.close(out_r)
        await driver.close()


async def test_another_uid_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root (to connect as another user)")
    parent = tempfile.mkdtemp(prefix="vz-test-uid-", dir="/tmp")  # a place another user can reach
    server = LocalExecServer(FakeDriver(tmp_path / "state"), Redactor(), parent=parent)
    path = await server.start()
    try:
        # Let another user reach the socket at all, so that only the peer check stands in the way.
        for directory in (parent, os.path.dirname(path)):
            os.chmod(directory, 0o755)
        os.chmod(path, 0o777)
        # The system's interpreter (world-executable), as nobody: connect, send a request, report the answer.
        script = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])\n"
            "try:\n    s.sendall(b'\\x00\\x00\\x00\\x03J{}'); a=s.recv(100)\n"
            "except (BrokenPipeError, ConnectionResetError):\n    a=b''\n"
            "sys.stdout.buffer.write(b'answer:'+a)\n"
        )
        done = await asyncio.to_thread(
            subprocess.run,
            ["/usr/bin/python3", "-I", "-c", script, path],
            user=65534,
            group=65534,
            extra_groups=[],
            capture_output=True,
            timeout=60,
            cwd="/",
        )
        assert done.returncode == 0, done.stderr
        seen = done.stdout
        assert seen == b"answer:"  # connected, then closed without a word
    finally:
        await server.close()
        left = os.listdir(parent)
        shutil.rmtree(parent, ignore_errors=True)
    assert left == []  # the private directory and its socket are removed


async def test_a_host_sending_no_descriptors_gets_a_clear_error(tmp_path: Path) -> None:
    server = LocalExecServer(FakeDriver(tmp_path / "state"), Redactor(), parent=str(tmp_path))
    path = await server.start()
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    try:
        await loop.sock_connect(sock, path)
        await send_json(sock, {"exec": {"machine_id": "m", "argv": ["true"]}})
        reply = await loop.sock_recv(sock, 4096)
        assert b"INVALID_ARGUMENT" in reply and b"three descriptors" in reply
    finally:
        sock.close()
        await server.close()


async def test_a_plugin_killed_during_a_local_exec_is_unavailable(fake_plugin: RemoteDriver) -> None:
    out_r, out_w = os.pipe()
    with _null() as null:
        task = asyncio.create_task(
            fake_plugin.exec_local("m", ExecSpec("m", ("sh", "-c", "echo go; exec sleep 300")), (null, out_w, null))
        )
        try:
            assert await asyncio.to_thread(os.read, out_r, 10) == b"go\n"
            assert fake_plugin.connection is not None
            os.kill(fake_plugin.connection.pid, 9)
            with pytest.raises(UnavailableError, match="died"):
                await task
        finally:
            os.close(out_w)
            os.close(out_r)
    assert (await cat_through_pipes(fake_plugin.exec_local, "m", b"again"))[1] == b"again"  # relaunched


@pytest.mark.root
async def test_linux_native_through_its_plugin_gives_the_command_the_host_pipe(tmp_path: Path) -> None:
    """Host → plugin (SCM_RIGHTS) → guest agent (SCM_RIGHTS): the command writes into the host's own pipe."""
    if os.geteuid() != 0:
        pytest.fail("the linux_native Machine needs root")
    from vz_core.transport import LaunchSpec, PluginLauncher
    from vz_drivers._agent import ensure_agent_binary
    from vz_drivers.linux_native import cleanup_state

    state, images, agent = tmp_path / "state", tmp_path / "images", str(ensure_agent_binary())
    script = tmp_path / "vz-driver-linux_native"
    script.write_text(f"#!{sys.executable}\nfrom vz_drivers.linux_native.registration import main\nmain()\n")
    script.chmod(0o755)
    argv = [str(script), "--state-dir", str(state), "--image-dir", str(images), "--option", f"agent_binary={agent}"]
    driver = RemoteDriver(PluginLauncher(lambda: LaunchSpec("linux_native", argv), name="linux_native"))
    try:
        await driver.run_image(RunImageRequest("ln", "vz:default", args=("sleep", "1000000")))
        exit_, out, err = await cat_through_pipes(driver.exec_local, "ln", _DATA)
        assert exit_.success and err == b"" and hashlib.sha256(out).digest() == hashlib.sha256(_DATA).digest()
        out_r, out_w = os.pipe()
        inode = os.fstat(out_w).st_ino
        with _null() as null:
            try:
                exit_ = await driver.exec_local(
                    "ln", ExecSpec("ln", ("readlink", "/proc/self/fd/1")), (null, out_w, null)
                )
            finally:
                os.close(out_w)
            with os.fdopen(out_r, "rb") as f:
                assert f.read() == f"pipe:[{inode}]\n".encode()
            assert exit_.success
            master, slave = os.openpty()
            try:
                with pytest.raises(InvalidArgumentError, match="terminal"):
                    await driver.exec_local("ln", ExecSpec("ln", ("true",)), (null, slave, null))
            finally:
                os.close(slave)
                os.close(master)
        await driver.delete("ln")
    finally:
        await driver.close()
        await cleanup_state(str(state), image_dir=str(images), agent_binary=agent)


async def test_exec_frames_are_widened_between_vz_peers(tmp_path: Path) -> None:
    """exec_local over frames asks the plugin for wide frames (WIDE_CHUNK_KEY): fewer, larger frames both ways,
    handed on whole; exec() uses them too but hands its caller chunks of at most 32 KiB."""
    import vz_core.rpc._client as client_module
    from vz_core.rpc import _codec

    sent: list[int] = []
    encode = client_module._ExecFrames.encode

    def counting(self: object, item: bytes) -> list[object]:
        frames = encode(self, item)  # type: ignore[arg-type]
        for frame in frames:
            decoded = _codec.decode_client(frame)  # type: ignore[arg-type]
            assert decoded is not None
            sent.append(len(decoded.stdin))
        return frames  # type: ignore[return-value]

    fake = FakeDriver(tmp_path / "state")
    try:
        async with connect_in_process(fake, local_exec=False) as remote:
            await remote.run_image(RunImageRequest("m", "img"))

            async def stdin() -> AsyncIterator[bytes]:
                for i in range(0, len(_DATA), 1 << 20):
                    yield _DATA[i : i + (1 << 20)]

            client_module._ExecFrames.encode = counting  # type: ignore[method-assign]
            try:
                wide = [e async for e in remote._wide_exec(ExecSpec("m", ("cat",)), stdin())]
            finally:
                client_module._ExecFrames.encode = encode  # type: ignore[method-assign]
            narrow = [e async for e in remote.exec(ExecSpec("m", ("cat",)), stdin())]
            for events in (wide, narrow):
                assert b"".join(e.data for e in events if isinstance(e, ExecOutput)) == _DATA
            out_wide = [len(e.data) for e in wide if isinstance(e, ExecOutput)]
            assert max(out_wide) > 32768 and max(out_wide) <= MAX_WIDE_CHUNK
            assert max(sent) == MAX_WIDE_CHUNK and sent[0] == 32768  # wide only once the plugin agreed
            assert max(len(e.data) for e in narrow if isinstance(e, ExecOutput)) <= 32768
            # exec_local over frames uses them: the bytes arrive whole.
            exit_, out, _ = await cat_through_pipes(remote.exec_local, "m", _DATA)
            assert exit_.success and out == _DATA
    finally:
        await fake.close()
