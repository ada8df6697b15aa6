from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vz_core.errors import PluginError
from vz_core.redact import Redactor
from vz_core.rpc.pb import grpc_broker_pb2, grpc_broker_pb2_grpc, grpc_stdio_pb2_grpc
from vz_core.rpc.pb import runtime_pb2 as pb
from vz_core.rpc.pb import runtime_pb2_grpc as pb_grpc
from vz_core.transport import LaunchSpec, PluginConnection, PluginLauncher

TESTDRIVERS = Path(__file__).resolve().parents[2] / "vz_plugins" / "testdrivers.py"


def mini(kind: str = "mini", **kwargs: object) -> PluginLauncher:
    return PluginLauncher(lambda: LaunchSpec(kind, [sys.executable, str(TESTDRIVERS), kind]), name=kind, **kwargs)  # type: ignore[arg-type]


def scripted(code: str, *, plaintext: bool = False, **kwargs: object) -> PluginLauncher:
    """A 'plugin' that is just a Python snippet: to produce every kind of bad handshake."""
    spec = LaunchSpec("scripted", [sys.executable, "-c", code], plaintext=plaintext)
    return PluginLauncher(lambda: spec, name="scripted", **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def run_root() -> Iterator[str]:
    """A short private directory for the launcher's socket directories (checked empty afterwards)."""
    path = tempfile.mkdtemp(prefix="vzt-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def connection() -> AsyncIterator[PluginConnection]:
    conn = await mini().launch()
    try:
        yield conn
    finally:
        await conn.shutdown()


async def _info(conn: PluginConnection) -> pb.InfoResponse:
    reply: pb.InfoResponse = await pb_grpc.RuntimeDriverStub(conn.channel).Info(pb.InfoRequest())  # type: ignore[no-untyped-call]
    return reply


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


# A healthy launch -------------------------------------------------------------------------------------


async def test_launch_handshakes_over_a_unix_socket_with_native_automtls(connection: PluginConnection) -> None:
    hs = connection.handshake
    assert (hs.core_version, hs.app_version, hs.network, hs.protocol) == (1, 1, "unix", "grpc")
    assert hs.server_cert_der is not None and len(hs.server_cert_der) > 50
    assert connection.tls == "native"
    assert os.path.basename(os.path.dirname(hs.address)).startswith("vz-plugin-")
    assert (await _info(connection)).driver_name == "mini"


async def test_health_reports_plugin_serving(connection: PluginConnection) -> None:
    stub = health_pb2_grpc.HealthStub(connection.channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service="plugin"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_plain_grpc_without_a_client_certificate_is_refused(connection: PluginConnection) -> None:
    async with grpc.aio.insecure_channel(connection.handshake.target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pb_grpc.RuntimeDriverStub(channel).Info(pb.InfoRequest(), timeout=5)  # type: ignore[no-untyped-call]
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_stdio_and_broker_streams_are_accepted_and_idle(connection: PluginConnection) -> None:
    from google.protobuf import empty_pb2

    stdio = grpc_stdio_pb2_grpc.GRPCStdioStub(connection.channel).StreamStdio(empty_pb2.Empty())  # type: ignore[no-untyped-call]
    broker = grpc_broker_pb2_grpc.GRPCBrokerStub(connection.channel).StartStream()  # type: ignore[no-untyped-call]
    await broker.write(grpc_broker_pb2.ConnInfo(service_id=1, network="unix", address="/nowhere"))
    # Both stay open and quiet while other calls are served.
    assert (await _info(connection)).driver_name == "mini"
    await broker.done_writing()
    assert await broker.code() == grpc.StatusCode.OK
    stdio.cancel()


async def test_shutdown_makes_the_plugin_exit_promptly_and_removes_its_socket(
    connection: PluginConnection,
) -> None:
    pid = connection.pid
    socket_dir = os.path.dirname(connection.handshake.address)
    started = time.monotonic()
    status = await connection.shutdown()
    elapsed = time.monotonic() - started
    assert status.code == 0 and not status.signal, status
    assert elapsed < 1.0, f"plugin took {elapsed:.2f}s to exit after Shutdown"
    assert _gone(pid)
    assert not _exists(socket_dir)


async def test_tcp_plugin_in_the_port_range() -> None:
    conn = await mini("mini-tcp").launch()
    try:
        host, _, port = conn.handshake.address.rpartition(":")
        assert conn.handshake.network == "tcp" and host == "127.0.0.1" and 10000 <= int(port) <= 25000
        assert conn.tls == "native"
        assert (await _info(conn)).driver_name == "mini"
    finally:
        await conn.shutdown()


async def test_unsupervised_launch_works_and_shuts_down() -> None:
    conn = await mini(supervised=False).launch()
    assert not conn.process.supervised
    assert (await _info(conn)).driver_name == "mini"
    status = await conn.shutdown()
    assert status.code == 0
    assert _gone(conn.pid)


async def test_plugin_stderr_is_forwarded_redacted(caplog: pytest.LogCaptureFixture) -> None:
    redactor = Redactor(["s3cr3t-value"])
    caplog.set_level(logging.INFO, logger="vz.plugin")
    conn = await mini(redactor=redactor).launch()
    try:
        request = pb.RunImageRequest(workspace_id="w", image="i", environment={"TOKEN": "s3cr3t-value"})
        await pb_grpc.RuntimeDriverStub(conn.channel).RunImage(request)  # type: ignore[no-untyped-call]
    finally:
        await conn.shutdown()
    assert "configuring TOKEN=***" in conn.stderr_tail()
    assert any("configuring TOKEN=***" in r.getMessage() for r in caplog.records if r.name == "vz.plugin.mini")
    assert "s3cr3t-value" not in caplog.text and "s3cr3t-value" not in conn.stderr_tail()


# Plaintext --------------------------------------------------------------------------------------------


async def test_declared_plaintext_driver_connects_without_tls() -> None:
    launcher = PluginLauncher(
        lambda: LaunchSpec("mini", [sys.executable, str(TESTDRIVERS), "mini"], plaintext=True), name="mini"
    )
    conn = await launcher.launch()
    try:
        assert conn.tls == "plaintext" and conn.handshake.server_cert_der is None
        assert (await _info(conn)).driver_name == "mini"
    finally:
        await conn.shutdown()


async def test_a_plugin_that_ignores_automtls_is_refused() -> None:
    code = "import sys,time; print('1|1|unix|/tmp/nowhere.sock|grpc|', flush=True); time.sleep(60)"
    with pytest.raises(PluginError, match=r"ignored AutoMTLS .* refusing an unauthenticated connection"):
        await scripted(code).launch()


# Bad plugins: clear errors, nothing left behind --------------------------------------------------------


HANG = "\nimport time\ntime.sleep(30)"


@pytest.mark.parametrize(
    ("code", "fragment"),
    [
        pytest.param("print('hello from a plugin')", "ended .* stdout said: 'hello from a plugin'", id="garbage-exit"),
        pytest.param(
            "print('hello', flush=True)" + HANG, "no handshake line within 2s.*stdout said: 'hello'", id="garbage"
        ),
        pytest.param("pass", r"ended \(exit code 0\) before printing its handshake", id="silent-exit"),
        pytest.param("import sys; sys.exit(4)", r"ended \(exit code 4\)", id="exit-4"),
        pytest.param("import os; os.close(1)" + HANG, "closed stdout before printing its handshake", id="close-stdout"),
        pytest.param("print('2|1|unix|/tmp/x.sock|grpc|', flush=True)" + HANG, "core protocol 2", id="wrong-core"),
        pytest.param(
            "print('1|9|unix|/tmp/x.sock|grpc|', flush=True)" + HANG, "application protocol 9", id="wrong-app"
        ),
        pytest.param(
            "print('1|1|pigeon|/tmp/x.sock|grpc|', flush=True)" + HANG, "unknown network 'pigeon'", id="network"
        ),
        pytest.param("print('1|1|unix|/tmp/x.sock|netrpc|', flush=True)" + HANG, "protocol 'netrpc'", id="protocol"),
        pytest.param("print('a|b|c|d', flush=True)" + HANG, "non-numeric core protocol", id="garbage-fields"),
        pytest.param("import sys; sys.stdout.write('x' * 200000); sys.stdout.flush()" + HANG, "over-long", id="huge"),
    ],
)
async def test_bad_handshakes_fail_clearly_and_leave_nothing(code: str, fragment: str, run_root: str) -> None:
    with pytest.raises(PluginError, match=fragment):
        await scripted(code, handshake_timeout=2.0, run_root=run_root).launch()
    assert os.listdir(run_root) == []


async def test_stderr_of_a_failed_launch_is_in_the_error() -> None:
    code = "import sys; sys.stderr.write('cannot open /dev/kvm\\n'); sys.exit(2)"
    with pytest.raises(PluginError, match=r"(?s)exit code 2.*cannot open /dev/kvm"):
        await scripted(code).launch()


async def test_a_plugin_that_never_handshakes_is_stopped_at_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(PluginError, match=r"no handshake line within 1s"):
        await scripted("import time; time.sleep(60)", handshake_timeout=1.0).launch()
    assert time.monotonic() - started < 5.0


async def test_an_unexecutable_program_is_reported() -> None:
    spec = LaunchSpec("broken", ["/nonexistent/plugin"])
    with pytest.raises(PluginError, match="could not be executed"):
        await PluginLauncher(lambda: spec, name="broken").launch()


async def test_cancelling_a_launch_leaves_nothing_behind(run_root: str, tmp_path: Path) -> None:
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    code = f"import time; open({str(fifo)!r}, 'w').write('up'); time.sleep(60)"
    task = asyncio.ensure_future(scripted(code, run_root=run_root).launch())
    assert await asyncio.to_thread(fifo.read_text) == "up"  # the plugin process runs: cancel the launch now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert os.listdir(run_root) == []


async def test_stopping_tells_a_requested_end_from_a_crash() -> None:
    asked = await mini().launch()
    crashed = await mini().launch()
    try:
        assert not asked.stopping and not crashed.stopping
        await asked.shutdown()
        assert asked.stopping and asked.process.exited.is_set()
        os.kill(crashed.pid, 9)
        await crashed.process.wait()
        assert not crashed.stopping  # nobody asked it to end: a crash
    finally:
        await crashed.kill()
        await asked.kill()
    assert crashed.stopping
