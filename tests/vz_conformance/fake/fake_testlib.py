"""Helpers shared by the fake driver's tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil
from vz_conformance.fake import FakeDriver

from vz_core import MAX_CHUNK, ExecEvent, ExecExit, ExecOutput, ExecSpec, RunImageRequest

IMAGE = "vz-fake-test"


def unique_id(prefix: str = "ws") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def request(workspace_id: str, **overrides: Any) -> RunImageRequest:
    return RunImageRequest(workspace_id=workspace_id, image=overrides.pop("image", IMAGE), **overrides)


async def feed(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def split(data: bytes, size: int = MAX_CHUNK) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@dataclass
class ExecResult:
    events: list[ExecEvent] = field(default_factory=list)

    @property
    def stdout(self) -> bytes:
        return b"".join(e.data for e in self.events if isinstance(e, ExecOutput) and e.stream == "stdout")

    @property
    def stderr(self) -> bytes:
        return b"".join(e.data for e in self.events if isinstance(e, ExecOutput) and e.stream == "stderr")

    @property
    def exit(self) -> ExecExit:
        exits = [e for e in self.events if isinstance(e, ExecExit)]
        assert len(exits) == 1, f"expected exactly one exit, got {exits}"
        return exits[0]


def check_framing(events: list[ExecEvent]) -> None:
    """Every output chunk is 1..MAX_CHUNK bytes; exactly one exit, and it comes last."""
    for event in events[:-1]:
        assert isinstance(event, ExecOutput), f"event after exit or a second exit: {event}"
        assert 1 <= len(event.data) <= MAX_CHUNK, f"chunk of {len(event.data)} bytes"
    assert events and isinstance(events[-1], ExecExit), "the stream did not end with an exit"


async def run_exec(
    driver: FakeDriver,
    workspace_id: str,
    argv: Iterable[str],
    *,
    stdin: Iterable[bytes] = (),
    user: str = "",
    workdir: str = "",
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> ExecResult:
    spec = ExecSpec(workspace_id, tuple(argv), user=user, workdir=workdir, environment=dict(env or {}))
    result = ExecResult()
    async for event in driver.exec(spec, feed(stdin)):
        result.events.append(event)
    if check:
        check_framing(result.events)
    return result


def identity(proc: psutil.Process) -> tuple[int, float]:
    return proc.pid, proc.create_time()


def alive(pid: int, create_time: float) -> bool:
    """The process with this identity still exists and has not died (a zombie counts as dead)."""
    try:
        proc = psutil.Process(pid)
        return bool(proc.create_time() == create_time and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


async def wait_dead(identities: Iterable[tuple[int, float]], within: float = 10.0) -> list[tuple[int, float]]:
    """Poll until every identified process is dead; returns the ones still alive at the deadline."""
    pending = list(identities)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while pending and loop.time() < deadline:
        pending = [ident for ident in pending if alive(*ident)]
        if pending:
            await asyncio.sleep(0.02)
    return pending


async def wait_tree(marker: str, size: int, within: float = 10.0) -> list[psutil.Process]:
    """Poll until the process tree holding ``marker`` has at least ``size`` processes; returns it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        tree = tree_with_marker(marker)
        if len(tree) >= size or loop.time() > deadline:
            break
        await asyncio.sleep(0.01)
    assert len(tree) >= size, f"expected {size} processes for {marker}, found {tree}"
    return tree


def tree_with_marker(marker: str) -> list[psutil.Process]:
    """Children of this test process whose command line holds ``marker``, plus all their descendants."""
    found: list[psutil.Process] = []
    for child in psutil.Process().children():
        try:
            if any(marker in part for part in child.cmdline()):
                found.append(child)
                found.extend(child.children(recursive=True))
        except psutil.Error:
            continue
    return found


async def logs_of(driver: FakeDriver, workspace_id: str) -> bytes:
    return b"".join([chunk async for chunk in driver.logs(workspace_id)])


async def wait_logs(driver: FakeDriver, workspace_id: str, expected: bytes, within: float = 10.0) -> bytes:
    """Poll Logs until they end with ``expected`` (the main process runs in the background); returns them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        data = await logs_of(driver, workspace_id)
        if data.endswith(expected) or loop.time() > deadline:
            break
        await asyncio.sleep(0.01)
    assert data.endswith(expected), f"logs never ended with {expected[-80:]!r}; they hold {data[-200:]!r}"
    return data


# A main process counting in the Machine root's file ``c`` as ``<token> <count>``; the token is new at each start
# (a resumed Machine keeps it, a fresh boot changes it).
COUNTER = 'tok=$$-$(date +%s%N); i=0; while :; do i=$((i+1)); echo "$tok $i" > c.tmp; mv c.tmp c; sleep 0.05; done'


def counter_request(workspace_id: str) -> RunImageRequest:
    return request(workspace_id, entrypoint="sh", args=("-c", COUNTER))


def read_counter(driver: FakeDriver, workspace_id: str) -> tuple[str, int] | None:
    path = driver._store.root_dir(driver._store.key(workspace_id)) / "c"
    try:
        token, count = path.read_text().split()
    except (FileNotFoundError, ValueError):
        return None
    return token, int(count)


async def counted(
    driver: FakeDriver, workspace_id: str, at_least: int, token: str | None = None, *, not_token: str = ""
) -> tuple[str, int]:
    """The counter once it reached ``at_least`` (with ``token``, or with any token but ``not_token``)."""
    for _ in range(400):
        value = read_counter(driver, workspace_id)
        if (
            value is not None
            and value[1] >= at_least
            and (token is None or value[0] == token)
            and value[0] != not_token
        ):
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"the counter did not reach {at_least}: {read_counter(driver, workspace_id)}")
