"""Every fault mode of the fake driver has exactly the observable effect it documents.

Each check runs the scenario the mode breaks with the mode on (and, where it is cheap, with it off) and
asserts the broken behaviour. ``test_every_fault_mode_is_checked`` keeps this table complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from fake_network_testlib import domain as network_domain
from fake_network_testlib import labelled
from fake_network_testlib import machine as network_machine
from fake_testlib import (
    alive,
    counted,
    counter_request,
    feed,
    identity,
    logs_of,
    read_counter,
    request,
    run_exec,
    tree_with_marker,
    unique_id,
    wait_dead,
    wait_logs,
)
from vz_conformance.fake import FAULT_DESCRIPTIONS, FAULT_MODES, FakeDriver
from vz_conformance.fake._faults import PLUGIN_FAULTS

from vz_core import (
    MAX_CHUNK,
    ExecExit,
    ExecOutput,
    ExecSpec,
    Mount,
    MountType,
    RecreateMode,
    TerminalData,
    TerminalEof,
    TerminalInput,
    TerminalOutput,
    TerminalResize,
    TerminalSpec,
)
from vz_core.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    RuntimeFailureError,
    UnsupportedError,
)
from vz_core.rpc import capabilities_to_pb
from vz_core.services import HealthCheck, ServiceSpec, ServiceState

Check = Callable[[Path], Awaitable[None]]
CHECKS: dict[str, Check] = {}


def check(fault: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        assert fault not in CHECKS
        CHECKS[fault] = fn
        return fn

    return register


def faulty(tmp_path: Path, fault: str) -> FakeDriver:
    return FakeDriver(tmp_path / "faulty", faults=[fault])


def clean(tmp_path: Path) -> FakeDriver:
    return FakeDriver(tmp_path / "clean")


def _python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _plugin(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "vz_conformance.fake.plugin", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _launch_plugin(*args: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "vz_conformance.fake.plugin", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# Plugin process ----------------------------------------------------------------------------------------------

# Stands in for the plugin SDK: prints a handshake line, then calls on_serving like vz_plugins.serve does.
STUB_SERVE = """
import sys, vz_plugins._declared
from vz_core import Driver
def serve(driver, *, on_serving=None, **options):
    print("1|1|unix|/nonexistent/plugin.sock|grpc|", flush=True)
    driver = driver if isinstance(driver, Driver) else driver()  # a factory is built after the handshake
    print("serving", type(driver).__name__, str(driver.state_dir), sorted(driver.faults), file=sys.stderr, flush=True)
    if on_serving is not None:
        on_serving()
    sys.exit(0)
