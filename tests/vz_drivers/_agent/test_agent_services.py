"""Services the agent supervises (SERVICES, SERVICE_STATES, SERVICE_LOGS): start order, restart policies,
health by command and by TCP port, SIGTERM then SIGKILL, logs kept across restarts, survival of the host's
connection. Real agent processes over real Unix sockets."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from agent_helpers import AgentProcess

from vz_core.errors import InvalidArgumentError
from vz_core.services import HealthCheck, ServiceSpec, ServiceState
from vz_drivers._agent import AgentClient

SH = "/bin/sh"


def alive(pid: int) -> bool:
    """The process runs (it is neither gone nor a zombie)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def svc(name: str, script: str, **kw: object) -> ServiceSpec:
    return ServiceSpec(name=name, argv=(SH, "-c", script), **kw)  # type: ignore[arg-type]


async def until(
    client: AgentClient, check: Callable[[dict[str, ServiceState]], bool], what: str, within: float = 60
) -> dict[str, ServiceState]:
    """Poll SERVICE_STATES until ``check`` holds (the states have no event to wait on)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        states = {s.name: s for s in await client.service_states()}
        if check(states):
            return states
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {states}")
        await asyncio.sleep(0.05)


async def test_order_health_and_logs(client: AgentClient, tmp_path: Path) -> None:
    marker = tmp_path / "db-ready"
    db = svc(
        "db",
        f"echo db starting; sleep 0.3; touch {marker}; exec sleep 1000",
        health=HealthCheck(argv=("test", "-e", str(marker)), interval=0.1, timeout=5, retries=2),
    )
    app = svc(
        "app",
        f'test -e {marker} && echo "app saw db"; exec sleep 1000',
        depends_on={"db": "service_healthy"},
    )
    first = {s.name: s for s in await client.set_services([app, db])}
    assert list(first) == ["db", "app"]  # start order: what is depended on first
    assert first["app"].state == "waiting"
    states = await until(client, lambda s: s["app"].state == "running", "app to start")
    assert states["db"].health == "healthy"
    await until(client, lambda s: s["app"].log_bytes > 0, "app's output")
    assert (await client.service_logs("app")) == b"app saw db\n"
    assert (await client.service_logs("db")).startswith(b"db starting\n")
    assert (await client.service_logs("db", tail_bytes=9)) == b"starting\n"
    with pytest.raises(InvalidArgumentError, match='no service "nope"'):
        await client.service_logs("nope")


async def test_unchanged_services_keep_running_and_removed_ones_stop(client: AgentClient) -> None:
    a = svc("a", "exec sleep 1000")
    b = svc("b", "trap 'echo got TERM; exit 0' TERM; while :; do sleep 0.1; done")
    await client.set_services([a, b])
    states = await until(client, lambda s: all(x.state == "running" for x in s.values()), "both running")
    pid_a, pid_b = states["a"].pid, states["b"].pid
    again = {s.name: s for s in await client.set_services([a])}
    assert list(again) == ["a"] and again["a"].pid == pid_a  # not restarted
    assert not alive(pid_b)


async def test_sigkill_after_stop_timeout(client: AgentClient) -> None:
    stubborn = svc("stubborn", "trap '' TERM; echo ready; while :; do sleep 0.1; done", stop_timeout=0.5)
    await client.set_services([stubborn])
    states = await until(client, lambda s: s["stubborn"].log_bytes > 0, "the trap to be set")
    pid = states["stubborn"].pid
    assert await client.set_services([]) == ()
    assert not alive(pid)


@pytest.mark.parametrize(
    ("restart", "script", "expect_restarts"),
    [
        ("no", "exit 3", 0),
        ("on-failure", "exit 0", 0),
    ],
)
async def test_policies_that_do_not_restart(
    client: AgentClient, restart: str, script: str, expect_restarts: int
) -> None:
    await client.set_services([svc("x", script, restart=restart)])
    states = await until(client, lambda s: s["x"].state in ("exited", "failed"), "the exit")
    await asyncio.sleep(0.5)  # a restart would come within the first back-off (0.1 s)
    x = {s.name: s for s in await client.service_states()}["x"]
    assert x.restarts == expect_restarts and x.last_exit_code == states["x"].last_exit_code


async def test_on_failure_gives_up_after_max_retries(client: AgentClient) -> None:
    await client.set_services([svc("flaky", "echo run; exit 7", restart="on-failure", max_retries=2)])
    states = await until(client, lambda s: s["flaky"].state == "failed", "giving up")
    assert states["flaky"].restarts == 2
    assert states["flaky"].last_exit_code == 7
    assert "gave up after 2 restarts" in states["flaky"].last_error
    logs = await client.service_logs("flaky")
    assert logs.count(b"run\n") == 3  # kept across restarts


async def test_always_restarts_a_killed_service(client: AgentClient) -> None:
    await client.set_services([svc("web", "exec sleep 1000", restart="always")])
    first = await until(client, lambda s: s["web"].state == "running", "start")
    os.kill(first["web"].pid, signal.SIGKILL)
    states = await until(client, lambda s: s["web"].restarts == 1 and s["web"].state == "running", "the restart")
    assert states["web"].pid != first["web"].pid
    assert states["web"].last_signal == "SIGKILL" and states["web"].last_exit_code == 137


async def test_tcp_health(client: AgentClient) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = (
        "python3 -c 'import socket,sys,time; s=socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f's.bind(("127.0.0.1", {port})); s.listen(); time.sleep(1000)\''
    )
    health = HealthCheck(tcp_port=port, interval=0.1, timeout=1, retries=1)
    await client.set_services([svc("tcp", server, health=health)])
    await until(client, lambda s: s["tcp"].health == "healthy", "the port to accept")
    closed = HealthCheck(tcp_port=1, interval=0.1, timeout=1, retries=2)
    await client.set_services([svc("dead", "exec sleep 1000", health=closed)])
    states = await until(client, lambda s: s["dead"].health == "unhealthy", "unhealthy")
    assert "health check" in states["dead"].last_error


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (
            [
                svc("a", "true", depends_on={"b": "service_started"}),
                svc("b", "true", depends_on={"a": "service_started"}),
            ],
            "cycle",
        ),
        ([svc("a", "true", depends_on={"zz": "service_started"})], "not in the set"),
        ([svc("a", "true"), svc("b", "true", depends_on={"a": "service_healthy"})], "has no health check"),
        ([svc("a", "true", restart="sometimes")], 'restart "sometimes"'),
        ([svc("a", "true", workdir="/no/such/dir")], "workdir"),
        ([svc("a", "true"), svc("a", "true")], "given twice"),
    ],
)
async def test_bad_sets_change_nothing(client: AgentClient, specs: list[ServiceSpec], message: str) -> None:
    keep = svc("keep", "exec sleep 1000")
    await client.set_services([keep])
    pid = (await until(client, lambda s: s["keep"].state == "running", "start"))["keep"].pid
    with pytest.raises(InvalidArgumentError, match=message):
        await client.set_services([keep, *specs])
    states = await client.service_states()
    assert [(s.name, s.pid) for s in states] == [("keep", pid)]


async def test_services_outlive_the_connection_and_stop_with_the_agent(agent: AgentProcess) -> None:
    first = await agent.client()
    await first.set_services([svc("bg", "trap 'exit 0' TERM; while :; do sleep 0.1; done")])
    pid = (await until(first, lambda s: s["bg"].state == "running", "start"))["bg"].pid
    await first.close()
    second = await agent.client()
    try:
        states = {s.name: s for s in await second.service_states()}
        assert states["bg"].pid == pid and states["bg"].state == "running" and alive(pid)
    finally:
        await second.close()
    assert agent.stop() == 0
    assert not alive(pid)


async def test_shutdown_stops_dependents_first_with_sigterm(agent: AgentProcess, tmp_path: Path) -> None:
    """What `vz stop` does (SHUTDOWN): each service gets SIGTERM, the one that depends on another before it."""
    log = tmp_path / "stops.log"
    client = await agent.client()
    trap = "trap 'echo {name} got TERM >> {log}; exit 0' TERM; echo up; while :; do sleep 0.05; done"
    base = svc("base", trap.format(name="base", log=log), health=HealthCheck(argv=("true",), interval=0.1))
    top = svc("top", trap.format(name="top", log=log), depends_on={"base": "service_healthy"})
    await client.set_services([base, top])
    await until(client, lambda s: all(x.log_bytes > 0 for x in s.values()) and len(s) == 2, "both trapping")
    await client.shutdown(grace=5)
    assert log.read_text() == "top got TERM\nbase got TERM\n"
