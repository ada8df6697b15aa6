"""RemoteDriver: the same Driver contract over a real plugin process."""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from vz_conformance.fake import FakeDriver

from vz_core import (
    Capabilities,
    Driver,
    DriverInfo,
    ExecExit,
    ExecOutput,
    ExecSpec,
    MountType,
    RecreateMode,
    RunImageRequest,
)
from vz_core.drivers import launcher_for
from vz_core.errors import (
    AlreadyExistsError,
    IncompatibleVersionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
)
from vz_core.rpc import DRAIN_TIMEOUT, Mode, RemoteDriver, error_to_status, info_to_pb
from vz_core.rpc.pb import runtime_pb2 as pb
from vz_core.rpc.pb import runtime_pb2_grpc as pb_grpc
from vz_core.transport import LaunchSpec, PluginLauncher

TESTDRIVERS = Path(__file__).resolve().parents[1] / "vz_plugins" / "testdrivers.py"


class Counting:
    """A prepare callable that counts launches."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.launches = 0

    def __call__(self) -> LaunchSpec:
        self.launches += 1
        return LaunchSpec(self.kind, [sys.executable, str(TESTDRIVERS), self.kind])


def mini(kind: str = "mini", mode: Mode = "warm", **kwargs: object) -> tuple[RemoteDriver, Counting]:
    prepare = Counting(kind)
    return RemoteDriver(PluginLauncher(prepare, name=kind), mode=mode, **kwargs), prepare  # type: ignore[arg-type]


async def _stdin(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _run(driver: Driver, spec: ExecSpec, *chunks: bytes) -> tuple[bytes, bytes, ExecExit, list[int]]:
    out, err, sizes = b"", b"", []
    exit_event: ExecExit | None = None
    async for event in driver.exec(spec, _stdin(*chunks)):
        if isinstance(event, ExecOutput):
            sizes.append(len(event.data))
            if event.stream == "stdout":
                out += event.data
            else:
                err += event.data
        else:
            exit_event = event
    assert exit_event is not None
    return out, err, exit_event, sizes


# The same behaviour in-process and out of process -------------------------------------------------------


@pytest.fixture(params=["in-process", "plugin"])
async def fake(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Driver]:
    driver: Driver
    if request.param == "in-process":
        driver = FakeDriver(tmp_path / "state")
    else:
        driver = RemoteDriver(launcher_for("fake", options={"state_dir": str(tmp_path / "state")}), name="fake")
    try:
        yield driver
    finally:
        await driver.close()


async def test_lifecycle_and_exec_are_the_same_either_way(fake: Driver) -> None:
    request = RunImageRequest("ws/1 ü", "img", environment={"SECRET": "opensesame"})
    assert await fake.find("ws/1 ü") is None
    await fake.run_image(request)
    found = await fake.find("ws/1 ü")
    assert found is not None and found.state.status == "running"
    with pytest.raises(AlreadyExistsError):
        await fake.run_image(request)
    data = bytes(range(256)) * 4096  # 1 MiB through `cat`, fed as one chunk
    out, err, exit_event, sizes = await _run(fake, ExecSpec("ws/1 ü", ("cat",)), data)
    assert hashlib.sha256(out).digest() == hashlib.sha256(data).digest() and not err
    assert exit_event.success and max(sizes) <= 32768
    _, _, failed, _ = await _run(fake, ExecSpec("ws/1 ü", ("sh", "-c", "exit 7")))
    assert failed == ExecExit(7)
    await fake.stop("ws/1 ü")
    await fake.stop("ws/1 ü")
    stopped = await fake.find("ws/1 ü")
    assert stopped is not None and stopped.state.status == "stopped"
    await fake.delete("ws/1 ü")
    await fake.delete("ws/1 ü")
    assert await fake.find("ws/1 ü") is None
    with pytest.raises(NotFoundError):
        await fake.start("ws/1 ü")
    assert await fake.target_architecture("ws/1 ü") in ("amd64", "arm64")


# Negotiation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "field"),
    [
        ("incompatible-version", "api_major"),
        ("malformed-info", "driver_name"),
        ("unknown-enum-info", "capabilities.mount_types"),
    ],
)
async def test_unusable_info_is_refused_before_any_other_call(tmp_path: Path, fault: str, field: str) -> None:
    options = {"state_dir": str(tmp_path), "faults": [fault]}
    driver = RemoteDriver(launcher_for("fake", options=options), name="fake")
    try:
        with pytest.raises(IncompatibleVersionError) as caught:
            await driver.find("w")
        assert caught.value.details["field"] == field
        assert driver.connection is None, "an unusable plugin is shut down"
    finally:
        await driver.close()


async def test_recreate_on_run_is_negotiated_and_never_granted_implicitly() -> None:
    driver, _ = mini()
    try:
        negotiated = await driver.info(supports_recreate_on_run=True)
        assert negotiated.capabilities is not None and negotiated.capabilities.recreate_mode == RecreateMode.ON_RUN
        plain = await driver.info()
        assert plain.capabilities is not None and plain.capabilities.recreate_mode == RecreateMode.DELETE
    finally:
        await driver.close()


async def test_calls_not_advertised_are_refused_locally_without_a_launch() -> None:
    driver, prepare = mini(mode="per_operation")
    try:
        await driver.info()
        assert prepare.launches == 1
        with pytest.raises(UnsupportedError, match="does not advertise Logs"):
            async for _ in driver.logs("w"):
                pass
        with pytest.raises(UnsupportedError, match="ProvisioningPreflight"):
            await driver.provisioning_preflight()
        with pytest.raises(UnsupportedError, match="ReusePreflight"):
            await driver.reuse_preflight("w", "dev")
        assert prepare.launches == 1, "no launch, no RPC for a capability that is not advertised"
    finally:
        await driver.close()


async def test_extensions_none_when_unimplemented_and_values_when_served() -> None:
    plain, _ = mini()
    ext, _ = mini("mini-ext")
    try:
        assert await plain.extensions() is None
        got = await ext.extensions()
        assert got is not None and got.profiles == ("developer",) and got.accelerator == "none"
    finally:
        await plain.close()
        await ext.close()


# Exec ------------------------------------------------------------------------------------------------


async def test_stdin_is_cut_into_frames_of_at_most_32_kib_until_the_plugin_agrees_on_wide_frames() -> None:
    driver, _ = mini()
    seen = asyncio.Event()

    async def stdin() -> AsyncIterator[bytes]:
        yield b"a" * 100000
        await seen.wait()  # the plugin's first output frame carried its agreement (WIDE_CHUNK_KEY)
        await asyncio.sleep(0.1)
        yield b"b" * 100000
        yield b"c"

    try:
        out = b""
        events = driver.exec(ExecSpec("w", ("stdin-sizes",)), stdin())
        async for event in events:
            if isinstance(event, ExecOutput):
                out += event.data
                seen.set()
            else:
                assert event == ExecExit(0)
        # the sizes of the stdin frames the plugin received, one a line
        assert out.split() == [b"32768", b"32768", b"32768", b"1696", b"100000", b"1"]
    finally:
        await driver.close()


async def test_a_failing_stdin_iterator_cancels_the_exec_and_is_reported() -> None:
    driver, _ = mini()

    async def broken() -> AsyncIterator[bytes]:
        yield b"first"
        raise OSError("the input file went away")

    try:
        events = driver.exec(ExecSpec("w", ("echo-stdin",)), broken())
        with pytest.raises(OSError, match="the input file went away"):
            async for _ in events:
                pass
        assert (await driver.info()).driver_name == "mini"  # the plugin keeps serving
    finally:
        await driver.close()


async def test_frames_reach_the_caller_as_sent() -> None:
    driver, _ = mini(wide_frames=False)
    wide, _ = mini()
    try:
        _, _, _, sizes = await _run(driver, ExecSpec("w", ("bigframe",)))
        assert sizes == [70000], "the client does not repair frames: the conformance suite must see them"
        # Under a wide-frame agreement the driver may send 70000 bytes at once; exec cuts it to the contract's size.
        _, _, _, sizes = await _run(wide, ExecSpec("w", ("bigframe",)))
        assert sizes == [32768, 32768, 70000 - 65536]
    finally:
        await driver.close()
        await wide.close()


async def test_a_plugin_crash_mid_exec_is_unavailable_with_its_redacted_stderr() -> None:
    driver, prepare = mini()
    try:
        first_pid = await _first_pid(driver)
        spec = ExecSpec("w", ("crash",), environment={"API_TOKEN": "tok-123456789"})
        with pytest.raises(UnavailableError) as caught:
            await _run(driver, spec)
        err = caught.value
        assert err.retryable and err.code == "UNAVAILABLE"
        assert "the plugin process died during Exec (exit code 3)" in err.message
        assert "about to crash; the environment holds ***" in err.runtime_message
        assert "tok-123456789" not in err.runtime_message + err.message
        # The next call relaunches.
        assert await _first_pid(driver) != first_pid
        assert prepare.launches == 2
    finally:
        await driver.close()


async def _first_pid(driver: RemoteDriver) -> int:
    await driver.info()
    assert driver.connection is not None
    return driver.connection.pid


async def test_plugin_crash_during_negotiation_is_unavailable(tmp_path: Path) -> None:
    options = {"state_dir": str(tmp_path), "faults": ["crash-during-info"]}
    driver = RemoteDriver(launcher_for("fake", options=options), name="fake")
    try:
        with pytest.raises(UnavailableError, match="died during Info"):
            await driver.preflight()
    finally:
        await driver.close()


async def test_driver_errors_keep_their_category_and_lose_secrets() -> None:
    driver, _ = mini()
    try:
        with pytest.raises(NotFoundError) as caught:
            await driver.run_image(RunImageRequest("missing", "img", environment={"PW": "pa55word-xyz"}))
        assert "pa55word-xyz" not in str(caught.value)
    finally:
        await driver.close()


# Ending an exec: the caller always gets the plugin's real outcome ---------------------------------------
# grpcio's asyncio client replaces the server's status with INTERNAL when one of its writes fails because the
# call already ended (grpc/grpc#36066). The plugin SDK ends an Exec only once the client stopped sending; the
# client stops at the exit frame, at the end of the call, or when the plugin's headers ask it to.

BIG = 12 << 20


async def _endless(block: bytes = b"s" * 32768, limit: int | None = None) -> AsyncIterator[bytes]:
    sent = 0
    while limit is None or sent < limit:
        sent += len(block)
        yield block


@pytest.fixture
async def fake_plugin(tmp_path: Path) -> AsyncIterator[RemoteDriver]:
    driver = RemoteDriver(launcher_for("fake", options={"state_dir": str(tmp_path / "state")}), name="fake")
    try:
        yield driver
    finally:
        await driver.close()


async def test_a_command_exiting_while_stdin_streams_succeeds_every_time(fake_plugin: RemoteDriver) -> None:
    await fake_plugin.run_image(RunImageRequest("early", "img"))
    for attempt in range(50):
        exits = [e async for e in fake_plugin.exec(ExecSpec("early", ("true",)), _endless(limit=BIG))]
        assert exits == [ExecExit(0)], f"attempt {attempt}"


async def test_exec_on_a_missing_machine_is_not_found_every_time(fake_plugin: RemoteDriver) -> None:
    for attempt in range(50):
        with pytest.raises(NotFoundError) as caught:
            async for _ in fake_plugin.exec(ExecSpec("absent", ("cat",)), _endless(limit=1 << 20)):
                pass
        assert "grpc_code" not in caught.value.details, f"attempt {attempt}: the status lost its RuntimeError"
    assert await fake_plugin.find("absent") is None


async def test_a_refused_exec_stops_an_endless_stdin_at_once() -> None:
    driver, _ = mini()
    pulled = 0

    async def counting() -> AsyncIterator[bytes]:
        nonlocal pulled
        async for block in _endless():
            pulled += 1
            yield block

    try:
        started = time.monotonic()
        with pytest.raises(NotFoundError):
            async for _ in driver.exec(ExecSpec("missing", ("echo-stdin",)), counting()):
                pass
        assert time.monotonic() - started < DRAIN_TIMEOUT / 2, "the plugin's headers stopped the input"
        assert pulled < 10000
        with pytest.raises(UnsupportedError, match="tty"):
            async for _ in driver.exec(ExecSpec("w", ("echo-stdin",), tty=True), _endless(limit=BIG)):
                pass
    finally:
        await driver.close()


async def test_the_exit_ends_an_exec_whose_stdin_never_ends() -> None:
    driver, _ = mini()
    forever = asyncio.Event()

    async def interactive() -> AsyncIterator[bytes]:
        yield b"typed"
        await forever.wait()  # a terminal nobody types into
        yield b"never"

    try:
        events = [e async for e in driver.exec(ExecSpec("w", ("exit-now",)), interactive())]
        assert events == [ExecExit(0)]
        assert (await driver.info()).driver_name == "mini"
    finally:
        await driver.close()


async def test_an_empty_argv_is_refused_before_any_launch() -> None:
    driver, prepare = mini()
    try:
        with pytest.raises(InvalidArgumentError, match="non-empty argv"):
            async for _ in driver.exec(ExecSpec("w", ()), _stdin()):
                pass
        assert prepare.launches == 0
    finally:
        await driver.close()


class _EagerServicer(pb_grpc.RuntimeDriverServicer):
    """A server that ends Exec without waiting for the client's half-close (as go-plugin plugins do)."""

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.InfoResponse:
        caps = Capabilities(mount_types=(MountType.BIND,), recreate_mode=RecreateMode.DELETE)
        return info_to_pb(DriverInfo("eager", "0.1", "eager-runtime", capabilities=caps))

    async def Exec(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        first = await context.read()
        if first.start.workspace_id == "missing":
            status = error_to_status(NotFoundError("no Machine 'missing'"))
            await context.abort(status.code, status.details, status.trailing_metadata)
        await context.write(pb.ExecServerMessage(stdout=pb.OutputChunk(data=b"bye")))
        await context.write(pb.ExecServerMessage(exit=pb.ExecExit(exit_code=3)))


async def test_the_servers_outcome_survives_a_server_that_does_not_wait_for_the_half_close(tmp_path: Path) -> None:
    # The client's writes then fail after the server ended the call, and grpcio makes up an INTERNAL status
    # (grpc/grpc#36066): the client must still report the frames and the status the server sent.
    server = grpc.aio.server()
    pb_grpc.add_RuntimeDriverServicer_to_server(_EagerServicer(), server)  # type: ignore[no-untyped-call]
    address = f"unix:{tmp_path / 'eager.sock'}"
    server.add_insecure_port(address)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            driver = RemoteDriver(channel=channel, name="eager")
            for attempt in range(50):
                out, _, exit_event, _ = await _run(driver, ExecSpec("w", ("x",)), *([b"i" * 32768] * 64))
                assert (out, exit_event) == (b"bye", ExecExit(3)), f"attempt {attempt}"
                with pytest.raises(NotFoundError, match="no Machine 'missing'"):
                    await _run(driver, ExecSpec("missing", ("x",)), *([b"i" * 32768] * 64))
    finally:
        await server.stop(None)


async def test_a_paused_caller_and_a_command_that_reads_nothing_keep_memory_bounded() -> None:
    driver, _ = mini()
    pulled = 0

    async def endless_counted() -> AsyncIterator[bytes]:
        nonlocal pulled
        async for block in _endless():
            pulled += len(block)
            yield block

    try:
        # Output: the caller stops pulling events while `yes` writes as fast as it can.
        output = driver.exec(ExecSpec("w", ("spawn", "yes")), _stdin())
        assert isinstance(await output.__anext__(), ExecOutput)
        assert driver.connection is not None
        plugin, host = psutil.Process(driver.connection.pid), psutil.Process()
        before = plugin.memory_info().rss, host.memory_info().rss
        # Input: a command that never reads stdin while the caller offers endless input.
        ignored = driver.exec(ExecSpec("w", ("wait",)), endless_counted())
        assert isinstance(await ignored.__anext__(), ExecOutput)
        await asyncio.sleep(1.0)  # both producers would move gigabytes in a second if nothing held them back
        grown = plugin.memory_info().rss - before[0], host.memory_info().rss - before[1]
        assert grown[0] < 32 << 20 and grown[1] < 32 << 20, f"grew by {grown} bytes (plugin, host)"
        assert pulled < 32 << 20, f"{pulled} bytes of stdin taken for a command that reads none"
        await output.aclose()  # type: ignore[attr-defined]
        await ignored.aclose()  # type: ignore[attr-defined]
        assert (await driver.info()).driver_name == "mini"
    finally:
        await driver.close()


# Connection lifecycle ----------------------------------------------------------------------------------


async def test_warm_mode_reuses_one_plugin_until_idle() -> None:
    driver, prepare = mini(idle_timeout=0.3)
    try:
        await driver.find("a")
        conn = driver.connection
        assert conn is not None
        await driver.find("b")
        await driver.target_architecture("c")
        assert driver.connection is conn and prepare.launches == 1
        status = await conn.wait_exited(10.0)  # the idle timer shuts it down
        assert status is not None and status.code == 0
        await driver.find("d")
        assert prepare.launches == 2 and driver.connection is not conn
    finally:
        await driver.close()


async def test_per_operation_mode_launches_and_stops_a_plugin_per_call() -> None:
    driver, prepare = mini(mode="per_operation")
    pids: list[int] = []
    original: Callable[[], object] = driver._launcher.launch  # type: ignore[union-attr]

    async def tracking() -> object:
        conn = await original()  # type: ignore[misc]
        pids.append(conn.pid)  # type: ignore[attr-defined]
        return conn

    driver._launcher.launch = tracking  # type: ignore[method-assign,union-attr]
    try:
        await driver.find("a")
        await driver.preflight()
        _, _, exit_event, _ = await _run(driver, ExecSpec("w", ("echo-stdin",)), b"x")
        assert exit_event.success
    finally:
        await driver.close()
    assert prepare.launches == 3 and len(set(pids)) == 3
    assert not any(psutil.pid_exists(pid) for pid in pids)


async def test_a_ready_channel_can_be_driven_directly() -> None:
    conn = await PluginLauncher(Counting("mini"), name="mini").launch()
    try:
        driver = RemoteDriver(channel=conn.channel, name="mini")
        assert (await driver.info()).driver_name == "mini"
        assert await driver.find("w") is None
        await driver.close()
        assert conn.alive, "the caller owns a channel it passed in"
    finally:
        await conn.shutdown()


# The public surface of vz_core.rpc ---------------------------------------------------------------------


def test_every_public_name_of_vz_core_rpc_resolves() -> None:
    import vz_core.rpc as rpc

    for name in rpc.__all__:
        assert getattr(rpc, name) is not None, name
    with pytest.raises(AttributeError):
        rpc.no_such_name  # noqa: B018


async def test_the_in_process_pair_is_a_remote_driver_over_a_real_server(tmp_path: Path) -> None:
    from vz_core.rpc import connect_in_process

    async with connect_in_process(FakeDriver(tmp_path / "state"), name="fake") as remote:
        assert isinstance(remote, RemoteDriver)
        assert (await remote.info()).driver_name == "fake"
        assert await remote.find("w") is None
        with pytest.raises(NotFoundError):
            await remote.start("w")  # a status with its RuntimeError detail, translated back
    assert remote.known_info is not None
