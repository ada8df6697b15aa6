"""Terminal sessions (``Driver.terminal`` / ``vz.machine.v1.MachineExtensions/ExecPty``) over the real wire.

A small driver runs its commands on host pseudo-terminals with the SDK's ``vz_plugins.terminal.host_terminal``;
every call goes through ``connect_in_process`` (a real grpc.aio server and a ``RemoteDriver``).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from vz_plugins.terminal import _session_members, host_terminal

from vz_core import (
    Driver,
    DriverInfo,
    ExecExit,
    ExecSpec,
    Extensions,
    MachineDetails,
    MachineState,
    RunImageRequest,
    TerminalData,
    TerminalEof,
    TerminalEvent,
    TerminalInput,
    TerminalOutput,
    TerminalResize,
    TerminalSpec,
)
from vz_core.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError, UnsupportedError
from vz_core.rpc import connect_in_process, error_from_rpc, serve_in_process
from vz_core.rpc.pb import extensions_pb2 as ext_pb
from vz_core.rpc.pb import extensions_pb2_grpc as ext_grpc

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/ptmx"), reason="needs pseudo-terminals")


class PtyDriver(Driver):
    """Machine "w" is running, "off" is stopped; terminals are host pseudo-terminals."""

    def __init__(self, *, terminal: bool = True) -> None:
        self.serve_terminal = terminal
        self.started: list[int] = []

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        return DriverInfo("pty", "1", "host")

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        return None

    async def find(self, workspace_id: str) -> MachineDetails | None:
        if workspace_id not in ("w", "off"):
            return None
        return MachineDetails(workspace_id, "", MachineState("running" if workspace_id == "w" else "stopped"))

    async def target_architecture(self, workspace_id: str) -> str:
        return "amd64"

    async def run_image(self, request: RunImageRequest) -> None:
        raise UnsupportedError("no")

    async def start(self, workspace_id: str) -> None:
        return None

    async def stop(self, workspace_id: str) -> None:
        return None

    async def delete(self, workspace_id: str) -> None:
        return None

    async def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[Any]:
        raise UnsupportedError("tty exec is not supported")
        yield  # pragma: no cover

    def terminal(self, spec: TerminalSpec, input: AsyncIterator[TerminalInput]) -> AsyncIterator[TerminalEvent]:
        if spec.workspace_id == "off":
            raise FailedPreconditionError("the Machine is stopped")
        if spec.workspace_id != "w":
            raise NotFoundError(f"no Machine {spec.workspace_id!r}")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PS1": "$ ", **spec.environment}
        return host_terminal(spec.argv, input, rows=spec.rows, cols=spec.cols, term=spec.term, env=env)

    async def extensions(self) -> Extensions | None:
        return Extensions(terminal=self.serve_terminal)


class Keys:
    """Input a test feeds while it reads: ``send()`` items, ``end()`` the iterator."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[TerminalInput | None] = asyncio.Queue()

    def send(self, *items: TerminalInput | bytes) -> None:
        for item in items:
            self.queue.put_nowait(TerminalData(item) if isinstance(item, bytes) else item)

    def end(self) -> None:
        self.queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[TerminalInput]:
        while (item := await self.queue.get()) is not None:
            yield item


class Session:
    """Reads a terminal session's events; ``until(pattern)`` waits for output matching it."""

    def __init__(self, events: AsyncIterator[TerminalEvent]) -> None:
        self.events = events
        self.output = b""
        self.exit: ExecExit | None = None
        self.sizes: list[int] = []
        self.after_exit = 0

    async def until(self, pattern: bytes, timeout: float = 10.0) -> bytes:  # noqa: ASYNC109
        async def read() -> bytes:
            while (m := re.search(pattern, self.output)) is None:
                await self._next()
            return m.group(0)

        return await asyncio.wait_for(read(), timeout)

    async def _next(self) -> None:
        event = await self.events.__anext__()
        if self.exit is not None:
            self.after_exit += 1
        if isinstance(event, TerminalOutput):
            assert 1 <= len(event.data) <= 32768
            self.sizes.append(len(event.data))
            self.output += event.data
        else:
            self.exit = event

    async def finish(self, timeout: float = 10.0) -> ExecExit:  # noqa: ASYNC109
        async def read() -> None:
            try:
                while True:
                    await self._next()
            except StopAsyncIteration:
                return

        await asyncio.wait_for(read(), timeout)
        assert self.exit is not None and self.after_exit == 0
        return self.exit


