"""The client against the daemon's real service (vz_core.daemon._service, drivers in-process on the fake): every
answer the service gives over the local wire parses into its vz.api.v1 message and converts back to the identical
JSON, and the gRPC front serves the same calls (a shape the .proto does not know fails there loudly)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from vz_core.api import ApiError, Client, pb
from vz_core.daemon import Daemon, DaemonPaths
from vz_core.daemon._grpc import GrpcFront
from vz_core.daemon._service import Service

api = pb.api_pb2


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    root = tmp_path / "proj"
    root.mkdir()
    machine = {"name": "web", "profile": "developer", "driver": "fake", "image": "vz:default"}
    definition = {"version": 1, "project_id": "svc", "machines": [{**machine, "workspace": {"projection": "none"}}]}
    (root / "vz.json").write_text(json.dumps(definition))
    return root


@contextlib.asynccontextmanager
async def daemon(home: Path) -> AsyncIterator[DaemonPaths]:
    async with daemon_server(home) as (paths, _):
        yield paths


@contextlib.asynccontextmanager
async def daemon_server(home: Path) -> AsyncIterator[tuple[DaemonPaths, Daemon]]:
    paths = DaemonPaths(str(home))
    server: Daemon | None = None
    service = Service(warm_sessions=False, daemon_status=lambda: server.status() if server else {})
    await service.start()
    server = Daemon(paths, service.dispatch, handle_signals=False, idle_timeout=0.0, on_shutdown=[service.close])
    server.on_stopping.append(service.stopping)
    front = GrpcFront(server.dispatch, paths.directory)
    server.http2 = front.handle
    server.on_shutdown.insert(0, front.close)
    ready = asyncio.Event()
    serving = asyncio.ensure_future(server.serve(ready=ready.set))
    waiter = asyncio.ensure_future(ready.wait())
    await asyncio.wait([serving, waiter], return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        waiter.cancel()
        serving.result()
    await front.start()
    try:
        yield paths, server
    finally:
        server.request_shutdown("test over")
        await asyncio.wait_for(serving, 60)


def exact(data: dict[str, Any], cls: type[Any]) -> None:
    """The service's JSON is exactly the message's local-wire form."""
    wire = json.loads(json.dumps(data))
    assert pb.to_wire(pb.from_wire(wire, cls)) == wire


def session(paths: DaemonPaths, project: Path, transport: str) -> dict[str, Any]:
    context: dict[str, Any] = {"cwd": str(project), "environ": {}, "definition_file": None}
    out: dict[str, Any] = {}
    with Client(paths.home, autostart=False, transport=transport, context=context) as client:
        op = client.up()
        out["progress"] = list(op)
        out["up"] = op.result()
        out["status"] = client.status()
        out["all"] = client.status(all=True)
        out["machine"] = client.machine()
        out["machines"] = client.machines()
        out["exec"] = client.exec(["sh", "-c", "cat; echo err >&2; exit 7"], stdin=b"in")
        out["volumes"] = client.volumes()
        out["capabilities"] = client.capabilities(["fake"])
        out["daemon"] = client.daemon_status()
        with client.events(0) as stream:
            out["events"] = list(stream)
        try:
            client.environment("nope")
        except ApiError as exc:
            out["error"] = exc
        out["stop"] = client.stop().result()
        out["delete"] = client.delete().result()
    return out


@pytest.mark.parametrize("transport", ["local", "grpc"])
async def test_the_real_service_over_both_transports(transport: str, tmp_path: Path, project: Path) -> None:
    async with daemon(tmp_path / "home") as paths:
        got = await asyncio.to_thread(session, paths, project, transport)
    for message in got["progress"]:
        exact(message, api.Progress)
    exact(got["up"], api.UpResult)
    exact(got["status"], api.StatusReport)
    exact(got["all"], api.StatusReport)
    exact(got["machine"], api.MachineStatus)
    exact({"environment": got["machine"]["environment"], "machines": got["machines"]}, api.MachineList)
    exact(got["exec"], api.ExecResult)
    exact({"volumes": got["volumes"]}, api.VolumeList)
    exact({"drivers": got["capabilities"]}, api.CapabilitiesResponse)
    exact(got["daemon"], api.DaemonStatus)
    for event in got["events"]:
        exact(event, api.Event)
    exact(got["stop"], api.StopResult)
    exact(got["delete"], api.DeleteResult)
    assert got["up"].environment.state == "running" and got["status"].environments[0].machines[0].state == "running"
    assert got["machine"].name == "web" and [m.name for m in got["machines"]] == ["web"]
    # The fake serves terminal sessions (test_a_terminal_session_over_both_transports): its tty says so.
    assert got["machine"]["driver"]["extensions"]["tty"] is True
    assert (got["exec"].exit_code, got["exec"].stdout, got["exec"].stderr) == (7, b"in", b"err\n")
    assert got["capabilities"][0].name == "fake" and got["capabilities"][0].facts is not None
    assert got["daemon"].pid == os.getpid()
    kinds = [e.kind for e in got["events"]]
    assert "operation.started" in kinds and "operation.finished" in kinds
    assert [e.revision for e in got["events"]] == sorted(e.revision for e in got["events"])
    assert (got["error"].code, got["error"].exit_code, got["error"].kind) == ("NOT_FOUND", 3, "not_found")
    assert got["stop"].environment.state == "stopped" and got["delete"].environment.state == "deleted"


@pytest.mark.parametrize("transport", ["local", "grpc"])
async def test_a_terminal_session_over_both_transports(transport: str, tmp_path: Path, project: Path) -> None:
    async with daemon(tmp_path / "home") as paths:

        def run() -> tuple[bytes, Any]:
            context: dict[str, Any] = {"cwd": str(project), "environ": {}, "definition_file": None}
            with Client(paths.home, autostart=False, transport=transport, context=context) as client:
                client.up().result()
                output = bytearray()
                script = "stty size; read line; echo got:$line; exit 2"
                with client.open_exec(["sh", "-c", script], tty=True, rows=30, cols=100, term="xterm") as call:
                    call.resize(31, 101)
                    call.send(3, b"typed\r")
                    while True:
                        message = call.receive()
                        if message[0] == "result":
                            client.delete().result()
                            return bytes(output), message[1]
                        assert message[1] == 3  # a terminal has one stream
                        output.extend(message[2])

        output, result = await asyncio.to_thread(run)
    assert result == {"exit_code": 2, "signal": None}
    assert b"got:typed" in output and (b"30 100" in output or b"31 101" in output)


def _raw_exec(paths: DaemonPaths, project: Path, script: str, inputs: list[bytes]) -> tuple[bytes, Any]:
    """Machines.Exec as a plain grpcio client writes it: a finite request iterator (start, the input, then the
    iterator ends, which half-closes the call), reading output until the result."""
    import grpc

    spec = pb.method("Machines.Exec")
    start = api.ExecRequest(argv=["sh", "-c", script], stdio=[False, False, False])
    start.context.cwd = str(project)

    def requests() -> Any:
        yield api.ExecClientMessage(start=start)
        for data in inputs:
            yield api.ExecClientMessage(input=api.Chunk(stream=0, data=data))

    with grpc.insecure_channel("unix:" + paths.socket) as channel:
        stub = channel.stream_stream(
            spec.path, request_serializer=spec.request.SerializeToString, response_deserializer=spec.response.FromString
        )
        output = bytearray()
        for message in stub(requests(), timeout=120):
            if message.WhichOneof("message") == "result":
                return bytes(output), pb.to_wire(message.result)
            output.extend(message.output.data)
    raise AssertionError("the Exec stream ended without a result")


async def test_a_half_closed_exec_is_stdin_eof_and_still_delivers_its_result(tmp_path: Path, project: Path) -> None:
    """Half-closing the client side of Exec (the end of the request iterator) ends the command's input; the command
    keeps running, its output and its result arrive (it is not cancelled)."""
    async with daemon(tmp_path / "home") as paths:

        def run() -> list[tuple[bytes, Any]]:
            context: dict[str, Any] = {"cwd": str(project), "environ": {}, "definition_file": None}
            with Client(paths.home, autostart=False, transport="grpc", context=context) as client:
                client.up().result()
                try:
                    return [
                        _raw_exec(paths, project, "cat; echo done; exit 5", [b"hello\n"]),
                        _raw_exec(paths, project, "sleep 1; echo late", []),
                    ]
                finally:
                    client.delete().result()

        (cat, first), (late, second) = await asyncio.to_thread(run)
    assert (cat, first) == (b"hello\ndone\n", {"exit_code": 5, "signal": None})
    assert (late, second) == (b"late\n", {"exit_code": 0, "signal": None})


@pytest.mark.parametrize("transport", ["local", "grpc"])
async def test_a_cancelled_exec_says_the_command_was_killed(transport: str, tmp_path: Path, project: Path) -> None:
    async with daemon(tmp_path / "home") as paths:

        def run() -> tuple[Any, ApiError]:
            context: dict[str, Any] = {"cwd": str(project), "environ": {}, "definition_file": None}
            with Client(paths.home, autostart=False, transport=transport, context=context) as client:
                client.up().result()
                try:
                    with client.open_exec(["sh", "-c", "echo started; exec sleep 600"]) as call:
                        first = call.receive()
                        call.cancel()
                        with pytest.raises(ApiError) as info:
                            while True:
                                call.receive()
                    return first, info.value
                finally:
                    client.delete().result()

        first, error = await asyncio.to_thread(run)
    assert first == ("output", 1, b"started\n")
    assert (error.code, error.kind, error.exit_code) == ("CANCELLED", "interrupted", 130)
    assert error.message == "the command was killed: cancelled by the client (the Machine keeps running)"


@pytest.mark.parametrize("transport", ["local", "grpc"])
async def test_a_watch_ends_with_its_result_at_shutdown(transport: str, tmp_path: Path, project: Path) -> None:
    """WatchResponse.result: at shutdown every watch ends with the last revision it returned, not an error."""
    async with daemon_server(tmp_path / "home") as (paths, server):
        context: dict[str, Any] = {"cwd": str(project), "environ": {}, "definition_file": None}
        loop = asyncio.get_running_loop()

        def run() -> tuple[list[int], int, list[int], int]:
            with Client(paths.home, autostart=False, transport=transport, context=context) as client:
                client.up().result()
                watch, machines = client.watch(0), client.watch_machines(0)
                seen = [next(watch).revision]
                seen_machines = [next(machines).revision]
                loop.call_soon_threadsafe(server.request_shutdown, "test")
                seen += [event.revision for event in watch]  # ends with the result, no ApiError
                seen_machines += [event.revision for event in machines]
                return seen, watch.last_revision, seen_machines, machines.last_revision

        seen, last, seen_machines, last_machines = await asyncio.to_thread(run)
    assert seen and last == seen[-1] and seen_machines and last_machines == seen_machines[-1]


@pytest.mark.parametrize("transport", ["local", "grpc"])
async def test_the_event_log_after_a_delete_and_typed_events(
    transport: str, tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a Delete, an operation's started and finished events leave the log together (a replay from 0 shows
    no operation that never finishes); events carry their data typed (integers as integers); a watch of an
    unknown Environment id is NOT_FOUND; System.Events from now (null) without follow returns no event."""
    import vz_core.daemon._service as service_module

    monkeypatch.setattr(service_module, "FORGET_DELAY", 0.05)
    async with daemon(tmp_path / "home") as paths:
        context: dict[str, Any] = {"cwd": str(project), "environ": {}, "definition_file": None}

        def run() -> tuple[list[Any], list[Any], ApiError, ApiError, list[Any], int]:
            with Client(paths.home, autostart=False, transport=transport, context=context) as client:
                client.up().result()
                with client.events(0) as stream:
                    before = list(stream)
                client.delete().result()
                import time

                time.sleep(0.5)  # the deleted Environment's events leave the log FORGET_DELAY after its deletion
                with client.events(0) as stream:
                    after = list(stream)
                errors = []
                for watch in (client.watch, client.watch_machines):
                    with pytest.raises(ApiError) as info:
                        next(watch(0, environment_id="env_no_such_one"))
                    errors.append(info.value)
                with client.events(None) as stream:
                    now = list(stream)
                return before, after, errors[0], errors[1], now, stream.last_revision

        before, after, env_error, machine_error, now, latest = await asyncio.to_thread(run)
    finished = [e for e in before if e.kind == "operation.finished"]
    assert finished and all(e["operation_finished"]["call"] == e.data["call"] for e in finished)
    assert all(type(e["operation_finished"]["call"]) is int for e in finished)
    assert all(e["operation_finished"]["started_revision"] < e.revision for e in finished)
    started = {e.data["call"] for e in after if e.kind == "operation.started"}
    ended = {e.data["call"] for e in after if e.kind == "operation.finished"}
    assert started == ended, f"operations that never finish in a replay: {started - ended}"
    assert not [e for e in after if e.kind == "operation.started" and e.data["method"] == "Environments.Up"]
    for error in (env_error, machine_error):
        assert (error.code, error.exit_code) == ("NOT_FOUND", 3) and "env_no_such_one" in error.message
    assert now == [] and latest >= max(e.revision for e in before)
