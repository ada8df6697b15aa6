"""Exec semantics of the fake driver: real host processes, verbatim argv, binary streams, flow control, kills."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import pytest
from fake_testlib import (
    ExecResult,
    alive,
    check_framing,
    feed,
    identity,
    request,
    run_exec,
    split,
    tree_with_marker,
    unique_id,
    wait_dead,
    wait_tree,
)
from vz_conformance.fake import FakeDriver
from vz_conformance.fake._exec import _WritePipe

from vz_core import MAX_CHUNK, ExecEvent, ExecExit, ExecOutput, ExecSpec
from vz_core.errors import InvalidArgumentError, UnsupportedError

BINARY = bytes([0x00, 0xFF, 0x80, 0x0A, 0x0D, 0x01]) * 1000


async def test_binary_echo_round_trips(driver: FakeDriver, machine: str) -> None:
    result = await run_exec(driver, machine, ["cat"], stdin=split(BINARY, 777))
    assert result.stdout == BINARY
    assert result.stderr == b""
    assert result.exit == ExecExit(0, "")


async def test_empty_stdin_gives_no_output(driver: FakeDriver, machine: str) -> None:
    result = await run_exec(driver, machine, ["cat"])
    assert result.events == [ExecExit(0)]


async def test_arguments_arrive_verbatim(driver: FakeDriver, machine: str) -> None:
    args = [" two  spaces ", "'single'", '"double"', "$HOME;$(echo unwanted)", "", "ünï €", "*", "a\nb"]
    result = await run_exec(driver, machine, ["printf", "%s\\0", *args])
    assert result.stdout.split(b"\0")[:-1] == [a.encode() for a in args]
    assert result.exit.success


async def test_a_shell_command(driver: FakeDriver, machine: str) -> None:
    result = await run_exec(driver, machine, ["sh", "-c", "echo $((6 * 7)) | tr 4 x"])
    assert result.stdout == b"x2\n"


async def test_stdin_copied_to_stderr_only(driver: FakeDriver, machine: str) -> None:
    result = await run_exec(driver, machine, ["sh", "-c", "cat >&2"], stdin=[b"to stderr\n", b"\x00\xff"])
    assert result.stderr == b"to stderr\n\x00\xff"
    assert result.stdout == b""


async def test_12_mib_duplex_in_bounded_frames(driver: FakeDriver, machine: str) -> None:
    data = os.urandom(12 << 20)
    result = await run_exec(driver, machine, ["tee", "/dev/stderr"], stdin=split(data))
    assert result.stdout == data
    assert result.stderr == data
    assert max(len(e.data) for e in result.events if isinstance(e, ExecOutput)) == MAX_CHUNK


async def test_non_zero_exit_is_an_exit_not_an_error(driver: FakeDriver, machine: str) -> None:
    result = await run_exec(driver, machine, ["sh", "-c", "echo boom >&2; exit 7"])
    assert result.exit == ExecExit(7, "")
    assert not result.exit.success
    assert result.stderr == b"boom\n"


async def test_signal_death_reports_the_signal(driver: FakeDriver, machine: str) -> None:
    result = await run_exec(driver, machine, ["sh", "-c", "kill -TERM $$"])
    assert result.exit == ExecExit(128 + signal.SIGTERM, "SIGTERM")


async def test_command_not_found_is_exit_127(driver: FakeDriver, machine: str) -> None:
    result = await run_exec(driver, machine, ["no-such-command-vz"])
    assert result.exit == ExecExit(127)
    assert b"no-such-command-vz" in result.stderr


async def test_early_exit_while_the_client_still_streams(driver: FakeDriver, machine: str) -> None:
    result = await run_exec(driver, machine, ["true"], stdin=split(bytes(12 << 20)))
    assert result.exit == ExecExit(0)


async def test_early_exit_after_reading_some_input(driver: FakeDriver, machine: str) -> None:
    result = await run_exec(driver, machine, ["head", "-c", "5"], stdin=split(b"x" * (4 << 20)))
    assert result.stdout == b"xxxxx"
    assert result.exit == ExecExit(0)


async def test_a_paused_consumer_throttles_the_command(driver: FakeDriver, machine: str) -> None:
    size = str((256 << 20) + int.from_bytes(os.urandom(2), "big"))  # unique: finds the process below
    events = driver.exec(ExecSpec(machine, ("head", "-c", size, "/dev/zero")), feed(()))
    async with contextlib.aclosing(events):
        first = await anext(events)
        assert isinstance(first, ExecOutput)
        (proc,) = tree_with_marker(size)
        # Wait (bounded) until the command sits blocked writing into its full pipe.
        for _ in range(500):
            if _blocked_on_pipe(proc.pid):
                break
            await asyncio.sleep(0.01)
        assert _blocked_on_pipe(proc.pid)
        written = proc.io_counters().write_chars
        assert written < 2 << 20, f"the command wrote {written} bytes while nobody consumed"
        # Another call on the same driver is served while the exec is paused.
        assert (await driver.find(machine)) is not None
    assert await wait_dead([identity(proc)]) == []


def _blocked_on_pipe(pid: int) -> bool:
    return "pipe_write" in Path(f"/proc/{pid}/wchan").read_text()


async def _start_tree(
    driver: FakeDriver, machine: str
) -> tuple[AsyncGenerator[ExecEvent, None], list[tuple[int, float]]]:
    marker = f"vz-tree-{uuid.uuid4().hex}"
    script = 'sleep 1000 & sh -c "sleep 1000 & wait" & echo ready; wait'
    events = driver.exec(ExecSpec(machine, ("sh", "-c", script, marker)), feed(()))
    first = await anext(events)
    assert first == ExecOutput("stdout", b"ready\n")
    tree = await wait_tree(marker, 4)  # sh, sleep, sh (grandchild), sleep (great-grandchild)
    return events, [identity(p) for p in tree]


async def test_closing_the_stream_kills_children_and_grandchildren(driver: FakeDriver, machine: str) -> None:
    events, tree = await _start_tree(driver, machine)
    await events.aclose()
    assert await wait_dead(tree) == []
    details = await driver.find(machine)
    assert details is not None and details.state.status == "running"
    assert (await run_exec(driver, machine, ["true"])).exit.success


async def test_cancelling_the_consumer_kills_the_tree(driver: FakeDriver, machine: str) -> None:
    marker = f"vz-cancel-{uuid.uuid4().hex}"
    ready = asyncio.Event()
    script = 'sh -c "sleep 1000 & wait" & echo ready; cat > /dev/null; wait'

    async def blocked_stdin() -> AsyncIterator[bytes]:
        yield b"some input\n"
        await asyncio.Event().wait()  # the client never closes stdin
        yield b""  # pragma: no cover

    async def consume() -> None:
        async for event in driver.exec(ExecSpec(machine, ("sh", "-c", script, marker)), blocked_stdin()):
            if event == ExecOutput("stdout", b"ready\n"):
                ready.set()

    task = asyncio.create_task(consume())
    await ready.wait()
    tree = [identity(p) for p in await wait_tree(marker, 3)]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_dead(tree) == []
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_stop_kills_running_commands(driver: FakeDriver, machine: str) -> None:
    events = driver.exec(ExecSpec(machine, ("sh", "-c", "echo ready; exec sleep 1000")), feed(()))
    assert await anext(events) == ExecOutput("stdout", b"ready\n")
    await driver.stop(machine)
    rest = [event async for event in events]
    assert rest == [ExecExit(128 + signal.SIGKILL, "SIGKILL")]


async def test_input_stream_failure_kills_the_command_and_surfaces(driver: FakeDriver, machine: str) -> None:
    marker = f"vz-bad-input-{uuid.uuid4().hex}"

    async def broken_stdin() -> AsyncIterator[bytes]:
        yield b"partial"
        raise InvalidArgumentError("EOF before close_stdin")

    with pytest.raises(InvalidArgumentError, match="close_stdin"):
        async for _ in driver.exec(
            ExecSpec(machine, ("sh", "-c", "cat >/dev/null; sleep 1000", marker)), broken_stdin()
        ):
            pass
    assert not tree_with_marker(marker)


@pytest.mark.root
async def test_user_is_honoured(driver: FakeDriver, machine: str) -> None:
    result = await run_exec(driver, machine, ["sh", "-c", 'id -un; id -u; echo "$HOME"; pwd'], user="nobody")
    name, uid, home, cwd = result.stdout.decode().splitlines()
    assert name == "nobody" and uid != "0"
    assert home
    assert cwd.endswith("/root")
    groups = await run_exec(driver, machine, ["id", "-G"], user="nobody")
    assert b"0" not in groups.stdout.split(), "root's supplementary groups must not leak"
    numeric = await run_exec(driver, machine, ["sh", "-c", "id -u; id -g"], user="4242:4343")
    assert numeric.stdout == b"4242\n4343\n"


@pytest.mark.root
async def test_machine_user_is_the_default_exec_user(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, user="nobody"))
    assert (await run_exec(driver, ws, ["id", "-un"])).stdout == b"nobody\n"
    assert (await run_exec(driver, ws, ["id", "-un"], user="root")).stdout == b"root\n"


async def test_unknown_user_is_invalid(driver: FakeDriver, machine: str) -> None:
    with pytest.raises(InvalidArgumentError, match="no-such-user-vz"):
        await run_exec(driver, machine, ["true"], user="no-such-user-vz")


async def test_workdir(driver: FakeDriver, machine: str, tmp_path: Path) -> None:
    assert (await run_exec(driver, machine, ["pwd"], workdir=str(tmp_path))).stdout == f"{tmp_path}\n".encode()
    await run_exec(driver, machine, ["mkdir", "sub"])
    root = (await run_exec(driver, machine, ["pwd"])).stdout.decode().strip()
    assert (await run_exec(driver, machine, ["pwd"], workdir="sub")).stdout.decode().strip() == f"{root}/sub"
    with pytest.raises(InvalidArgumentError, match="workdir"):
        await run_exec(driver, machine, ["pwd"], workdir="missing")


async def test_environment(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, environment={"FROM_MACHINE": "m", "OVERRIDDEN": "machine"}))
    script = 'echo "$FROM_MACHINE $OVERRIDDEN $FROM_EXEC|$PATH|$VZ_MACHINE_ROOT"; env | wc -l'
    result = await run_exec(driver, ws, ["sh", "-c", script], env={"OVERRIDDEN": "exec", "FROM_EXEC": "e x"})
    line, count = result.stdout.decode().splitlines()
    values, path, root = line.split("|")
    assert values == "m exec e x"
    assert path == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    details = await driver.find(ws)
    assert details is not None and root == details.config.working_dir
    assert "PYTEST_CURRENT_TEST" not in result.stdout.decode()
    assert int(count) <= 10  # a minimal environment, nothing inherited from the driver process


@pytest.mark.parametrize(
    ("spec_kwargs", "error"),
    [
        ({"argv": ()}, InvalidArgumentError),
        ({"argv": ("sh",), "tty": True}, UnsupportedError),
        ({"argv": ("a\0b",)}, InvalidArgumentError),
        ({"argv": ("true",), "environment": {"": "x"}}, InvalidArgumentError),
    ],
    ids=["empty-argv", "tty", "nul-arg", "empty-env-name"],
)
async def test_bad_exec_requests(
    driver: FakeDriver, machine: str, spec_kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        async for _ in driver.exec(ExecSpec(machine, **spec_kwargs), feed(())):  # type: ignore[arg-type]
            pass


async def test_many_concurrent_execs(driver: FakeDriver, machine: str) -> None:
    results = await asyncio.gather(
        *(run_exec(driver, machine, ["sh", "-c", f"echo {i}; echo e{i} >&2"]) for i in range(20))
    )
    for i, result in enumerate(results):
        assert result.stdout == f"{i}\n".encode() and result.stderr == f"e{i}\n".encode()


async def test_framing_helper_rejects_bad_streams() -> None:
    # The helper the other tests lean on must itself be able to fail.
    for events in (
        [ExecOutput("stdout", b"")],
        [ExecOutput("stdout", b"x" * (MAX_CHUNK + 1)), ExecExit(0)],
        [ExecExit(0), ExecExit(0)],
        [ExecOutput("stdout", b"x")],
        [ExecExit(0), ExecOutput("stdout", b"x")],
    ):
        with pytest.raises(AssertionError):
            check_framing(events)  # type: ignore[arg-type]
    assert ExecResult([ExecExit(3)]).exit.exit_code == 3
    assert not alive(os.getpid(), 0.0)


async def test_stdin_pipe_abort_after_the_command_closed_its_end() -> None:
    # Regression: the command closing stdin makes the transport schedule connection_lost; aborting before that
    # callback ran used to schedule it twice (an exception in a loop callback, caught by _loop_errors).
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe()
    pipe = _WritePipe()
    transport, _ = await loop.connect_write_pipe(lambda: pipe, os.fdopen(write_fd, "wb"))
    os.close(read_fd)
    for _ in range(1000):  # one loop iteration each: stop right after the transport noticed the closed end
        if transport.is_closing():
            break
        await asyncio.sleep(0)
    assert transport.is_closing()
    pipe.abort()
    pipe.abort()
    for _ in range(3):
        await asyncio.sleep(0)
    with pytest.raises(BrokenPipeError):
        await pipe.write(b"late")


async def test_a_second_cancellation_during_cleanup_leaves_nothing_behind(driver: FakeDriver, machine: str) -> None:
    marker = f"vz-cancel2-{uuid.uuid4().hex}"
    ready = asyncio.Event()

    async def consume() -> None:
        spec = ExecSpec(machine, ("sh", "-c", "sleep 1000 & echo ready; wait", marker))
        async for event in driver.exec(spec, feed(())):
            if event == ExecOutput("stdout", b"ready\n"):
                ready.set()

    task = asyncio.create_task(consume())
    await ready.wait()
    tree = [identity(p) for p in await wait_tree(marker, 2)]
    task.cancel()
    await asyncio.sleep(0)  # the generator is now in its cleanup, awaiting
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_dead(tree) == []
