"""The daemon's listener in this process with a test handler: hello, calls, streams, fds, errors, cancel,
the peer uid check, idle exit and shutdown. Clients are the real blocking client (``connect``) in threads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from vz_core.daemon import Call, Connection, Daemon, DaemonError, DaemonPaths, connect, read_pid_file
from vz_core.errors import NotFoundError
from vz_core.wire._frames import Channel


class Recorder:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.cancelled: list[str] = []
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.fd_inodes: list[int] = []

    async def __call__(self, call: Call) -> dict[str, Any]:
        self.calls.append(call)
        method = call.method
        if method == "Test.Echo":
            return {"echo": call.request, "peer_pid": call.peer_pid}
        if method == "Test.Stream":
            await call.progress({"step": "one"})
            await call.event({"kind": "test.event"})
            await call.write(1, b"out")
            await call.write(2, b"err")
            received = []
            while True:
                message = await call.receive()
                received.append(message)
                if message is None or (isinstance(message, dict) and "stdin_close" in message):
                    break
            return {"received": [[m[0], m[1].decode()] if isinstance(m, tuple) else m for m in received[:-1]]}
        if method == "Test.Fds":
            for fd in call.fds:
                self.fd_inodes.append(os.fstat(fd).st_ino)
                os.write(fd, f"fd {len(self.fd_inodes)}\n".encode())
            return {"fds": len(call.fds)}
        if method == "Test.Fail":
            raise NotFoundError("no Machine 'web' in Environment 'dev'")
        if method == "Test.Bug":
            raise RuntimeError("boom")
        if method in ("Test.Hold", "Environments.Watch"):
            self.entered.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(method)
                raise
            return {"held": True}
        raise AssertionError(method)


@pytest.fixture
def paths(tmp_path: Path) -> DaemonPaths:
    return DaemonPaths(str(tmp_path / "home"))


@contextlib.asynccontextmanager
async def running(paths: DaemonPaths, handler: Any, **kwargs: Any) -> AsyncIterator[Daemon]:
    daemon = Daemon(paths, handler, handle_signals=False, **{"idle_timeout": 0.0, **kwargs})
    ready = asyncio.Event()
    task = asyncio.ensure_future(daemon.serve(ready=ready.set))
    await asyncio.wait([task, asyncio.ensure_future(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield daemon
    finally:
        daemon.request_shutdown("test over")
        await asyncio.wait_for(task, 30)


async def client(paths: DaemonPaths, fn: Callable[[Connection], Any]) -> Any:
    def run() -> Any:
        with connect(paths.home, environ={}, autostart=False) as conn:
            return fn(conn)

    return await asyncio.to_thread(run)


async def test_hello_and_one_call(paths: DaemonPaths) -> None:
    handler = Recorder()
    async with running(paths, handler) as daemon:
        hello, result = await client(paths, lambda c: (c.hello, c.request("Test.Echo", {"a": [1, "é"]})))
        assert hello == {
            "protocol": 1,
            "version": daemon.version,
            "fingerprint": daemon.fingerprint,
            "pid": os.getpid(),
            "busy": False,
        }
        assert result == {"echo": {"a": [1, "é"]}, "peer_pid": os.getpid()}
        record = read_pid_file(paths)
        assert record is not None and record["pid"] == os.getpid() and record["socket"] == paths.socket
        assert oct(os.stat(paths.directory).st_mode & 0o777) == "0o700"
        assert oct(os.stat(paths.socket).st_mode & 0o777) == "0o600"

        def second_call(c: Connection) -> None:
            c.call("Test.Echo")
            with pytest.raises(DaemonError, match="one call per connection"):
                c.call("Test.Echo")

        await client(paths, second_call)
    assert not Path(paths.socket).exists() and not Path(paths.pid_file).exists()  # noqa: ASYNC240


async def test_streams_both_ways(paths: DaemonPaths) -> None:
    def run(c: Connection) -> tuple[list[Any], dict[str, Any]]:
        c.call("Test.Stream")
        c.write(0, b"in-1")
        c.send({"resize": {"rows": 40, "cols": 100}})
        c.send({"stdin_close": {}})
        seen: list[Any] = []
        return seen, c.result(seen.append)

    async with running(paths, Recorder()):
        seen, result = await client(paths, run)
    assert seen == [{"progress": {"step": "one"}}, {"event": {"kind": "test.event"}}, (1, b"out"), (2, b"err")]
    assert result == {"received": [[0, "in-1"], {"resize": {"rows": 40, "cols": 100}}]}


async def test_fds_reach_the_handler_and_are_closed_after(paths: DaemonPaths, tmp_path: Path) -> None:
    handler = Recorder()
    files = [tmp_path / f"out{i}" for i in range(3)]
    opened = [os.open(f, os.O_WRONLY | os.O_CREAT, 0o600) for f in files]
    try:
        async with running(paths, handler):
            before = len(os.listdir("/proc/self/fd"))
            result = await client(paths, lambda c: c.request("Test.Fds", fds=opened))
            assert result == {"fds": 3}
            assert [f.read_text() for f in files] == ["fd 1\n", "fd 2\n", "fd 3\n"]
            assert handler.fd_inodes == [os.fstat(fd).st_ino for fd in opened]
            for _ in range(200):  # the server's side of the connection closes just after the result is sent
                if len(os.listdir("/proc/self/fd")) == before:
                    break
                await asyncio.sleep(0.01)
            assert len(os.listdir("/proc/self/fd")) == before  # the call's copies and the connection are closed
    finally:
        for fd in opened:
            os.close(fd)


async def test_errors_are_encoded(paths: DaemonPaths, caplog: pytest.LogCaptureFixture) -> None:
    async with running(paths, Recorder()):
        with pytest.raises(DaemonError) as known:
            await client(paths, lambda c: c.request("Test.Fail"))
        with caplog.at_level(logging.ERROR, logger="vz.daemon"), pytest.raises(DaemonError) as bug:
            await client(paths, lambda c: c.request("Test.Bug"))
    assert (known.value.code, known.value.kind, known.value.exit_code) == ("NOT_FOUND", "not_found", 3)
    assert known.value.message == "no Machine 'web' in Environment 'dev'"
    assert known.value.details is not None and known.value.details["code"] == "RUNTIME_ERROR_CODE_NOT_FOUND"
    assert bug.value.exit_code == 1 and "internal error in the vz daemon: RuntimeError: boom" in bug.value.message
    assert "Traceback" in caplog.text  # the bug's traceback is in the daemon log, not sent to the client


async def test_cancel_message_and_hangup_cancel_the_handler(paths: DaemonPaths) -> None:
    handler = Recorder()
    async with running(paths, handler) as daemon:

        def cancel(c: Connection) -> None:
            c.call("Test.Hold")
            c.cancel()
            c.result()

        with pytest.raises(DaemonError) as exc:
            await client(paths, cancel)
        assert (exc.value.code, exc.value.exit_code) == ("CANCELLED", 130)
        assert handler.cancelled == ["Test.Hold"] and handler.calls[-1].cancelled.is_set()

        handler.entered.clear()  # before the call: the daemon may enter the handler before conn.call returns
        conn = await asyncio.to_thread(connect, paths.home, {}, False)
        await asyncio.to_thread(conn.call, "Test.Hold")
        await asyncio.wait_for(handler.entered.wait(), 10)
        assert daemon.busy and [c.method for c in daemon.operations] == ["Test.Hold"]
        conn.close()  # hangup = cancel
        for _ in range(200):
            if len(handler.cancelled) == 2:
                break
            await asyncio.sleep(0.01)
        assert handler.cancelled == ["Test.Hold", "Test.Hold"]
        assert not daemon.busy


async def test_busy_in_hello_and_watch_is_not_an_operation(paths: DaemonPaths) -> None:
    handler = Recorder()
    async with running(paths, handler) as daemon:
        watch = await asyncio.to_thread(connect, paths.home, {}, False)
        await asyncio.to_thread(watch.call, "Environments.Watch")
        await asyncio.wait_for(handler.entered.wait(), 10)
        assert not daemon.busy
        hello = await client(paths, lambda c: c.hello)
        assert hello["busy"] is False
        handler.entered.clear()
        hold = await asyncio.to_thread(connect, paths.home, {}, False)
        await asyncio.to_thread(hold.call, "Test.Hold")
        await asyncio.wait_for(handler.entered.wait(), 10)
        hello = await client(paths, lambda c: c.hello)
        assert hello["busy"] is True
        assert daemon.status()["operations"][0]["method"] == "Test.Hold"
        handler.release.set()
        assert await asyncio.to_thread(hold.result) == {"held": True}
        hold.close()
        assert await asyncio.to_thread(watch.result) == {"held": True}
        watch.close()


async def test_shutdown_lets_operations_finish_and_cancels_watches(paths: DaemonPaths) -> None:
    handler = Recorder()
    hooks: list[str] = []

    async def hook() -> None:
        hooks.append("stopped plugins")

    daemon = Daemon(paths, handler, handle_signals=False, idle_timeout=0.0, on_shutdown=[hook], shutdown_grace=10)
    ready = asyncio.Event()
    serving = asyncio.ensure_future(daemon.serve(ready=ready.set))
    await ready.wait()
    watch = await asyncio.to_thread(connect, paths.home, {}, False)
    await asyncio.to_thread(watch.call, "Environments.Watch")
    await asyncio.wait_for(handler.entered.wait(), 10)
    handler.entered.clear()
    hold = await asyncio.to_thread(connect, paths.home, {}, False)
    await asyncio.to_thread(hold.call, "Test.Hold")
    await asyncio.wait_for(handler.entered.wait(), 10)
    reply = await client(paths, lambda c: c.request("System.Shutdown"))
    assert reply == {"pid": os.getpid(), "operations": 1, "stopping": True, "busy": True}
    with pytest.raises(DaemonError, match=r"cancel|interrupted"):
        await asyncio.to_thread(watch.result)
    watch.close()
    await asyncio.sleep(0.2)
    assert not serving.done() and hooks == []  # the operation is still running: no hook yet
    assert not Path(paths.socket).exists()  # noqa: ASYNC240 - no longer accepting
    handler.release.set()
    assert await asyncio.to_thread(hold.result) == {"held": True}
    hold.close()
    assert await asyncio.wait_for(serving, 10) == f"System.Shutdown from pid {os.getpid()}"
    assert hooks == ["stopped plugins"] and not Path(paths.pid_file).exists()  # noqa: ASYNC240


async def test_idle_exit_waits_for_operations(paths: DaemonPaths) -> None:
    handler = Recorder()
    daemon = Daemon(paths, handler, handle_signals=False, idle_timeout=0.3)
    serving = asyncio.ensure_future(daemon.serve())
    for _ in range(500):
        if Path(paths.socket).exists():  # noqa: ASYNC240
            break
        await asyncio.sleep(0.01)
    hold = await asyncio.to_thread(connect, paths.home, {}, False)
    await asyncio.to_thread(hold.call, "Test.Hold")
    await asyncio.wait_for(handler.entered.wait(), 10)
    await asyncio.sleep(0.8)
    assert not serving.done()  # an operation in flight keeps it up past the idle timeout
    handler.release.set()
    await asyncio.to_thread(hold.result)
    hold.close()
    loop = asyncio.get_running_loop()
    closed_at = loop.time()
    reason = await asyncio.wait_for(serving, 10)
    assert reason == "idle for 0.3 s with no operation in flight"
    assert 0.2 <= loop.time() - closed_at < 5


async def test_protocol_violations_get_a_clear_error(paths: DaemonPaths) -> None:
    def raw(messages: list[dict[str, Any]]) -> Any:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(paths.socket)
        ch = Channel(sock)
        try:
            for m in messages:
                ch.send(m)
            got = ch.receive()
            while got is not None and "hello" in got[0]:
                got = ch.receive()
            return got[0] if got else None
        finally:
            ch.close()

    hello = {"hello": {"protocol": 1, "version": "0", "fingerprint": "", "pid": 1}}
    async with running(paths, Recorder()):
        no_hello = await asyncio.to_thread(raw, [{"call": {"method": "Test.Echo"}}])
        assert 'first message must be {"hello"' in no_hello["error"]["message"]
        old = await asyncio.to_thread(raw, [{"hello": {"protocol": 0}}])
        assert "speaks local protocol 1, the client 0" in old["error"]["message"]
        bad_call = await asyncio.to_thread(raw, [hello, {"call": {"method": 7}}])
        assert 'expected {"call": {"method"' in bad_call["error"]["message"]


@pytest.mark.parametrize("sent", ["nothing", "hello only"])
async def test_a_silent_client_is_dropped_after_its_timeout(
    paths: DaemonPaths, monkeypatch: pytest.MonkeyPatch, sent: str
) -> None:
    """No first bytes within HELLO_TIMEOUT, or no call within CALL_TIMEOUT after the hello: the daemon closes the
    connection (the other clients are served meanwhile)."""
    from vz_core.daemon import _server

    monkeypatch.setattr(_server, "HELLO_TIMEOUT", 0.3)
    monkeypatch.setattr(_server, "CALL_TIMEOUT", 0.3)

    def silent() -> tuple[float, bytes]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(paths.socket)
            if sent == "hello only":
                Channel(s).send({"hello": {"protocol": 1, "version": "0", "fingerprint": "", "pid": 1}})
            t0 = time.monotonic()
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            return time.monotonic() - t0, data

    async with running(paths, Recorder()):
        waiting = asyncio.ensure_future(asyncio.to_thread(silent))
        assert (await client(paths, lambda c: c.request("Test.Echo", {"n": 1})))["echo"] == {"n": 1}
        seconds, data = await waiting
    assert 0.2 <= seconds < 5  # closed by the daemon, not by the client's own 10 s timeout
    if sent == "nothing":
        assert data == b""
    else:
        assert b'"hello"' in data  # the daemon's hello, then the close


async def test_http2_preface_goes_to_the_hook(paths: DaemonPaths) -> None:
    got: list[bytes] = []

    async def hook(sock: socket.socket, prefix: bytes) -> None:
        loop = asyncio.get_running_loop()
        data = b""
        while len(data) < 24:
            data += await loop.sock_recv(sock, 64)
        got.append(prefix + data)
        await loop.sock_sendall(sock, b"h2 ok")
        sock.close()

    def h2() -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(paths.socket)
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            return s.recv(10)

    async with running(paths, Recorder(), http2=hook):
        assert await asyncio.to_thread(h2) == b"h2 ok"
    assert got == [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]


async def test_other_uid_is_refused_before_anything_is_read(caplog: pytest.LogCaptureFixture) -> None:
    """A process of another uid that can reach the socket (its directory loosened after bind) is refused."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another uid")
    import pwd

    nobody = pwd.getpwnam("nobody").pw_uid
    base = tempfile.mkdtemp(prefix="vzd-uid-")  # /tmp itself: pytest's base temp is closed to other uids
    try:
        paths = DaemonPaths(os.path.join(base, "home"))
        async with running(paths, Recorder()):
            os.chmod(base, 0o711)
            os.chmod(paths.home, 0o711)
            os.chmod(paths.directory, 0o711)
            os.chmod(paths.socket, 0o666)
            with caplog.at_level(logging.WARNING, logger="vz.daemon"):
                status = await asyncio.to_thread(_connect_as, nobody, paths.socket)
                for _ in range(100):
                    if "refused a connection" in caplog.text:
                        break
                    await asyncio.sleep(0.01)
            assert status == 0, "the other uid's connection got a reply, or could not connect at all"
            assert f"refused a connection from uid {nobody}" in caplog.text
            os.chmod(paths.directory, 0o700)
    finally:
        shutil.rmtree(base)


