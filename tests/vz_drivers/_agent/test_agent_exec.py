"""Exec semantics end to end: AgentClient -> Unix socket -> vz-agent -> commands on this host."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pwd
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from agent_helpers import AgentProcess, alive, chunks, descendants, eventually, no_input, run, spec

from vz_core import ExecExit, ExecOutput
from vz_core.errors import InvalidArgumentError, UnavailableError, UnsupportedError
from vz_drivers._agent import AgentClient
from vz_drivers._agent._protocol import OUTPUT_WINDOW

MiB = 1024 * 1024


async def test_binary_echo_round_trips_exactly(client: AgentClient) -> None:
    data = bytes([0x00, 0xFF, 0x80, 0x0A, 0x0D, 0x01])
    result = await run(client, "cat", stdin=chunks(data))
    assert result.stdout == data
    assert result.stderr == b""
    assert result.exit == ExecExit(0, "")


async def test_empty_stdin_gives_no_output_and_exit_zero(client: AgentClient) -> None:
    result = await run(client, "cat")
    assert result.events == [ExecExit(0, "")]


@pytest.mark.parametrize(
    "argument",
    ["two words", "'single' \"double\"", "$HOME;$(echo unwanted)", "", "unicodé ✓ 日本", "back\\slash\ttab", "*"],
    ids=["spaces", "quotes", "shell-syntax", "empty", "unicode", "escapes", "glob"],
)
async def test_arguments_arrive_verbatim(client: AgentClient, argument: str) -> None:
    result = await run(client, "printf", "%s\n", argument, "after")
    assert result.stdout == f"{argument}\nafter\n".encode()
    assert result.exit.success


async def test_stdin_copied_to_stderr_only(client: AgentClient) -> None:
    result = await run(client, "sh", "-c", "cat >&2", stdin=chunks(b"to ", b"stderr"))
    assert result.stdout == b""
    assert result.stderr == b"to stderr"
    assert result.exit.success


async def test_shell_command(client: AgentClient) -> None:
    result = await run(client, "sh", "-c", "echo $((6 * 7)); echo err >&2")
    assert (result.stdout, result.stderr, result.exit) == (b"42\n", b"err\n", ExecExit(0, ""))


async def test_nonzero_exit_with_diagnostic(client: AgentClient) -> None:
    result = await run(client, "sh", "-c", "echo 'something failed' >&2; exit 3")
    assert result.exit == ExecExit(3, "")
    assert not result.exit.success
    assert result.stderr == b"something failed\n"


async def test_signal_terminated_command_reports_signal(client: AgentClient) -> None:
    result = await run(client, "sh", "-c", "kill -9 $$")
    assert result.exit.signal == "SIGKILL"
    assert result.exit.exit_code == 137
    assert not result.exit.success


async def test_missing_executable_is_exit_127(client: AgentClient) -> None:
    result = await run(client, "no-such-command-vz")
    assert result.exit == ExecExit(127, "")
    assert b"no-such-command-vz" in result.stderr
    assert b"not found" in result.stderr


async def test_non_executable_file_is_exit_126(client: AgentClient, tmp_path: Path) -> None:
    path = tmp_path / "plain"
    path.write_text("#!/bin/sh\n")
    result = await run(client, str(path))
    assert result.exit == ExecExit(126, "")
    assert b"permission denied" in result.stderr


async def test_duplex_12_mib_each_way_in_bounded_frames(client: AgentClient) -> None:
    size = 12 * MiB
    block = os.urandom(MiB)
    payload_hash = hashlib.sha256(block * 12).hexdigest()

    async def feed() -> AsyncIterator[bytes]:
        for _ in range(12):
            yield block  # larger than a frame: the client splits it

    out = hashlib.sha256()
    err = hashlib.sha256()
    sizes = {"stdout": 0, "stderr": 0}
    exits = []
    async for event in client.exec(spec("sh", "-c", "tee /dev/fd/2"), feed()):
        if isinstance(event, ExecOutput):
            assert 1 <= len(event.data) <= 32768
            (out if event.stream == "stdout" else err).update(event.data)
            sizes[event.stream] += len(event.data)
        else:
            exits.append(event)
    assert exits == [ExecExit(0, "")]
    assert sizes == {"stdout": size, "stderr": size}
    assert out.hexdigest() == payload_hash
    assert err.hexdigest() == payload_hash


async def test_paused_consumer_bounds_memory_and_blocks_the_command(agent: AgentProcess, client: AgentClient) -> None:
    agent_proc = psutil.Process(agent.pid)
    rss_before = agent_proc.memory_info().rss
    events = client.exec(spec("sh", "-c", "exec cat /dev/zero"), no_input())
    first = await anext(events)
    assert isinstance(first, ExecOutput)
    # Consumer paused from here on. The command fills the pipe and the window, then blocks.
    (cat_pid,) = descendants(agent.pid)
    cat = psutil.Process(cat_pid)
    samples: list[int] = []

    def writes_stopped() -> bool:
        samples.append(cat.io_counters().write_chars)
        return len(samples) >= 10 and samples[-1] == samples[-10]

    await eventually(writes_stopped, 20, "the command to block on its full pipe")
    written = samples[-1]
    assert written < 8 * MiB, f"the command wrote {written} bytes while nobody read"
    # Other requests on the same connection are still served.
    assert await client.ping() < 5
    growth = agent_proc.memory_info().rss - rss_before
    assert growth < 32 * MiB, f"agent RSS grew by {growth} bytes"
    # What the client holds for the paused consumer is bounded by the credit it granted.
    queued: list[tuple[Any, ...]] = [item for st in client._streams.values() for item in st.queue._queue]  # type: ignore[attr-defined]
    buffered = sum(len(item[2]) for item in queued if item[0] == "out")
    assert buffered <= 2 * OUTPUT_WINDOW, f"the client buffered {buffered} bytes"
    # Resuming drains normally.
    total = 0
    async for event in events:
        assert isinstance(event, ExecOutput)
        total += len(event.data)
        if total > 4 * MiB:
            break
    await events.aclose()
    assert not alive({cat_pid: cat.create_time()})


async def test_early_exit_while_client_still_streams(client: AgentClient) -> None:
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        block = b"x" * 65536
        for _ in range(12 * 16):  # 12 MiB
            sent += len(block)
            yield block

    result = await run(client, "head", "-c", "5", stdin=endless())
    assert result.stdout == b"xxxxx"
    assert result.exit == ExecExit(0, "")
    # and the connection is still usable
    assert (await run(client, "echo", "ok")).stdout == b"ok\n"


async def test_exit_while_stdin_never_ends(client: AgentClient) -> None:
    never = asyncio.Event()

    async def blocked() -> AsyncIterator[bytes]:
        await never.wait()
        yield b""  # pragma: no cover

    result = await run(client, "echo", "done", stdin=blocked())
    assert result.stdout == b"done\n"
    assert result.exit.success


_TREE = "sh -c 'sleep 300 & wait' & sleep 300 & echo ready; wait"


async def _start_tree(agent: AgentProcess, client: AgentClient, stdin: AsyncIterator[bytes]):  # type: ignore[no-untyped-def]
    events = client.exec(spec("sh", "-c", _TREE), stdin)
    first = await anext(events)
    assert first == ExecOutput("stdout", b"ready\n")
    # sh, inner sh and two sleeps (the inner sh may still be starting its sleep when "ready" arrives)
    await eventually(lambda: len(descendants(agent.pid)) == 4, 10, "the command tree to be complete")
    return events, descendants(agent.pid)


async def test_cancel_by_aclose_kills_children_and_grandchildren(agent: AgentProcess, client: AgentClient) -> None:
    events, tree = await _start_tree(agent, client, no_input())
    loop = asyncio.get_running_loop()
    started = loop.time()
    await events.aclose()
    await eventually(lambda: not alive(tree), 10, "the whole tree to be killed")
    assert loop.time() - started < 10
    assert (await run(client, "true")).exit.success  # the agent keeps serving


async def test_cancel_by_task_cancel_with_blocked_stdin(agent: AgentProcess, client: AgentClient) -> None:
    never = asyncio.Event()
    tree: dict[int, float] = {}
    got_ready = asyncio.Event()

    async def blocked() -> AsyncIterator[bytes]:
        await never.wait()
        yield b""  # pragma: no cover

    async def consume() -> None:
        nonlocal tree
        events, tree = await _start_tree(agent, client, blocked())
        got_ready.set()
        async for _ in events:
            pass

    task = asyncio.create_task(consume())
    ready = asyncio.create_task(got_ready.wait())
    await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
    assert not task.done(), task.exception()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: not alive(tree), 10, "the whole tree to be killed")


async def test_closing_the_connection_kills_running_execs(agent: AgentProcess) -> None:
    client = await agent.client()
    events, tree = await _start_tree(agent, client, no_input())
    await client.close()
    with pytest.raises(UnavailableError):
        await anext(events)
    await eventually(lambda: not alive(tree), 10, "the tree of a lost connection to be killed")


async def test_agent_crash_is_unavailable(agent: AgentProcess, client: AgentClient) -> None:
    events = client.exec(spec("sh", "-c", "echo ready; exec sleep 300"), no_input())
    assert await anext(events) == ExecOutput("stdout", b"ready\n")
    tree = descendants(agent.pid)
    agent.proc.kill()
    agent.proc.wait()
    with pytest.raises(UnavailableError):
        await anext(events)
    # The command was the agent's child: it dies with it (parent-death signal).
    await eventually(lambda: not alive(tree), 10, "the command of a dead agent to die")
    with pytest.raises(UnavailableError):
        await client.ping()


async def test_ten_concurrent_execs(client: AgentClient) -> None:
    async def one(i: int) -> None:
        data = os.urandom(100_000 + i)
        result = await run(client, "sh", "-c", f"cat; echo {i} >&2; exit {i}", stdin=chunks(data))
        assert result.stdout == data
        assert result.stderr == f"{i}\n".encode()
        assert result.exit == ExecExit(i, "")

    await asyncio.gather(*(one(i) for i in range(10)))


async def test_user_workdir_and_environment(client: AgentClient) -> None:
    with tempfile.TemporaryDirectory(prefix="vz-agent-workdir-") as workdir:
        os.chmod(workdir, 0o755)  # reachable for nobody
        result = await run(
            client,
            "sh",
            "-c",
            'id -u; id -g; pwd; printf "%s|%s|%s\\n" "$FOO" "$USER" "$PATH"',
            user="nobody",
            workdir=workdir,
            env={"FOO": "bar baz", "PATH": "/usr/bin:/bin"},
        )
    uid, gid, cwd, envline = result.stdout.decode().splitlines()
    assert (uid, cwd) == ("65534", workdir)
    assert int(gid) > 0
    assert envline == "bar baz|nobody|/usr/bin:/bin"


async def test_numeric_user_and_group(client: AgentClient) -> None:
    result = await run(client, "sh", "-c", "id -u; id -g; id -G", user="4321:4322")
    assert result.stdout.decode().split() == ["4321", "4322", "4322"]


async def test_default_environment_and_workdir(client: AgentClient) -> None:
    result = await run(client, "sh", "-c", 'pwd; echo "$HOME"; echo "$PATH"')
    cwd, home, path = result.stdout.decode().splitlines()
    assert home == pwd.getpwuid(os.geteuid()).pw_dir
    assert cwd == (home if await asyncio.to_thread(os.path.isdir, home) else "/")
    assert "/usr/bin" in path.split(":")


async def test_unknown_user_is_invalid_argument(client: AgentClient) -> None:
    with pytest.raises(InvalidArgumentError, match="no-such-user"):
        await run(client, "true", user="no-such-user")


async def test_missing_workdir_is_invalid_argument(client: AgentClient) -> None:
    with pytest.raises(InvalidArgumentError, match="workdir"):
        await run(client, "true", workdir="/no/such/dir")


async def test_invalid_requests_fail_before_anything_runs(client: AgentClient) -> None:
    with pytest.raises(InvalidArgumentError):
        await anext(client.exec(spec(), no_input()))
    tty = spec("true").__class__(workspace_id="w", argv=("true",), tty=True)
    with pytest.raises(UnsupportedError):
        await anext(client.exec(tty, no_input()))
    with pytest.raises(InvalidArgumentError, match="environment variable name"):
        await run(client, "true", env={"A=B": "x"})


async def test_failing_stdin_source_kills_the_command(agent: AgentProcess, client: AgentClient) -> None:
    class Boom(Exception):
        pass

    async def failing() -> AsyncIterator[bytes]:
        yield b"partial"
        raise Boom("stdin source broke")

    with pytest.raises(Boom):
        await run(client, "sh", "-c", "cat; sleep 300", stdin=failing())
    await eventually(lambda: not descendants(agent.pid), 10, "the command to be killed")


async def test_ping_and_status(client: AgentClient) -> None:
    assert await client.ping() >= 0
    status = await client.status()
    assert status.main_pid == 0
    assert status.main_exit is None
    assert status.sessions == 1
    assert status.execs == 0
    info = await client.hello()
    assert info.protocol_version == 1
    assert info.mode == "unix"
    assert info.nproc >= 1
    assert info.mem_total > 0


async def test_exec_round_trip_is_fast(client: AgentClient) -> None:
    loop = asyncio.get_running_loop()
    samples = []
    for _ in range(30):
        started = loop.time()
        assert (await run(client, "true")).exit.success
        samples.append(loop.time() - started)
    samples.sort()
    assert samples[len(samples) // 2] < 0.1  # generous bound for a shared CI machine; a few ms here
