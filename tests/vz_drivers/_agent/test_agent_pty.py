"""Terminal sessions through the guest agent (EXEC_START with "pty", RESIZE): AgentClient -> vz-agent -> a
pseudo-terminal allocated by the agent on this host."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from vz_core import ExecExit, TerminalData, TerminalEof, TerminalInput, TerminalOutput, TerminalResize, TerminalSpec
from vz_core.errors import UnsupportedError
from vz_drivers._agent import AgentClient

Wait = Callable[[], Awaitable[None]]
Item = TerminalInput | float | Wait
Step = tuple[bytes, list[Item]]
"""A pattern to wait for in the output, then what to send (a float: seconds to wait before the next item; a
coroutine function: awaited before the next item)."""


async def session(
    client: AgentClient,
    argv: list[str],
    first: list[Item],
    steps: list[Step] = (),  # type: ignore[assignment]
    *,
    rows: int = 24,
    cols: int = 80,
    within: float = 20.0,
) -> tuple[bytes, ExecExit]:
    """Run a session: send ``first`` at once, then each step's items once its pattern is in the output."""
    queue: asyncio.Queue[Item | None] = asyncio.Queue()
    for item in first:
        queue.put_nowait(item)

    async def keys() -> AsyncIterator[TerminalInput]:
        while (item := await queue.get()) is not None:
            if isinstance(item, float):
                await asyncio.sleep(item)
            elif callable(item):
                await item()
            else:
                yield item

    pending = list(steps)
    output = b""
    exit_event: ExecExit | None = None
    events = client.terminal(TerminalSpec("w", tuple(argv), rows=rows, cols=cols, term="vt100"), keys())
    try:
        async with _explained(lambda: output, within):
            async for event in events:
                if isinstance(event, TerminalOutput):
                    assert 1 <= len(event.data) <= 32768
                    output += event.data
                    while pending and pending[0][0] in output:
                        for item in pending.pop(0)[1]:
                            queue.put_nowait(item)
                else:
                    assert exit_event is None
                    exit_event = event
    finally:
        queue.put_nowait(None)
        await events.aclose()
    assert exit_event is not None, output
    return output, exit_event


class _explained:
    """``asyncio.timeout(within)`` whose TimeoutError shows the output so far."""

    def __init__(self, output: Callable[[], bytes], within: float) -> None:
        self._output = output
        self._timeout = asyncio.timeout(within)

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self._timeout.__aexit__(*exc)  # type: ignore[arg-type]
        except TimeoutError:
            raise AssertionError(f"no end of the session in time; output: {self._output()!r}") from None


def _stat(pid: str) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1].split()


def _foreground_now(cmdline: bytes, leader: bytes) -> bool:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read() != cmdline:
                    continue
            fields = _stat(name)
            with open(f"/proc/{fields[3]}/cmdline", "rb") as f:
                if f.read() != leader:
                    continue
        except (OSError, IndexError):
            continue
        if fields[2] == fields[5]:  # pgrp == tpgid
            return True
    return False


def _in_foreground(cmdline: bytes, leader: bytes, within: float = 20.0) -> Wait:
    """Wait until a process running ``cmdline``, in a session led by ``leader``, is its terminal's foreground
    process group (its ``tpgid`` is its own process group)."""

    async def wait() -> None:
        deadline = time.monotonic() + within
        while not _foreground_now(cmdline, leader):
            if time.monotonic() > deadline:
                raise AssertionError(f"{cmdline!r} never became the terminal's foreground job")
            await asyncio.sleep(0.02)

    return wait