def _connect_as(uid: int, path: str) -> int:
    """Fork; the child becomes ``uid``, connects, says hello: exit 0 when it got EOF without a byte."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.setgid(uid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(path)
            code = 4
            s.sendall(b'\x00\x00\x00\x0eJ{"hello": {}}')
            code = 0 if s.recv(100) == b"" else 5
        except (ConnectionResetError, BrokenPipeError):  # closed by the daemon before or after the write
            code = 0 if code == 4 else code
        except BaseException:
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_client_refuses_a_socket_dir_it_does_not_own(tmp_path: Path) -> None:
    paths = DaemonPaths(str(tmp_path / "home"))
    os.makedirs(paths.directory, mode=0o700)
    os.chown(paths.directory, 65534, 65534)
    with pytest.raises(DaemonError, match=r"owned by uid 65534, not by you") as exc:
        connect(paths.home, environ={}, autostart=False)
    assert exc.value.exit_code == 2


def test_client_fixes_a_readable_dir_and_refuses_a_writable_one(tmp_path: Path) -> None:
    paths = DaemonPaths(str(tmp_path / "home"))
    os.makedirs(paths.directory, mode=0o700)
    os.chmod(paths.directory, 0o755)
    with pytest.raises(DaemonError, match="no vz daemon runs"):
        connect(paths.home, environ={}, autostart=False)
    assert os.stat(paths.directory).st_mode & 0o777 == 0o700
    os.chmod(paths.directory, 0o775)
    with pytest.raises(DaemonError, match=r"others may write to it \(mode 0775\)"):
        connect(paths.home, environ={}, autostart=False)


async def test_socket_path_longer_than_sun_path(tmp_path: Path) -> None:
    paths = DaemonPaths(str(tmp_path / ("h" * 120)))
    assert len(paths.socket) > 108
    async with running(paths, Recorder()):
        result = await client(paths, lambda c: c.request("Test.Echo", {"long": True}))
        assert result["echo"] == {"long": True}
