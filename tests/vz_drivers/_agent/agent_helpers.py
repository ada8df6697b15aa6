"""Helpers shared by the guest agent tests: agents as subprocesses, exec runners, process checks."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from vz_core import ExecEvent, ExecExit, ExecOutput, ExecSpec
from vz_drivers._agent import AgentClient


@dataclass
class AgentProcess:
    proc: subprocess.Popen[bytes]
    socket: Path
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def client(self) -> AgentClient:
        return await AgentClient.connect_unix(self.socket, timeout=10)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait, and return the exit status (SIGKILL as a last resort)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_agent(binary: Path, workdir: Path, *args: str, extra_fds: Sequence[int] = ()) -> AgentProcess:
    """Start ``vz-agent serve --listen unix:<workdir>/a.sock ARGS`` and wait for its ready notification."""
    sock = workdir / "a.sock"
    stderr_path = workdir / "agent.stderr"
    ready_r, ready_w = os.pipe()
    try:
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                [str(binary), "serve", "--listen", f"unix:{sock}", "--ready-fd", str(ready_w), *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                pass_fds=(ready_w, *extra_fds),
            )
        os.close(ready_w)
        ready_w = -1
        with os.fdopen(ready_r, "rb") as ready:
            ready_r = -1
            line = ready.read()  # EOF after the notification (or when the agent dies)
    finally:
        for fd in (ready_r, ready_w):
            if fd >= 0:
                os.close(fd)
    agent = AgentProcess(proc, sock, stderr_path)
    if line != b"ready\n":
        agent.stop()
        raise AssertionError(f"agent did not become ready: {agent.stderr()}")
    return agent


async def chunks(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        yield item


async def no_input() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


def spec(*argv: str, user: str = "", workdir: str = "", env: dict[str, str] | None = None) -> ExecSpec:
    return ExecSpec(workspace_id="w", argv=argv, user=user, workdir=workdir, environment=env or {})


@dataclass
class Result:
    stdout: bytes
    stderr: bytes
    exit: ExecExit
    events: list[ExecEvent]


async def run(
    client: AgentClient,
    *argv: str,
    stdin: AsyncIterator[bytes] | None = None,
    root_override: str | None = None,
    **kwargs: object,
) -> Result:
    """Run one exec to the end, checking the event contract on the way."""
    out = bytearray()
    err = bytearray()
    events: list[ExecEvent] = []
    exit_: ExecExit | None = None
    async for event in client.exec(
        spec(*argv, **kwargs),  # type: ignore[arg-type]
        stdin if stdin is not None else no_input(),
        root_override=root_override,
    ):
        assert exit_ is None, "an event arrived after the exit"
        events.append(event)
        if isinstance(event, ExecOutput):
            assert 1 <= len(event.data) <= 32768
            (out if event.stream == "stdout" else err).extend(event.data)
        else:
            exit_ = event
    assert exit_ is not None, "the exec ended without an exit"
    return Result(bytes(out), bytes(err), exit_, events)


def descendants(pid: int) -> dict[int, float]:
    """Live descendants of pid as {pid: create_time} (zombies excluded)."""
    out: dict[int, float] = {}
    try:
        for proc in psutil.Process(pid).children(recursive=True):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    out[proc.pid] = proc.create_time()
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return out


def alive(identities: dict[int, float]) -> dict[int, float]:
    """The subset of (pid, create_time) identities still running (not zombies)."""
    out = {}
    for pid, created in identities.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                out[pid] = created
        except psutil.Error:
            continue
    return out


async def eventually(predicate: Callable[[], bool], within: float, what: str) -> None:
    """Poll a condition (for process-table facts that have no event to wait on)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for: {what}")
        await asyncio.sleep(0.02)
