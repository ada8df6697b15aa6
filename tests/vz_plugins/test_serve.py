"""The plugin SDK as a go-plugin host sees it: a real plugin process, raw gRPC against it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from vz_plugins import NOT_A_COMMAND

from vz_core.rpc import runtime_errors_in
from vz_core.rpc.pb import extensions_pb2 as ext_pb
from vz_core.rpc.pb import extensions_pb2_grpc as ext_grpc
from vz_core.rpc.pb import runtime_pb2 as pb
from vz_core.rpc.pb import runtime_pb2_grpc as pb_grpc
from vz_core.transport import COOKIE_KEY, COOKIE_VALUE, LaunchSpec, PluginConnection, PluginLauncher

TESTDRIVERS = Path(__file__).resolve().parent / "testdrivers.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_") and k != COOKIE_KEY}
    env.update(extra)
    return env


@pytest.fixture
def plugin_process(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The mini plugin started by hand, the way a go-plugin host starts it (no TLS)."""
    env = _env(**{COOKIE_KEY: COOKIE_VALUE, "PLUGIN_PROTOCOL_VERSIONS": "1,2", "PLUGIN_UNIX_SOCKET_DIR": str(tmp_path)})
    proc = subprocess.Popen(
        [sys.executable, str(TESTDRIVERS), "mini"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


async def _launch(kind: str = "mini") -> PluginConnection:
    spec = LaunchSpec(kind, [sys.executable, str(TESTDRIVERS), kind])
    return await PluginLauncher(lambda: spec, name=kind).launch()


@pytest.fixture
async def conn() -> AsyncIterator[PluginConnection]:
    c = await _launch()
    try:
        yield c
    finally:
        await c.shutdown()


def _stub(conn: PluginConnection) -> pb_grpc.RuntimeDriverStub:
    return pb_grpc.RuntimeDriverStub(conn.channel)  # type: ignore[no-untyped-call]


def _runtime_error(err: grpc.RpcError) -> pb.RuntimeError:
    details = runtime_errors_in(err)
    assert len(details) == 1, "every error status carries exactly one RuntimeError"
    return details[0]


# Process behaviour ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cookie", [None, "", "devsy-runtime-v2"], ids=["missing", "empty", "wrong"])
def test_without_the_cookie_the_plugin_explains_and_exits_1(cookie: str | None) -> None:
    env = _env() if cookie is None else _env(**{COOKIE_KEY: cookie})
    out = subprocess.run([sys.executable, str(TESTDRIVERS), "mini"], env=env, capture_output=True, timeout=60)
    assert out.returncode == 1
    assert out.stdout == b""
    assert out.stderr.decode() == NOT_A_COMMAND
    assert "This binary is a plugin. These are not meant to be executed directly." in NOT_A_COMMAND


@pytest.mark.parametrize("offered", ["2", "0,2,3"])
def test_without_protocol_1_on_offer_the_plugin_exits_1(offered: str) -> None:
    env = _env(**{COOKIE_KEY: COOKIE_VALUE, "PLUGIN_PROTOCOL_VERSIONS": offered})
    out = subprocess.run([sys.executable, str(TESTDRIVERS), "mini"], env=env, capture_output=True, timeout=60)
    assert out.returncode == 1
    assert out.stdout == b""
    assert f"the host offered PLUGIN_PROTOCOL_VERSIONS={offered!r}" in out.stderr.decode()


def test_exactly_one_handshake_line_then_nothing_on_stdout(plugin_process: subprocess.Popen[bytes]) -> None:
    assert plugin_process.stdout is not None
    line = plugin_process.stdout.readline().decode()
    assert re.fullmatch(r"1\|1\|unix\|/[^|]+/plugin-[0-9a-f]{8}\.sock\|grpc\|\n", line), line
    socket_path = line.split("|")[3]
    assert os.path.exists(socket_path)
    plugin_process.send_signal(signal.SIGINT)  # ignored, like go-plugin plugins do
    plugin_process.send_signal(signal.SIGTERM)
    assert plugin_process.wait(timeout=10) == 0
    assert plugin_process.stdout.read() == b"", "nothing but the handshake line ever reaches stdout"
    assert not os.path.exists(socket_path)


@pytest.mark.parametrize("offered", ["1", "1,2", "x,1", ""])
def test_protocol_1_is_chosen_when_offered(offered: str, tmp_path: Path) -> None:
    env = _env(**{COOKIE_KEY: COOKIE_VALUE, "PLUGIN_UNIX_SOCKET_DIR": str(tmp_path)})
    if offered:
        env["PLUGIN_PROTOCOL_VERSIONS"] = offered
    with subprocess.Popen([sys.executable, str(TESTDRIVERS), "mini"], env=env, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        proc.terminate()
        proc.wait(timeout=10)
    assert line.startswith("1|1|unix|"), line


async def test_prints_after_the_handshake_go_to_stderr(
    conn: PluginConnection, caplog: pytest.LogCaptureFixture
) -> None:
    call = _stub(conn).Exec()
    await call.write(pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w", argv=["print"])))
    frames = [msg async for msg in call]  # the command exits without reading stdin: that is allowed
    assert frames[-1].WhichOneof("payload") == "exit"
    await conn.shutdown()
    assert "hello from print()" in conn.stderr_tail()
    assert "stdout after handshake" not in caplog.text


async def test_shutdown_rpc_exits_the_process_promptly(conn: PluginConnection) -> None:
    from vz_core.rpc.pb import grpc_controller_pb2, grpc_controller_pb2_grpc

    stub = grpc_controller_pb2_grpc.GRPCControllerStub(conn.channel)  # type: ignore[no-untyped-call]
    started = time.monotonic()
    await stub.Shutdown(grpc_controller_pb2.Empty())
    status = await conn.process.wait()
    elapsed = time.monotonic() - started
    assert status.code == 0
    assert elapsed < 1.0, f"{elapsed:.2f}s from Shutdown to exit"


def _launcher(kind: str) -> PluginLauncher:
    return PluginLauncher(lambda: LaunchSpec(kind, [sys.executable, str(TESTDRIVERS), kind]), name=kind)


async def test_a_shutdown_leaves_pending_tasks_alone_so_grpcio_prints_no_cancelled_error() -> None:
    # asyncio.run() would cancel every task still pending at the end, grpcio's RPC tasks included, and
    # grpcio prints a CancelledError traceback for each (the broker stream of a go-plugin Kill()).
    conn = await _launcher("mini-pending").launch()
    await conn.shutdown()
    assert conn.process.status is not None and conn.process.status.code == 0
    assert "pending task cancelled at exit" not in conn.stderr_tail()


async def test_shutdown_with_broker_and_stdio_streams_open_logs_no_traceback() -> None:
    """go-plugin's Kill(): Shutdown, then the connection is closed at once, with the broker stream open."""
    from google.protobuf import empty_pb2

    from vz_core.rpc.pb import (
        grpc_broker_pb2,
        grpc_broker_pb2_grpc,
        grpc_controller_pb2,
        grpc_controller_pb2_grpc,
        grpc_stdio_pb2_grpc,
    )

    for attempt in range(12):
        conn = await _launcher("mini").launch()
        try:
            broker = grpc_broker_pb2_grpc.GRPCBrokerStub(conn.channel).StartStream()  # type: ignore[no-untyped-call]
            await broker.write(grpc_broker_pb2.ConnInfo(service_id=1, network="unix", address="/nowhere"))
            grpc_stdio_pb2_grpc.GRPCStdioStub(conn.channel).StreamStdio(empty_pb2.Empty())  # type: ignore[no-untyped-call]
            if attempt % 3 == 1:
                broker.cancel()
            await grpc_controller_pb2_grpc.GRPCControllerStub(conn.channel).Shutdown(grpc_controller_pb2.Empty())  # type: ignore[no-untyped-call]
            if attempt % 3 != 2:
                await conn.channel.close(grace=None)
            assert await conn.wait_exited(5.0) is not None
        finally:
            await conn.shutdown()
        tail = conn.stderr_tail()
        assert "Traceback" not in tail and "ERROR" not in tail, f"attempt {attempt}:\n{tail}"


def test_grpcio_shutdown_reports_are_dropped_and_other_errors_kept() -> None:
    import logging

    from grpc._cython import cygrpc  # type: ignore[attr-defined]

    from vz_core.rpc._server import _QUIET

    def record(exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord(
            "grpc._cython.cygrpc", logging.ERROR, __file__, 1, "method [%s]", ("/x",), (type(exc), exc, None)
        )

    assert not _QUIET.filter(record(asyncio.CancelledError()))
    assert not _QUIET.filter(record(cygrpc.ExecuteBatchError("Failed execute_batch")))
    assert _QUIET.filter(record(ValueError("a real bug")))


# Unary calls ------------------------------------------------------------------------------------------


async def test_info_and_simple_calls_translate(conn: PluginConnection) -> None:
    stub = _stub(conn)
    info = await stub.Info(pb.InfoRequest(supports_recreate_on_run=True))
    assert (info.api_major, info.api_minor, info.driver_name) == (1, 3, "mini")
    assert info.capabilities.recreate_mode == pb.RECREATE_MODE_ON_RUN
    assert (await stub.Info(pb.InfoRequest())).capabilities.recreate_mode == pb.RECREATE_MODE_DELETE
    assert not (await stub.Find(pb.FindRequest(workspace_id="w"))).found
    assert (await stub.TargetArchitecture(pb.TargetArchitectureRequest(workspace_id="w"))).architecture == "amd64"
    await stub.Preflight(pb.PreflightRequest())


@pytest.mark.parametrize(
    ("rpc", "request_"),
    [
        ("ProvisioningPreflight", pb.ProvisioningPreflightRequest()),
        ("ReusePreflight", pb.ReusePreflightRequest(workspace_id="w", remote_user="dev")),
        ("Logs", pb.LogsRequest(workspace_id="w")),
    ],
)
async def test_calls_the_driver_does_not_advertise_are_unsupported(
    conn: PluginConnection, rpc: str, request_: object
) -> None:
    method = getattr(_stub(conn), rpc)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if rpc == "Logs":
            async for _ in method(request_):
                pass
        else:
            await method(request_)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert _runtime_error(caught.value).code == pb.RUNTIME_ERROR_CODE_UNSUPPORTED


async def test_driver_errors_carry_one_runtime_error_with_secrets_redacted(conn: PluginConnection) -> None:
    request = pb.RunImageRequest(workspace_id="missing", image="i", environment={"TOKEN": "hunter2hunter2"})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _stub(conn).RunImage(request)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    detail = _runtime_error(caught.value)
    assert detail.code == pb.RUNTIME_ERROR_CODE_NOT_FOUND
    assert "no Machine 'missing'" in detail.message and "hunter2hunter2" not in detail.message


async def test_unexpected_exceptions_are_runtime_failures_with_a_generic_message(conn: PluginConnection) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        call = _stub(conn).Exec()
        await call.write(
            pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w", argv=["boom"], environment={"K": "s3cr3t-xyz"}))
        )
        async for _ in call:
            pass
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    detail = _runtime_error(caught.value)
    assert detail.code == pb.RUNTIME_ERROR_CODE_RUNTIME_FAILURE
    assert detail.message == "the driver failed unexpectedly during Exec; see the plugin's log for details"
    assert detail.runtime_message.startswith("ValueError: unexpected failure with")
    assert "s3cr3t-xyz" not in detail.runtime_message and "***" in detail.runtime_message
    # The traceback went to the plugin's log (its stderr, logged line by line); what a host quotes leaves it out.
    assert "a traceback was left out" in conn.stderr_tail() and "Traceback" not in conn.stderr_tail()


async def test_extensions_unimplemented_without_and_served_with(conn: PluginConnection) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await ext_grpc.MachineExtensionsStub(conn.channel).Extensions(ext_pb.ExtensionsRequest())  # type: ignore[no-untyped-call]
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    other = await _launch("mini-ext")
    try:
        reply = await ext_grpc.MachineExtensionsStub(other.channel).Extensions(ext_pb.ExtensionsRequest())  # type: ignore[no-untyped-call]
        assert (list(reply.profiles), reply.accelerator, reply.tty) == (["developer"], "none", False)
    finally:
        await other.shutdown()


# Exec -------------------------------------------------------------------------------------------------


async def _exec(conn: PluginConnection, frames: list[pb.ExecClientMessage], half_close: bool = True) -> list[object]:
    call = _stub(conn).Exec()
    for frame in frames:
        await call.write(frame)
    if half_close:
        await call.done_writing()
    return [msg async for msg in call]


START = pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w", argv=["echo-stdin"]))
START_WAIT = pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w", argv=["wait"]))  # runs past close_stdin
CLOSE = pb.ExecClientMessage(close_stdin=pb.CloseStdin())


def _stdin(data: bytes) -> pb.ExecClientMessage:
    return pb.ExecClientMessage(stdin=data)


async def test_exec_streams_stdin_back_frame_by_frame(conn: PluginConnection) -> None:
    frames = await _exec(conn, [START, _stdin(b"a" * 32768), _stdin(b"bc"), CLOSE])
    kinds = [(m.WhichOneof("payload"), len(m.stdout.data)) for m in frames]  # type: ignore[attr-defined]
    assert kinds == [("stdout", 32768), ("stdout", 2), ("exit", 0)]


async def test_exec_forwards_frames_faithfully_even_when_they_break_the_rules(conn: PluginConnection) -> None:
    start = pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w", argv=["bigframe"]))
    frames = await _exec(conn, [start, CLOSE])
    assert len(frames[0].stdout.data) == 70000  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("frames", "fragment"),
    [
        pytest.param([CLOSE], "first exec frame must be 'start'", id="first-not-start"),
        pytest.param([pb.ExecClientMessage()], "first exec frame must be 'start'", id="first-unset"),
        pytest.param([], "ended before its start frame", id="no-frames"),
        pytest.param([START, START], "a second start frame", id="second-start"),
        pytest.param([START, pb.ExecClientMessage()], "a frame with no payload", id="unset-payload"),
        pytest.param([START, _stdin(b"")], "an empty stdin frame", id="empty-stdin"),
        pytest.param([START, _stdin(b"x" * 32769)], "a stdin frame of 32769 bytes", id="oversized-stdin"),
        pytest.param([START_WAIT, CLOSE, _stdin(b"late")], "a stdin frame after close_stdin", id="data-after-close"),
        pytest.param([START_WAIT, CLOSE, CLOSE], "a close_stdin frame after close_stdin", id="second-close"),
        pytest.param([START, _stdin(b"x")], "ended before close_stdin", id="eof-before-close"),
        pytest.param([pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w"))], "empty argv", id="empty-argv"),
    ],
)
async def test_exec_protocol_violations_are_invalid_argument(
    conn: PluginConnection, frames: list[pb.ExecClientMessage], fragment: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _exec(conn, frames)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    detail = _runtime_error(caught.value)
    assert detail.code == pb.RUNTIME_ERROR_CODE_INVALID_ARGUMENT
    assert fragment in detail.message


async def test_tty_exec_is_unsupported_without_the_extension(conn: PluginConnection) -> None:
    start = pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w", argv=["echo-stdin"], tty=True))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _exec(conn, [start, CLOSE])
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert _runtime_error(caught.value).code == pb.RUNTIME_ERROR_CODE_UNSUPPORTED


async def test_exec_deadline_kills_the_command(conn: PluginConnection) -> None:
    start = pb.ExecClientMessage(
        start=pb.ExecStart(workspace_id="w", argv=["spawn", "sh", "-c", "sleep 300 & echo $!; wait"])
    )
    call = _stub(conn).Exec(timeout=2.0)
    await call.write(start)
    first = await call.read()
    sleep = psutil.Process(int(first.stdout.data.split()[0]))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        while await call.read() is not grpc.aio.EOF:  # type: ignore[attr-defined]
            pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    _, alive = await asyncio.to_thread(psutil.wait_procs, [sleep], 10)
    assert not alive, "the command was killed when the deadline passed"


async def test_a_slow_reader_throttles_the_driver_while_other_calls_are_served(conn: PluginConnection) -> None:
    start = pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w", argv=["spawn", "yes"]))
    call = _stub(conn).Exec()
    await call.write(start)
    first = await call.read()
    assert first.stdout.data
    # We stop reading: flow control must stop `yes` rather than buffer without bound in the plugin.
    plugin = psutil.Process(conn.pid)
    rss = plugin.memory_info().rss
    for _ in range(20):
        assert (await _stub(conn).Info(pb.InfoRequest())).driver_name == "mini"
    await asyncio.sleep(1.0)  # `yes` would write gigabytes per second if nothing held it back
    growth = plugin.memory_info().rss - rss
    assert growth < 32 * 1024 * 1024, f"plugin grew by {growth} bytes under a paused consumer"
    call.cancel()


# Ending an exec safely ------------------------------------------------------------------------------------
# grpcio's asyncio client loses the server's status when one of its writes fails because the call already
# ended (grpc/grpc#36066), so the SDK ends an Exec only once the client stopped writing, and refuses frame-rule
# violations without ever cancelling a write in progress.


@pytest.fixture
async def plain_conn() -> AsyncIterator[PluginConnection]:
    """The mini plugin without TLS, so that tests can open channels with their own HTTP/2 settings."""
    spec = LaunchSpec("mini", [sys.executable, str(TESTDRIVERS), "mini"], plaintext=True)
    c = await PluginLauncher(lambda: spec, name="mini").launch()
    try:
        yield c
    finally:
        await c.shutdown()


async def _status(call: grpc.aio.StreamStreamCall) -> tuple[list[pb.ExecServerMessage], grpc.aio.AioRpcError | None]:  # type: ignore[type-arg]
    frames: list[pb.ExecServerMessage] = []
    try:
        while (msg := await call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
            frames.append(msg)
    except grpc.aio.AioRpcError as err:
        return frames, err
    return frames, None


async def test_a_rule_broken_while_output_waits_for_the_window_is_refused_promptly(
    plain_conn: PluginConnection,
) -> None:
    # A tiny HTTP/2 window keeps the plugin's first output frame pending when the second start arrives: the
    # writer must not be cancelled inside that write (the abort would then fail and the client hang).
    options = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
    plugin = psutil.Process(plain_conn.pid)
    async with grpc.aio.insecure_channel(plain_conn.handshake.target, options=options) as channel:
        stub = pb_grpc.RuntimeDriverStub(channel)  # type: ignore[no-untyped-call]
        for _ in range(5):
            call = stub.Exec(timeout=20)
            await call.write(pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w", argv=["spawn", "yes"])))
            await call.initial_metadata()  # sent with the first output frame, whose data the window holds back
            await call.write(START)
            started = time.monotonic()
            frames, err = await _status(call)
            assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
            assert "a second start frame" in _runtime_error(err).message
            assert time.monotonic() - started < 5.0
            assert all(f.WhichOneof("payload") == "stdout" for f in frames)
            assert plugin.children() == [], "the refused command was killed before the status was sent"


async def test_exec_on_a_missing_machine_is_not_found_after_the_client_finished_sending(conn: PluginConnection) -> None:
    stub = _stub(conn)
    start = pb.ExecClientMessage(start=pb.ExecStart(workspace_id="missing", argv=["echo-stdin"]))
    for _ in range(50):
        call = stub.Exec(timeout=20)
        await call.write(start)
        for _ in range(8):
            await call.write(_stdin(b"d" * 32768))
        await call.write(CLOSE)
        await call.done_writing()
        frames, err = await _status(call)
        assert frames == []
        assert err is not None and err.code() == grpc.StatusCode.NOT_FOUND, err
        assert _runtime_error(err).code == pb.RUNTIME_ERROR_CODE_NOT_FOUND
        assert ("vz-exec-stop-input", "1") in tuple(await call.initial_metadata())


async def test_an_early_exit_drains_the_clients_stdin_and_ends_ok(conn: PluginConnection) -> None:
    stub = _stub(conn)
    start = pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w", argv=["exit-now"]))
    block = _stdin(b"e" * 32768)
    for _ in range(10):
        call = stub.Exec(timeout=20)
        await call.write(start)
        for _ in range(128):  # 4 MiB the command never reads, sent after it exited
            await call.write(block)
        await call.done_writing()  # no close_stdin: a late half-close is not an error after the exit
        frames, err = await _status(call)
        assert err is None
        assert [f.WhichOneof("payload") for f in frames] == ["exit"]
        assert await call.code() == grpc.StatusCode.OK


async def test_after_the_exit_a_client_that_never_half_closes_is_given_up_on(tmp_path: Path) -> None:
    from testdrivers import MiniDriver

    from vz_core.redact import Redactor
    from vz_core.rpc import RuntimeServicer

    server = grpc.aio.server()
    pb_grpc.add_RuntimeDriverServicer_to_server(  # type: ignore[no-untyped-call]
        RuntimeServicer(MiniDriver(), Redactor(), exec_drain_timeout=0.5), server
    )
    address = f"unix:{tmp_path / 's.sock'}"
    server.add_insecure_port(address)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            call = pb_grpc.RuntimeDriverStub(channel).Exec(timeout=20)  # type: ignore[no-untyped-call]
            await call.write(pb.ExecClientMessage(start=pb.ExecStart(workspace_id="w", argv=["exit-now"])))
            started = time.monotonic()
            frames, err = await _status(call)  # the client keeps its side open
            assert err is None and [f.WhichOneof("payload") for f in frames] == ["exit"]
            assert 0.4 < time.monotonic() - started < 10.0
    finally:
        await server.stop(None)


async def test_grpcio_turns_a_read_after_a_cancelled_read_into_a_false_eof(tmp_path: Path) -> None:
    """Why the SDK never cancels a pending ``context.read()`` while the call may still be read from.

    A cancelled read stays pending in Core; the next read is refused (too many operations) and grpcio reports
    that as the end of the stream although the client is still sending. If grpcio changes this, the reader in
    ``vz_core.rpc._server_exec`` could be simplified.
    """
    seen: list[object] = []
    cancelled, written = asyncio.Event(), asyncio.Event()

    async def handler(request_iterator: object, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
        pending = asyncio.ensure_future(context.read())
        await asyncio.sleep(0)  # let the read start
        pending.cancel()
        cancelled.set()
        seen.append(await context.read())
        await written.wait()

    generic = grpc.method_handlers_generic_handler("t.T", {"S": grpc.stream_stream_rpc_method_handler(handler)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((generic,))
    address = f"unix:{tmp_path / 't.sock'}"
    server.add_insecure_port(address)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.stream_stream("/t.T/S")(timeout=20)
            await cancelled.wait()
            await call.write(b"frame")  # the client is still sending...
            written.set()
            assert await call.code() == grpc.StatusCode.OK
        assert seen == [grpc.aio.EOF], "...but the server's second read saw the end of the stream"  # type: ignore[attr-defined]
    finally:
        await server.stop(None)