def spec(*argv: str, **kw: Any) -> TerminalSpec:
    return TerminalSpec("w", argv, **kw)


async def test_extensions_say_terminal_and_tty_stays_false() -> None:
    async with connect_in_process(PtyDriver()) as remote:
        ext = await remote.extensions()
    assert ext is not None and ext.terminal and not ext.tty


async def test_size_at_start_term_and_exit_code() -> None:
    async with connect_in_process(PtyDriver()) as remote:
        keys = Keys()
        keys.send(TerminalEof())
        argv = ("sh", "-c", 'stty size; echo "T=$TERM"; test -t 0 && echo tty; exit 3')
        s = Session(remote.terminal(spec(*argv, rows=33, cols=101, term="vt100"), aiter(keys)))
        exit_event = await s.finish()
        keys.end()
    assert exit_event == ExecExit(3)
    assert b"33 101" in s.output and b"T=vt100" in s.output and b"tty" in s.output


async def test_defaults_when_the_start_gives_no_size() -> None:
    async with serve_in_process(PtyDriver()) as channel:
        stub = ext_grpc.MachineExtensionsStub(channel)  # type: ignore[no-untyped-call]
        call = stub.ExecPty()
        await call.write(
            ext_pb.PtyClientMessage(start=ext_pb.PtyStart(workspace_id="w", argv=["sh", "-c", "stty size; echo $TERM"]))
        )
        await call.write(ext_pb.PtyClientMessage(close_stdin=ext_pb.PtyCloseStdin()))
        out, exits = b"", []
        async for msg in call:
            if msg.WhichOneof("payload") == "output":
                out += msg.output
            else:
                exits.append(msg.exit)
                await call.done_writing()
    assert b"24 80" in out and b"xterm" in out and [e.exit_code for e in exits] == [0]


async def test_echo_resize_sigwinch_ctrl_c_and_ctrl_d() -> None:
    async with connect_in_process(PtyDriver()) as remote:
        keys = Keys()
        s = Session(remote.terminal(spec("sh", "-i"), aiter(keys)))
        await s.until(rb"\$ ")
        keys.send(b"trap 'echo WINCH' WINCH; echo he''llo\r")
        await s.until(rb"hello\r\n")  # the shell's echo of the typed line came first (line discipline echo)
        assert b"echo he''llo" in s.output
        keys.send(TerminalResize(40, 120))
        await s.until(rb"WINCH")
        keys.send(b"stty size\r")
        await s.until(rb"40 120")
        keys.send(b"sleep 100\r")
        await asyncio.sleep(0.3)
        started = time.monotonic()
        keys.send(b"\x03")  # Ctrl-C: SIGINT to the foreground group (sleep), not the end of the call
        await s.until(rb"\^C[^$]*\$ ")  # echoed, and the prompt is back (typing ahead would be flushed)
        keys.send(b"echo back\r")
        await s.until(rb"\r\nback\r\n")
        assert time.monotonic() - started < 5
        keys.send(b"\x04")  # Ctrl-D at an empty prompt: the shell exits 0
        exit_event = await s.finish()
        keys.end()
    assert exit_event == ExecExit(0)


async def test_a_signal_death_is_128_plus_n_and_its_name() -> None:
    async with connect_in_process(PtyDriver()) as remote:
        keys = Keys()
        s = Session(remote.terminal(spec("sh", "-c", "kill -KILL $$"), aiter(keys)))
        exit_event = await s.finish()
        keys.end()
    assert exit_event == ExecExit(137, "SIGKILL")


