"""#18 item 6: every buffer a plugin (or a host) can fill is bounded, in size and in time.

stderr without newlines (it used to cost quadratic time: 200 MB hung), the handshake line, the Info reply,
any gRPC message (2 GiB before), and exec start frames over 1 MiB (a misleading "connection reset" before).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import grpc
import grpc.aio
import pytest

from vz_core import ExecExit, ExecOutput, ExecSpec
from vz_core.errors import InvalidArgumentError, PluginError, RuntimeFailureError
from vz_core.redact import Redactor
from vz_core.rpc import (
    CHANNEL_OPTIONS,
    MAX_EXEC_START,
    MAX_INFO,
    MAX_MESSAGE,
    RemoteDriver,
    add_servicers,
    connect_in_process,
    runtime_errors_in,
    serve_in_process,
)
from vz_core.rpc.pb import runtime_pb2 as pb
from vz_core.rpc.pb import runtime_pb2_grpc as pb_grpc
from vz_core.transport import LaunchSpec, PluginLauncher

TESTDRIVERS = Path(__file__).resolve().parents[1] / "vz_plugins" / "testdrivers.py"
_HUGE = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]


def _testdrivers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vz_security_testdrivers", TESTDRIVERS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A host process: launches the ``flood`` plugin (N bytes of stderr without a newline before its handshake),
# makes one call and reports how long it took and its peak memory.
HOST = textwrap.dedent(
    """
    import asyncio, json, resource, sys, time
    from vz_core.rpc import RemoteDriver
    from vz_core.transport import LaunchSpec, PluginLauncher

    async def main():
        spec = LaunchSpec("flood", [sys.executable, sys.argv[1], "flood"], env={"VZ_TEST_FLOOD_BYTES": sys.argv[2]})
        driver = RemoteDriver(PluginLauncher(lambda: spec, name="flood", handshake_timeout=60.0))
        started = time.monotonic()
        try:
            found = await driver.find("w")
            tail = driver.connection.stderr_tail()
        finally:
            await driver.close()
        print(json.dumps({
            "seconds": time.monotonic() - started,
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "found": found,
            "tail": len(tail),
        }))

    asyncio.run(main())
    """
)


def _flood_host(tmp_path: Path, size: int) -> dict[str, float]:
    script = tmp_path / "host.py"
    script.write_text(HOST)
    done = subprocess.run(
        [sys.executable, str(script), str(TESTDRIVERS), str(size)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_200_mb_stderr_flood_without_newlines_takes_seconds_and_bounded_memory(tmp_path: Path) -> None:
    baseline = _flood_host(tmp_path, 0)
    flood = _flood_host(tmp_path, 200 * 1024 * 1024)
    assert flood["found"] is None
    assert flood["seconds"] < 20.0, flood
    assert flood["maxrss_kib"] - baseline["maxrss_kib"] < 48 * 1024, (baseline, flood)
    assert 0 < flood["tail"] <= 4000, "the diagnostics tail stays bounded"


async def test_an_over_long_handshake_line_is_refused_quickly() -> None:
    code = "import os\nblock = b'1|1|unix|' + b'x' * 65536\nfor _ in range(800):\n    os.write(1, block)\n"
    spec = LaunchSpec("longline", [sys.executable, "-c", code])
    launcher = PluginLauncher(lambda: spec, name="longline", handshake_timeout=30.0)
    started = time.monotonic()
    with pytest.raises(PluginError, match="over-long line"):
        await launcher.launch()
    assert time.monotonic() - started < 10.0


async def test_a_huge_info_reply_is_refused() -> None:
    spec = LaunchSpec(
        "big-info",
        [sys.executable, str(TESTDRIVERS), "big-info"],
        env={"VZ_TEST_INFO_BYTES": str(100 * 1024 * 1024)},
    )
    driver = RemoteDriver(PluginLauncher(lambda: spec, name="big-info"), name="big-info")
    try:
        with pytest.raises(RuntimeFailureError, match="size limit"):
            await driver.find("w")
    finally:
        await driver.close()


async def test_an_info_reply_under_the_message_limit_but_over_the_info_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VZ_TEST_INFO_BYTES", str(MAX_INFO + 1))
    async with connect_in_process(_testdrivers().BigInfoDriver()) as remote:
        with pytest.raises(RuntimeFailureError, match=f"over the limit of {MAX_INFO} bytes"):
            await remote.find("w")


async def test_the_host_refuses_a_reply_over_the_message_limit_from_a_peer_without_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server that would send anything (Go peers raise their limits to max int32).
    monkeypatch.setenv("VZ_TEST_INFO_BYTES", str(MAX_MESSAGE + 1024))
    directory = tempfile.mkdtemp(prefix="vz-sec-")
    server = grpc.aio.server(options=_HUGE)
    add_servicers(server, _testdrivers().BigInfoDriver(), Redactor())
    try:
        server.add_insecure_port(f"unix:{directory}/s.sock")
        await server.start()
        async with grpc.aio.insecure_channel(f"unix:{directory}/s.sock", options=CHANNEL_OPTIONS) as channel:
            remote = RemoteDriver(channel=channel, name="big")
            with pytest.raises(RuntimeFailureError, match="size limit") as caught:
                await remote.find("w")
            assert caught.value.details["rpc"] == "Info"
    finally:
        await server.stop(None)
        shutil.rmtree(directory, ignore_errors=True)


async def test_the_plugin_server_refuses_a_request_over_the_message_limit() -> None:
    async with serve_in_process(_testdrivers().MiniDriver(), channel_options=_HUGE) as channel:
        stub = pb_grpc.RuntimeDriverStub(channel)  # type: ignore[no-untyped-call]
        request = pb.RunImageRequest(workspace_id="w", image="i", environment={"BIG": "x" * (MAX_MESSAGE + 1)})
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.RunImage(request, timeout=30)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for offset in range(0, len(data), size):
        yield data[offset : offset + size]


async def test_exec_requests_over_1_mib_fail_clearly_on_both_sides_and_big_streams_still_work() -> None:
    big = ExecSpec("w", ("echo-stdin",), environment={"BIG": "x" * MAX_EXEC_START})
    async with serve_in_process(_testdrivers().MiniDriver()) as channel:
        remote = RemoteDriver(channel=channel, name="mini")
        # the client refuses it before any call
        with pytest.raises(InvalidArgumentError, match=f"over the limit of {MAX_EXEC_START} bytes"):
            await remote.exec(big, _chunks(b"", 1)).__anext__()

        # the server refuses it too (a foreign host), with INVALID_ARGUMENT and one RuntimeError detail
        stub = pb_grpc.RuntimeDriverStub(channel)  # type: ignore[no-untyped-call]
        start = pb.ExecStart(workspace_id="w", argv=["echo-stdin"], environment={"BIG": "x" * MAX_EXEC_START})

        async def frames() -> AsyncIterator[pb.ExecClientMessage]:
            yield pb.ExecClientMessage(start=start)
            yield pb.ExecClientMessage(close_stdin=pb.CloseStdin())

        call = stub.Exec(frames(), timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = runtime_errors_in(caught.value)
        assert len(details) == 1 and str(MAX_EXEC_START) in details[0].message

        # 4 MiB of stdin in 32 KiB frames still goes through byte for byte
        data = os.urandom(4 * 1024 * 1024)
        out = bytearray()
        code = None
        async for event in remote.exec(ExecSpec("w", ("echo-stdin",)), _chunks(data, 1 << 20)):
            if isinstance(event, ExecOutput):
                out += event.data
            elif isinstance(event, ExecExit):
                code = event.exit_code
        assert code == 0 and bytes(out) == data