def _session_members(sid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(") ", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(name))
    return found


async def test_size_term_controlling_terminal_and_exit_code(client: AgentClient) -> None:
    argv = ["sh", "-c", 'stty size; echo "term=$TERM"; [ -t 0 ] && tty; exit 3']
    output, exit_event = await session(client, argv, [TerminalEof()], rows=33, cols=101)
    assert exit_event == ExecExit(3)
    assert b"33 101\r\n" in output and b"term=vt100" in output and re.search(rb"/dev/pts/\d+", output)


async def test_resize_sends_sigwinch_and_changes_the_size(client: AgentClient) -> None:
    script = "trap 'echo \"winch $(stty size)\"; exit 0' WINCH; echo ready; while :; do sleep 1; done"
    output, exit_event = await session(client, ["sh", "-c", script], [], [(b"ready", [TerminalResize(40, 120)])])
    assert b"winch 40 120" in output and exit_event == ExecExit(0)


async def test_ctrl_c_signals_the_foreground_group(client: AgentClient) -> None:
    script = 'trap "echo got-int; exit 5" INT; echo ready; while :; do sleep 1; done'
    output, exit_event = await session(client, ["sh", "-c", script], [], [(b"ready", [TerminalData(b"\x03")])])
    assert b"got-int" in output and exit_event == ExecExit(5)


async def test_echo_and_ctrl_d_end_cat(client: AgentClient) -> None:
    steps: list[Step] = [(b"hello\r\nhello", [TerminalData(b"\x04")])]
    output, exit_event = await session(client, ["cat"], [TerminalData(b"hello\r")], steps)
    assert output == b"hello\r\nhello\r\n" and exit_event == ExecExit(0)


async def test_job_control(client: AgentClient) -> None:
    steps: list[Step] = [
        (b"# ", [TerminalData(b"sleep 100 &\r")]),
        (b"&\r\n# ", [TerminalData(b"jobs\r")]),
        # fg once the prompt after the jobs list is out (typed earlier, its echo would precede the prompt)
        (b"sleep 100\r\n# ", [TerminalData(b"fg\r")]),
        # Ctrl-Z stops the foreground job, once the shell has handed it the terminal (before that, the
        # interactive shell itself would get the SIGTSTP and ignore it)
        (b"fg\r\nsleep 100\r\n", [_in_foreground(b"sleep\x00100\x00", b"sh\x00-i\x00"), TerminalData(b"\x1a")]),
        (b"Stopped", [TerminalData(b"bg\r")]),
        (b"bg\r\n", [TerminalData(b"jobs; kill %1; exit 0\r")]),
    ]
    output, exit_event = await session(client, ["env", "PS1=# ", "sh", "-i"], [], steps)
    assert b"Stopped" in output and output.count(b"Running") == 2 and exit_event == ExecExit(0)


async def test_one_mebibyte_without_loss(client: AgentClient) -> None:
    argv = ["sh", "-c", "head -c 1048576 /dev/zero | tr '\\000' v"]
    output, exit_event = await session(client, argv, [TerminalEof()], within=60)
    assert output == b"v" * 1048576 and exit_event == ExecExit(0)


async def test_background_jobs_end_with_the_session(client: AgentClient) -> None:
    output, exit_event = await session(client, ["sh", "-c", "sleep 1000 & echo sid=$$"], [TerminalEof()])
    sid = int(re.search(rb"sid=(\d+)", output).group(1))  # type: ignore[union-attr]
    assert exit_event == ExecExit(0)
    deadline = time.monotonic() + 5
    while _session_members(sid) and time.monotonic() < deadline:  # noqa: ASYNC110 - polling /proc
        await asyncio.sleep(0.05)
    assert _session_members(sid) == []


async def test_closing_the_session_kills_all_of_it(client: AgentClient) -> None:
    queue: asyncio.Queue[TerminalInput | None] = asyncio.Queue()

    async def keys() -> AsyncIterator[TerminalInput]:
        while (item := await queue.get()) is not None:
            yield item

    events = client.terminal(TerminalSpec("w", ("sh", "-c", "sleep 1000 & echo sid=$$; sleep 1000")), keys())
    output = b""
    async with asyncio.timeout(20):
        async for event in events:
            assert isinstance(event, TerminalOutput)
            output += event.data
            if re.search(rb"sid=\d+\r\n", output):
                break
    sid = int(re.search(rb"sid=(\d+)", output).group(1))  # type: ignore[union-attr]
    assert len(_session_members(sid)) >= 2
    await events.aclose()
    queue.put_nowait(None)
    deadline = time.monotonic() + 5
    while _session_members(sid) and time.monotonic() < deadline:  # noqa: ASYNC110 - polling /proc
        await asyncio.sleep(0.05)
    assert _session_members(sid) == []


async def test_an_agent_without_terminals_is_refused(client: AgentClient) -> None:
    client._info = dataclasses.replace(client.info, features=("exec", "logs"))  # an agent from before "pty"
    with pytest.raises(UnsupportedError, match="predates"):
        await session(client, ["true"], [TerminalEof()])