async def test_one_mebibyte_of_output_without_loss() -> None:
    size = 1024 * 1024
    async with connect_in_process(PtyDriver()) as remote:
        keys = Keys()
        keys.send(TerminalEof())
        argv = ("sh", "-c", f"head -c {size} /dev/zero | tr '\\000' 'a'")
        s = Session(remote.terminal(spec(*argv), aiter(keys)))
        exit_event = await s.finish(timeout=60)
        keys.end()
    assert exit_event == ExecExit(0)
    assert s.output == b"a" * size
    assert max(s.sizes) <= 32768


async def test_cancel_kills_the_whole_session() -> None:
    async with connect_in_process(PtyDriver()) as remote:
        keys = Keys()
        argv = ("sh", "-c", "sleep 100 & echo pid=$$; sleep 100")
        events = remote.terminal(spec(*argv), aiter(keys))
        s = Session(events)
        found = await s.until(rb"pid=\d+")
        sid = int(found.split(b"=")[1])
        assert len(_session_members(sid)) >= 2
        await events.aclose()  # type: ignore[attr-defined]
        deadline = time.monotonic() + 5
        while _session_members(sid) and time.monotonic() < deadline:  # noqa: ASYNC110 - polling /proc
            await asyncio.sleep(0.05)
        assert _session_members(sid) == []


async def test_background_jobs_end_with_the_session() -> None:
    async with connect_in_process(PtyDriver()) as remote:
        keys = Keys()
        keys.send(TerminalEof())
        s = Session(remote.terminal(spec("sh", "-c", "sleep 100 & echo pid=$$"), aiter(keys)))
        exit_event = await s.finish()
        keys.end()
    sid = int(re.search(rb"pid=(\d+)", s.output).group(1))  # type: ignore[union-attr]
    assert exit_event == ExecExit(0)
    assert _session_members(sid) == []


@pytest.mark.parametrize(("workspace", "error"), [("nope", NotFoundError), ("off", FailedPreconditionError)])
async def test_missing_and_stopped_machines(workspace: str, error: type[Exception]) -> None:
    async with connect_in_process(PtyDriver()) as remote:
        keys = Keys()
        with pytest.raises(error):
            async for _ in remote.terminal(TerminalSpec(workspace, ("true",)), aiter(keys)):
                pass


async def test_a_driver_without_terminals_is_unsupported_and_exec_tty_stays_refused() -> None:
    async with connect_in_process(PtyDriver(terminal=False)) as remote:
        with pytest.raises(UnsupportedError, match="terminal"):
            async for _ in remote.terminal(spec("true"), aiter(Keys())):
                pass
    async with connect_in_process(PtyDriver(terminal=True)) as remote:
        # The Runtime Protocol's Exec keeps refusing tty=true: terminals are not Exec's tty.
        async def nothing() -> AsyncIterator[bytes]:
            return
            yield  # pragma: no cover

        with pytest.raises(UnsupportedError):
            async for _ in remote.exec(ExecSpec("w", ("true",), tty=True), nothing()):
                pass


async def test_the_default_contract_method_refuses() -> None:
    class Plain(PtyDriver):
        terminal = Driver.terminal  # type: ignore[assignment]

    async with connect_in_process(Plain()) as remote:
        with pytest.raises(UnsupportedError):
            async for _ in remote.terminal(spec("true"), aiter(Keys())):
                pass


@pytest.mark.parametrize(
    "bad",
    [
        TerminalSpec("w", ()),
        TerminalSpec("w", ("true",), rows=70000),
        TerminalSpec("w", ("true",), rows=0, cols=0),
    ],
)
async def test_bad_starts_are_refused_locally(bad: TerminalSpec) -> None:
    async with connect_in_process(PtyDriver()) as remote:
        with pytest.raises(InvalidArgumentError):
            async for _ in remote.terminal(bad, aiter(Keys())):
                pass