vz_plugins._declared.serve = serve
from vz_conformance.fake.plugin import main
main(sys.argv[1:])
"""


@check("crash-before-handshake")
async def _crash_before_handshake(tmp_path: Path) -> None:
    out = _plugin("--fault", "crash-before-handshake")
    assert out.returncode == 3
    assert out.stdout == ""
    assert "crash-before-handshake" in out.stderr and out.stderr.count("\n") == 1


@check("crash-after-handshake")
async def _crash_after_handshake(tmp_path: Path) -> None:
    crashed = _python(STUB_SERVE, "--state-dir", str(tmp_path), "--fault", "crash-after-handshake")
    assert crashed.returncode == 3, crashed.stderr
    assert crashed.stdout == "1|1|unix|/nonexistent/plugin.sock|grpc|\n"
    served = _python(STUB_SERVE, "--state-dir", str(tmp_path), "--fault", "exec-empty-chunk")
    assert served.returncode == 0, served.stderr
    assert f"serving FakeDriver {tmp_path} ['exec-empty-chunk']" in served.stderr


@check("never-handshake")
async def _never_handshake(tmp_path: Path) -> None:
    proc = _launch_plugin("--fault", "never-handshake")
    try:
        assert proc.stderr is not None
        line = await asyncio.to_thread(proc.stderr.readline)  # printed right before it starts waiting
        assert b"never-handshake" in line
        assert proc.poll() is None
    finally:
        proc.kill()
        stdout, _ = proc.communicate(timeout=30)
    assert stdout == b""
    assert proc.returncode == -signal.SIGKILL


# Info / discovery --------------------------------------------------------------------------------------------


@check("crash-during-info")
async def _crash_during_info(tmp_path: Path) -> None:
    code = (
        "import asyncio, sys\n"
        "from vz_conformance.fake import FakeDriver\n"
        "driver = FakeDriver(sys.argv[1], faults=['crash-during-info'])\n"
        "print('calling info', flush=True)\n"
        "asyncio.run(driver.info())\n"
        "print('survived')\n"
    )
    out = _python(code, str(tmp_path))
    assert out.returncode == 3
    assert out.stdout == "calling info\n"


@check("incompatible-version")
async def _incompatible_version(tmp_path: Path) -> None:
    assert (await faulty(tmp_path, "incompatible-version").info()).api_major == 2
    assert (await clean(tmp_path).info()).api_major == 1


@check("malformed-info")
async def _malformed_info(tmp_path: Path) -> None:
    info = await faulty(tmp_path, "malformed-info").info()
    assert info.driver_name == ""
    assert info.driver_version and info.runtime_name


@check("unknown-enum-info")
async def _unknown_enum_info(tmp_path: Path) -> None:
    info = await faulty(tmp_path, "unknown-enum-info").info(supports_recreate_on_run=True)
    assert info.capabilities is not None
    assert info.capabilities.mount_types == (99,)
    assert info.capabilities.recreate_mode == RecreateMode.ON_RUN
    # The raw value reaches the wire unchanged.
    assert list(capabilities_to_pb(info.capabilities).mount_types) == [99]


@check("failing-preflight")
async def _failing_preflight(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailureError, match="failing-preflight"):
        await faulty(tmp_path, "failing-preflight").preflight()
    await faulty(tmp_path, "failing-preflight").provisioning_preflight()


# Lifecycle ---------------------------------------------------------------------------------------------------


@check("failing-run")
async def _failing_run(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "failing-run"), unique_id()
    with pytest.raises(RuntimeFailureError):
        await driver.run_image(request(ws))
    assert await driver.find(ws) is None
    with pytest.raises(InvalidArgumentError):  # validation still comes first
        await driver.run_image(request(ws, image="invalid/x"))


@check("stop-not-idempotent")
async def _stop_not_idempotent(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "stop-not-idempotent"), unique_id()
    await driver.run_image(request(ws))
    await driver.stop(ws)
    with pytest.raises(FailedPreconditionError):
        await driver.stop(ws)
    await driver.start(ws)
    await driver.start(ws)


@check("delete-not-idempotent")
async def _delete_not_idempotent(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "delete-not-idempotent"), unique_id()
    await driver.run_image(request(ws))
    await driver.delete(ws)
    with pytest.raises(NotFoundError):
        await driver.delete(ws)


@check("missing-not-found")
async def _missing_not_found(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "missing-not-found"), unique_id()
    await driver.start(ws)
    await driver.stop(ws)
    assert await driver.find(ws) is None
    with pytest.raises(NotFoundError):
        await run_exec(driver, ws, ["true"])


@check("runimage-overwrites")
async def _runimage_overwrites(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "runimage-overwrites"), unique_id()
    await driver.run_image(request(ws, labels=("gen=1",)))
    first = await driver.find(ws)
    await driver.run_image(request(ws, labels=("gen=2",)))
    second = await driver.find(ws)
    assert first is not None and second is not None
    assert second.id != first.id and second.config.labels["gen"] == "2"


@check("raw-id-paths")
async def _raw_id_paths(tmp_path: Path) -> None:
    driver = faulty(tmp_path, "raw-id-paths")
    prefix = unique_id()
    await driver.run_image(request(f"{prefix}/b", labels=("owner=slash",)))
    with pytest.raises(AlreadyExistsError):
        await driver.run_image(request(f"{prefix}_b"))
    collided = await driver.find(f"{prefix}_b")
    assert collided is not None and collided.config.labels["owner"] == "slash"
    # ".." stays inside the state directory even so.
    await driver.run_image(request(".."))
    assert (tmp_path / "faulty" / "machines" / "raw-..").is_dir()
    # Without the fault the two ids are distinct Machines.
    plain = clean(tmp_path)
    await plain.run_image(request(f"{prefix}/b"))
    await plain.run_image(request(f"{prefix}_b"))


@check("find-stale-status")
async def _find_stale_status(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "find-stale-status"), unique_id()
    await driver.run_image(request(ws))
    await driver.stop(ws)
    details = await driver.find(ws)
    assert details is not None and details.state.status == "running"
    with pytest.raises(FailedPreconditionError):  # it really is stopped
        await run_exec(driver, ws, ["true"])
    await driver.start(ws)
    assert (await run_exec(driver, ws, ["true"])).exit.success


# Reuse / recreate --------------------------------------------------------------------------------------------


@check("reuse-ignores-identity")
async def _reuse_ignores_identity(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "reuse-ignores-identity"), unique_id()
    await driver.run_image(request(ws, remote_user="alice"))
    await driver.reuse_preflight(ws, "mallory")
    with pytest.raises(NotFoundError):  # only the identity comparison is skipped
        await driver.reuse_preflight(unique_id(), "alice")


@check("recreate-before-validate")
async def _recreate_before_validate(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "recreate-before-validate"), unique_id()
    await driver.run_image(request(ws))
    with pytest.raises(UnsupportedError):
        await driver.run_image(request(ws, allow_recreate=True, mounts=(Mount(MountType.BIND, "/a", "/b"),)))
    assert await driver.find(ws) is None
    # Without allow_recreate the old Machine is not touched.
    other = unique_id()
    await driver.run_image(request(other))
    with pytest.raises(UnsupportedError):
        await driver.run_image(request(other, mounts=(Mount(MountType.BIND, "/a", "/b"),)))
    assert await driver.find(other) is not None


# Exec --------------------------------------------------------------------------------------------------------


@check("crash-mid-exec")
async def _crash_mid_exec(tmp_path: Path) -> None:
    code = (
        "import asyncio, sys\n"
        "from vz_conformance.fake import FakeDriver\n"
        "from vz_core import ExecSpec, RunImageRequest\n"
        "async def nothing():\n"
        "    return\n"
        "    yield\n"
        "async def main():\n"
        "    driver = FakeDriver(sys.argv[1], faults=['crash-mid-exec'])\n"
        "    await driver.run_image(RunImageRequest('ws', 'img'))\n"
        "    async for event in driver.exec(ExecSpec('ws', ('printf', 'first')), nothing()):\n"
        "        print(repr(event), flush=True)\n"
        "    print('survived')\n"
        "asyncio.run(main())\n"
    )
    out = _python(code, str(tmp_path))
    assert out.returncode == 3, out.stderr
    assert out.stdout == "ExecOutput(stream='stdout', data=b'first')\n"
    # The Machine keeps its state: a relaunched driver finds it running and usable.
    relaunched = FakeDriver(tmp_path)
    details = await relaunched.find("ws")
    assert details is not None and details.state.status == "running"
    assert (await run_exec(relaunched, "ws", ["true"])).exit.success


@check("exec-missing-exit")
async def _exec_missing_exit(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "exec-missing-exit"), unique_id()
    await driver.run_image(request(ws))
    result = await run_exec(driver, ws, ["echo", "hi"], check=False)
    assert result.events == [ExecOutput("stdout", b"hi\n")]


@check("exec-frame-after-exit")
async def _exec_frame_after_exit(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "exec-frame-after-exit"), unique_id()
    await driver.run_image(request(ws))
    result = await run_exec(driver, ws, ["echo", "hi"], check=False)
    assert result.events[:2] == [ExecOutput("stdout", b"hi\n"), ExecExit(0)]
    assert len(result.events) == 3
    extra = result.events[2]
    assert isinstance(extra, ExecOutput) and extra.stream == "stdout" and extra.data


@check("exec-oversized-chunks")
async def _exec_oversized_chunks(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "exec-oversized-chunks"), unique_id()
    await driver.run_image(request(ws))
    result = await run_exec(driver, ws, ["head", "-c", "1048576", "/dev/zero"], check=False)
    sizes = [len(e.data) for e in result.events if isinstance(e, ExecOutput)]
    assert sum(sizes) == 1 << 20
    assert max(sizes) == 2 * MAX_CHUNK
    assert result.exit == ExecExit(0)
    # Small interactive output is not held back.
    assert (await run_exec(driver, ws, ["echo", "ready"])).stdout == b"ready\n"


@check("exec-empty-chunk")
async def _exec_empty_chunk(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "exec-empty-chunk"), unique_id()
    await driver.run_image(request(ws))
    result = await run_exec(driver, ws, ["echo", "hi"], check=False)
    assert result.events == [ExecOutput("stdout", b""), ExecOutput("stdout", b"hi\n"), ExecExit(0)]


@check("exec-merge-streams")
async def _exec_merge_streams(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "exec-merge-streams"), unique_id()
    await driver.run_image(request(ws))
    result = await run_exec(driver, ws, ["sh", "-c", "echo to-stderr >&2"])
    assert result.stdout == b"to-stderr\n"
    assert result.stderr == b""


@check("exec-shell-reparse")
async def _exec_shell_reparse(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "exec-shell-reparse"), unique_id()
    await driver.run_image(request(ws))
    result = await run_exec(driver, ws, ["echo", "$(echo unwanted)", "a  b"])
    assert result.stdout == b"unwanted a b\n"


@check("exec-ignore-cancel")
async def _exec_ignore_cancel(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "exec-ignore-cancel"), unique_id()
    await driver.run_image(request(ws))
    marker = f"vz-ignore-{uuid.uuid4().hex}"
    events = driver.exec(ExecSpec(ws, ("sh", "-c", "echo ready; sleep 1000 & wait", marker)), feed(()))
    assert await anext(events) == ExecOutput("stdout", b"ready\n")
    tree = [identity(p) for p in tree_with_marker(marker)]
    try:
        await events.aclose()
        assert tree and all(alive(*ident) for ident in tree), "the command was killed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(tree[0][0], signal.SIGKILL)
    assert await wait_dead(tree) == []


# Logs --------------------------------------------------------------------------------------------------------


@check("logs-wrong-chunks")
async def _logs_wrong_chunks(tmp_path: Path) -> None:
    driver, ws = faulty(tmp_path, "logs-wrong-chunks"), unique_id()
    await driver.run_image(request(ws, entrypoint="sh", args=("-c", "head -c 99999 /dev/zero; echo")))
    await wait_logs(driver, ws, b"\0\n")
    sizes = [len(chunk) async for chunk in driver.logs(ws)]
    assert sizes == [2 * MAX_CHUNK, 100000 - 2 * MAX_CHUNK]


async def _stopped_with_output(driver: FakeDriver) -> str:
    ws = unique_id()
    await driver.run_image(request(ws, entrypoint="sh", args=("-c", "echo kept; exec sleep 1000")))
    await wait_logs(driver, ws, b"kept\n")
    await driver.stop(ws)
    return ws


@check("logs-stopped-refused")
async def _logs_stopped_refused(tmp_path: Path) -> None:
    driver = faulty(tmp_path, "logs-stopped-refused")
    ws = await _stopped_with_output(driver)
    with pytest.raises(FailedPreconditionError, match="stopped"):
        await logs_of(driver, ws)
    ws = await _stopped_with_output(clean(tmp_path))
    assert await logs_of(clean(tmp_path), ws) == b"kept\n"


@check("logs-starts-machine")
async def _logs_starts_machine(tmp_path: Path) -> None:
    driver = faulty(tmp_path, "logs-starts-machine")
    ws = await _stopped_with_output(driver)
    assert (await logs_of(driver, ws)).startswith(b"kept\n")
    details = await driver.find(ws)
    assert details is not None and details.state.status == "running"
    assert (await run_exec(driver, ws, ["echo", "ok"])).stdout == b"ok\n"  # really started
    await driver.stop(ws)
    ws = await _stopped_with_output(clean(tmp_path))
    await logs_of(clean(tmp_path), ws)
    details = await clean(tmp_path).find(ws)
    assert details is not None and details.state.status == "stopped"


# Services ---------------------------------------------------------------------------------------------------


async def _service_state(driver: FakeDriver, ws: str, name: str, ok: Callable[[ServiceState], bool]) -> ServiceState:
    for _ in range(150):
        state = {s.name: s for s in await driver.service_states(ws)}.get(name)
        if state is not None and ok(state):
            return state
        await asyncio.sleep(0.1)
    raise AssertionError(f"service {name!r}: {state!r}")


@check("service-crashes")
async def _service_crashes(tmp_path: Path) -> None:
    idle = ServiceSpec("idle", ("sleep", "600"))
    driver = faulty(tmp_path, "service-crashes")
    ws = unique_id()
    await driver.run_image(request(ws))
    await driver.set_services(ws, [idle])
    crashed = await _service_state(driver, ws, "idle", lambda s: s.state == "exited")
    assert crashed.last_signal == "SIGKILL" and crashed.last_exit_code == 128 + signal.SIGKILL
    await driver.delete(ws)
    driver = clean(tmp_path)
    ws = unique_id()
    await driver.run_image(request(ws))
    await driver.set_services(ws, [idle])
    running = await _service_state(driver, ws, "idle", lambda s: s.state == "running")
    await asyncio.sleep(1.0)
    assert (await driver.service_states(ws))[0].pid == running.pid
    await driver.delete(ws)


@check("health-never-passes")
async def _health_never_passes(tmp_path: Path) -> None:
    healthy = ServiceSpec("db", ("sleep", "600"), health=HealthCheck(argv=("true",), interval=0.2, retries=1))
    driver = faulty(tmp_path, "health-never-passes")
    ws = unique_id()
    await driver.run_image(request(ws))
    await driver.set_services(ws, [healthy])
    sick = await _service_state(driver, ws, "db", lambda s: s.health == "unhealthy")
    assert sick.state == "running" and "health-never-passes" in sick.last_error
    await driver.delete(ws)
    driver = clean(tmp_path)
    ws = unique_id()
    await driver.run_image(request(ws))
    await driver.set_services(ws, [healthy])
    await _service_state(driver, ws, "db", lambda s: s.health == "healthy")
    await driver.delete(ws)


# Terminal sessions ------------------------------------------------------------------------------------------


async def _pty(
    driver: FakeDriver,
    argv: list[str],
    steps: list[tuple[bytes | None, list[TerminalInput | bytes]]],
    *,
    within: float = 5.0,
    wait_exit: bool = True,
    **spec: int,
) -> tuple[bytes, ExecExit | None, bool]:
    """Run a terminal session: for each step wait for the pattern (None: at once), then send the items. Returns
    the output, the exit (None if the session had to be closed) and whether every pattern showed up."""
    ws = unique_id()
    await driver.run_image(request(ws))
    queue: asyncio.Queue[TerminalInput | None] = asyncio.Queue()

    async def keys() -> AsyncIterator[TerminalInput]:
        while (item := await queue.get()) is not None:
            yield item

    events = driver.terminal(TerminalSpec(ws, tuple(argv), **spec), keys())
    output, exit_event, seen = b"", None, True
    try:
        async with asyncio.timeout(within * (len(steps) + 1)):
            for pattern, items in steps:
                while pattern is not None and pattern not in output:
                    try:
                        event = await asyncio.wait_for(events.__anext__(), within)
                    except (TimeoutError, StopAsyncIteration):
                        seen = False
                        break
                    if isinstance(event, TerminalOutput):
                        output += event.data
                    else:
                        exit_event = event
                        break
                if not seen or exit_event is not None:
                    break
                for item in items:
                    queue.put_nowait(TerminalData(item) if isinstance(item, bytes) else item)
            if seen and exit_event is None and wait_exit:
                async for event in events:
                    if isinstance(event, TerminalOutput):
                        output += event.data
                    else:
                        exit_event = event
    except TimeoutError:
        seen = False
    finally:
        queue.put_nowait(None)
        await events.aclose()  # type: ignore[attr-defined]
    return output, exit_event, seen


@check("pty-ignores-size")
async def _pty_ignores_size(tmp_path: Path) -> None:
    for driver, size in ((faulty(tmp_path, "pty-ignores-size"), b"24 80"), (clean(tmp_path), b"33 101")):
        output, exit_event, _ = await _pty(driver, ["stty", "size"], [(None, [TerminalEof()])], rows=33, cols=101)
        assert size in output and exit_event == ExecExit(0)


@check("pty-ignores-resize")
async def _pty_ignores_resize(tmp_path: Path) -> None:
    argv = ["sh", "-c", "echo ready; read line; stty size"]
    steps: list[tuple[bytes | None, list[TerminalInput | bytes]]] = [(b"ready", [TerminalResize(40, 120), b"\r"])]
    output, _, _ = await _pty(faulty(tmp_path, "pty-ignores-resize"), argv, steps)
    assert b"24 80" in output and b"40 120" not in output
    output, _, _ = await _pty(clean(tmp_path), argv, steps)
    assert b"40 120" in output


@check("pty-no-echo")
async def _pty_no_echo(tmp_path: Path) -> None:
    argv = ["sh", "-c", 'echo ready; read line; echo "got:$line"']
    steps: list[tuple[bytes | None, list[TerminalInput | bytes]]] = [(b"ready", [b"zebra\r"])]
    output, _, _ = await _pty(faulty(tmp_path, "pty-no-echo"), argv, steps)
    assert output.count(b"zebra") == 1 and b"got:zebra" in output
    output, _, _ = await _pty(clean(tmp_path), argv, steps)
    assert output.count(b"zebra") == 2


@check("pty-no-controlling-terminal")
async def _pty_no_controlling_terminal(tmp_path: Path) -> None:
    argv = ["sh", "-c", 'trap "echo got-int; exit 5" INT; echo ready; while :; do sleep 1; done']
    steps: list[tuple[bytes | None, list[TerminalInput | bytes]]] = [(b"ready", [b"\x03"]), (b"got-int", [])]
    output, exit_event, seen = await _pty(faulty(tmp_path, "pty-no-controlling-terminal"), argv, steps, within=3)
    assert not seen and b"got-int" not in output and exit_event is None
    output, exit_event, seen = await _pty(clean(tmp_path), argv, steps)
    assert seen and exit_event == ExecExit(5)


@check("pty-drops-ctrl-d")
async def _pty_drops_ctrl_d(tmp_path: Path) -> None:
    steps: list[tuple[bytes | None, list[TerminalInput | bytes]]] = [(None, [b"\x04"]), (b"never", [])]
    _, exit_event, _ = await _pty(faulty(tmp_path, "pty-drops-ctrl-d"), ["cat"], steps, within=2)
    assert exit_event is None
    _, exit_event, _ = await _pty(clean(tmp_path), ["cat"], [(None, [b"\x04"])])
    assert exit_event == ExecExit(0)


@check("pty-exit-zero")
async def _pty_exit_zero(tmp_path: Path) -> None:
    argv = ["sh", "-c", "exit 7"]
    _, exit_event, _ = await _pty(faulty(tmp_path, "pty-exit-zero"), argv, [(None, [TerminalEof()])])
    assert exit_event == ExecExit(0)
    _, exit_event, _ = await _pty(clean(tmp_path), argv, [(None, [TerminalEof()])])
    assert exit_event == ExecExit(7)


@check("pty-drops-output")
async def _pty_drops_output(tmp_path: Path) -> None:
    argv = ["sh", "-c", "head -c 1048576 /dev/zero | tr '\\000' v"]
    output, exit_event, _ = await _pty(faulty(tmp_path, "pty-drops-output"), argv, [(None, [TerminalEof()])])
    assert exit_event == ExecExit(0) and 64 * 1024 <= len(output) < 1048576 and set(output) == {ord("v")}
    output, _, _ = await _pty(clean(tmp_path), argv, [(None, [TerminalEof()])])
    assert output == b"v" * 1048576


@check("pty-leaves-session")
async def _pty_leaves_session(tmp_path: Path) -> None:
    marker = f"vzf-{uuid.uuid4().hex}"
    argv = ["sh", "-c", 'sleep 1000 & echo "bg $!"; echo ready; exec sleep 1000', marker]
    for driver, survives in ((faulty(tmp_path, "pty-leaves-session"), True), (clean(tmp_path), False)):
        output, _, _ = await _pty(driver, argv, [(b"ready", [])], wait_exit=False)
        background = int(output.split(b"bg ")[1].split()[0])
        await asyncio.sleep(1.0)
        try:
            assert _sleeping(background) == survives
        finally:
            if survives:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(background, signal.SIGKILL)


@check("network-no-resolv")
async def _network_no_resolv(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("route domains need root")
    async with network_domain() as plan:
        expected = f"nameserver {network_machine(plan, 'app')['dns_server']}\nsearch vz.internal\n"
        for driver, written in ((faulty(tmp_path, "network-no-resolv"), False), (clean(tmp_path), True)):
            ws = unique_id()
            await driver.run_image(labelled(ws, plan, "app"))
            try:
                resolv = (await run_exec(driver, ws, ["cat", "/etc/resolv.conf"])).stdout.decode()
                assert (resolv == expected) is written
            finally:
                await driver.delete(ws)


@check("network-not-reattached")
async def _network_not_reattached(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("route domains need root")
    async with network_domain() as plan:
        for driver, attached in ((faulty(tmp_path, "network-not-reattached"), False), (clean(tmp_path), True)):
            ws = unique_id()
            await driver.run_image(labelled(ws, plan, "app"))
            try:
                assert b"eth0" in (await run_exec(driver, ws, ["ip", "-o", "link", "show"])).stdout
                await driver.stop(ws)
                await driver.start(ws)
                assert (b"eth0" in (await run_exec(driver, ws, ["ip", "-o", "link", "show"])).stdout) is attached
            finally:
                await driver.delete(ws)


async def _saved(driver: FakeDriver) -> tuple[str, tuple[str, int]]:
    """A counting Machine whose state was just saved, and its counter at the save."""
    ws = unique_id()
    await driver.run_image(counter_request(ws))
    await counted(driver, ws, 3)
    await driver.save_state(ws)
    frozen = read_counter(driver, ws)
    assert frozen is not None
    return ws, frozen


@check("save-fails")
async def _save_fails(tmp_path: Path) -> None:
    for driver, kept in ((faulty(tmp_path, "save-fails"), False), (clean(tmp_path), True)):
        ws, frozen = await _saved(driver)
        try:
            assert (await driver.restore_state(ws)).restored is kept
            if kept:
                await counted(driver, ws, frozen[1] + 1, token=frozen[0])
        finally:
            await driver.delete(ws)


@check("restore-fails")
async def _restore_fails(tmp_path: Path) -> None:
    for driver, resumed in ((faulty(tmp_path, "restore-fails"), False), (clean(tmp_path), True)):
        ws, frozen = await _saved(driver)
        try:
            assert (await driver.restore_state(ws)).restored  # both report a resume
            if resumed:
                await counted(driver, ws, frozen[1] + 1, token=frozen[0])
            else:
                await counted(driver, ws, 1, not_token=frozen[0])  # booted fresh
        finally:
            await driver.delete(ws)


@check("state-file-corrupt")
async def _state_file_corrupt(tmp_path: Path) -> None:
    for driver, refused in ((faulty(tmp_path, "state-file-corrupt"), False), (clean(tmp_path), True)):
        ws, _ = await _saved(driver)
        try:
            (driver._store.machine_dir(driver._store.key(ws)) / "saved-state.json").write_bytes(b"{ corrupt")
            outcome = await driver.restore_state(ws)
            assert outcome.restored is not refused
            assert ("corrupt" in outcome.reason) is refused
        finally:
            await driver.delete(ws)


def _sleeping(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) ``sleep 1000``."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and proc.cmdline() == ["sleep", "1000"]
    except psutil.Error:
        return False


# The table ---------------------------------------------------------------------------------------------------


def test_every_fault_mode_is_checked() -> None:
    assert set(CHECKS) == FAULT_MODES
    assert set(FAULT_DESCRIPTIONS) == FAULT_MODES
    assert all(description.strip() for description in FAULT_DESCRIPTIONS.values())


@pytest.mark.parametrize("fault", sorted(FAULT_MODES))
async def test_fault_mode(fault: str, tmp_path: Path) -> None:
    await CHECKS[fault](tmp_path)


@pytest.mark.parametrize("fault", sorted(PLUGIN_FAULTS))
async def test_plugin_faults_do_nothing_in_process(fault: str, tmp_path: Path) -> None:
    driver = faulty(tmp_path, fault)
    assert await driver.info() == await clean(tmp_path).info()
    ws = unique_id()
    await driver.run_image(request(ws))
    assert (await run_exec(driver, ws, ["echo", "ok"])).stdout == b"ok\n"


def test_plugin_rejects_unknown_faults_listing_valid_ones() -> None:
    out = _plugin("--fault", "no-such-fault")
    assert out.returncode == 2
    assert out.stdout == ""
    assert "'no-such-fault'" in out.stderr and "exec-empty-chunk" in out.stderr


def test_plugin_lists_faults() -> None:
    out = _plugin("--list-faults")
    assert out.returncode == 0
    assert len(out.stdout.splitlines()) == len(FAULT_MODES)
