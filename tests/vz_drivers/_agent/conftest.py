"""Fixtures: the agent binary (built once per session) and agents running as subprocesses on this host."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path

import pytest
from agent_helpers import AgentProcess, start_agent

from vz_drivers._agent import AgentClient, ensure_agent_binary


@pytest.fixture(scope="session")
def agent_binary() -> Path:
    return ensure_agent_binary()


@pytest.fixture
def agent_factory(agent_binary: Path, tmp_path: Path) -> Iterable[Callable[..., AgentProcess]]:
    started: list[AgentProcess] = []
    counter = 0

    def factory(*args: str, extra_fds: Sequence[int] = ()) -> AgentProcess:
        nonlocal counter
        counter += 1
        workdir = tmp_path / f"agent{counter}"
        workdir.mkdir()
        agent = start_agent(agent_binary, workdir, *args, extra_fds=extra_fds)
        started.append(agent)
        return agent

    yield factory
    for agent in started:
        agent.stop()


@pytest.fixture
def agent(agent_factory: Callable[..., AgentProcess]) -> AgentProcess:
    return agent_factory()


@pytest.fixture
async def client(agent: AgentProcess) -> AsyncIterator[AgentClient]:
    c = await agent.client()
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(scope="session")
def busybox() -> Path:
    path = shutil.which("busybox")
    if path is None:
        pytest.fail("busybox-static is required for the chroot tests (apt-get install busybox-static)")
    return Path(path)