async def test_bad_input_is_refused_locally() -> None:
    async with connect_in_process(PtyDriver()) as remote:
        keys = Keys()
        keys.send(TerminalResize(0, 10))
        with pytest.raises(InvalidArgumentError, match="resize"):
            async for _ in remote.terminal(spec("sleep", "100"), aiter(keys)):
                pass
        keys = Keys()
        keys.send(TerminalEof(), b"late")
        with pytest.raises(InvalidArgumentError, match="after the end of input"):
            async for _ in remote.terminal(spec("sleep", "100"), aiter(keys)):
                pass


def _start(**kw: Any) -> ext_pb.PtyClientMessage:
    return ext_pb.PtyClientMessage(start=ext_pb.PtyStart(workspace_id="w", **{"argv": ["sleep", "100"], **kw}))


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([ext_pb.PtyClientMessage(stdin=b"x")], "must be 'start'"),
        ([_start(argv=[])], "empty argv"),
        ([_start(rows=70000)], "rows or columns"),
        ([_start(), ext_pb.PtyClientMessage(resize=ext_pb.PtyResize(rows=0, cols=80))], "resize"),
        ([_start(), ext_pb.PtyClientMessage(stdin=b"")], "empty stdin"),
        ([_start(), _start()], "second start"),
        ([_start(), ext_pb.PtyClientMessage()], "no payload"),
        (
            [
                _start(),
                ext_pb.PtyClientMessage(close_stdin=ext_pb.PtyCloseStdin()),
                ext_pb.PtyClientMessage(stdin=b"x"),
            ],
            "after close_stdin",
        ),
        ([_start()], "ended before close_stdin"),
    ],
)
async def test_server_frame_rules(frames: list[ext_pb.PtyClientMessage], message: str) -> None:
    async with serve_in_process(PtyDriver()) as channel:
        stub = ext_grpc.MachineExtensionsStub(channel)  # type: ignore[no-untyped-call]
        call = stub.ExecPty()
        for frame in frames:
            await call.write(frame)
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
    err = error_from_rpc(caught.value, rpc="ExecPty")
    assert isinstance(err, InvalidArgumentError), err
    assert message in err.message


async def test_resize_after_close_stdin_is_allowed() -> None:
    async with connect_in_process(PtyDriver()) as remote:
        keys = Keys()
        keys.send(TerminalEof())
        s = Session(
            remote.terminal(spec("sh", "-c", "trap 'stty size; exit 0' WINCH; echo ready; sleep 5 & wait"), aiter(keys))
        )
        await s.until(rb"ready")
        keys.send(TerminalResize(50, 60))
        exit_event = await s.finish()
        keys.end()
    assert b"50 60" in s.output and exit_event == ExecExit(0)


@pytest.mark.parametrize("tools", ["setsid+env", "trampoline"])
async def test_ignored_signals_are_reset_and_ctrl_backslash_quits(tools: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin that ignores SIGQUIT (or SIGINT) must not hand that to the session: Ctrl-\\ reaches the trap."""
    import signal

    import vz_plugins.terminal as hostpty

    if tools == "trampoline":
        monkeypatch.setattr(hostpty, "_tools", lambda: None)
    previous = signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    try:
        async with connect_in_process(PtyDriver()) as remote:
            keys = Keys()
            argv = ("sh", "-c", 'trap "echo got-quit; exit 4" QUIT; stty size; echo ready; while :; do sleep 1; done')
            s = Session(remote.terminal(spec(*argv, rows=11, cols=22), aiter(keys)))
            await s.until(rb"ready")
            keys.send(b"\x1c")
            await s.until(rb"got-quit")
            exit_event = await s.finish()
            keys.end()
    finally:
        signal.signal(signal.SIGQUIT, previous)
    assert exit_event == ExecExit(4) and b"11 22" in s.output
