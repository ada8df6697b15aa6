"""vz_core.api.Client over both transports against a real daemon listener (vz_core.daemon.Daemon on a Unix
socket, the gRPC front behind its HTTP/2 sniffing) running a test dispatcher that drives the real Environment
layer in-process on the fake driver. Both transports must give the same objects; errors carry the same details;
a watch resumed from its last revision loses nothing; a result that does not fit the .proto fails loudly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import status_pb2

from vz_core.api import ApiError, Client, pb
from vz_core.daemon import Daemon, DaemonPaths
from vz_core.daemon._errors import encode_error
from vz_core.daemon._events import EventLog
from vz_core.daemon._grpc import GrpcFront
from vz_core.env import Context, Progress, SelectionNotFoundError, delete, list_volumes, status, stop, up
from vz_core.errors import NotFoundError

TRANSPORTS = ["local", "grpc"]


class Collect(Progress):
    """Collects an operation's progress as the daemon sends it (the --json line without "command")."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    @contextmanager
    def step(self, action: str, message: str, **fields: Any) -> Iterator[None]:
        line = {"event": "step", "action": action, "message": message}
        self.sent.append({**line, "status": "started", **fields})
        yield
        self.sent.append({**line, "status": "succeeded", "seconds": 0.01, **fields})

    def note(self, kind: str, message: str, **fields: Any) -> None:
        self.sent.append({"event": kind if kind == "plan" else "note", "kind": kind, "message": message, **fields})


class Dispatcher:
    """A small service: the real Environment functions, in-process, plus echo exec, logs and the event log."""

    def __init__(self, events: EventLog) -> None:
        self.events = events
        self.fixed: dict[str, Any] | None = None
        self.calls: list[str] = []
        self.peers: list[int | None] = []

    def context(self, request: dict[str, Any], progress: Progress | None = None) -> Context:
        ctx = request["context"]
        return Context(cwd=Path(ctx["cwd"]), environ=dict(ctx["environ"]), progress=progress or Progress())

    async def __call__(self, call: Any) -> dict[str, Any]:
        method, request = call.method, call.request
        self.calls.append(method)
        self.peers.append(call.peer_pid)
        try:
            return await self._serve(call, method, request)
        except Exception as exc:
            # What the daemon's service does: the error object is encoded once, with the CLI's table.
            from vz_core.daemon._errors import CallFailed

            raise CallFailed(encode_error(exc)) from exc

    async def _serve(self, call: Any, method: str, request: dict[str, Any]) -> dict[str, Any]:
        if method in ("Environments.Up", "Environments.Stop", "Environments.Delete"):
            progress = Collect()
            ctx = self.context(request, progress)
            env = request.get("environment")
            if method == "Environments.Up":
                result = await up(ctx, environment=env, recreate=request["recreate"], dry_run=request["dry_run"])
            elif method == "Environments.Stop":
                result = await stop(ctx, environment=env)
            else:
                result = await delete(ctx, environment=env, keep_volumes=request["keep_volumes"])
            for message in progress.sent:
                await call.progress(message)
            self.events.append("operation.finished", result["environment"]["id"], None, {"method": method})
            return result
        if method == "Environments.Get":
            if request.get("environment") == "driver-broke":
                raise NotFoundError(
                    "no Machine 'web' in the driver", runtime_message="find: gone", details={"workspace": "w1"}
                )
            return await status(self.context(request), environment=request.get("environment"))
        if method == "Environments.List":
            if self.fixed is not None:
                return self.fixed
            return await status(self.context(request), all_environments=True)
        if method in ("Machines.Get", "Machines.List"):
            report = await status(self.context(request), environment=request.get("environment"))
            env = report["environments"][0]
            where = {"id": env["id"], "name": env["name"]}
            if method == "Machines.List":
                return {"environment": where, "machines": env["machines"]}
            return {**env["machines"][0], "environment": where}
        if method in ("Environments.Watch", "Machines.Watch", "System.Events"):
            kinds = {"Environments.Watch": ("environment.", "operation."), "Machines.Watch": ("machine.",)}
            follow = request.get("follow", True)
            last = request["from_revision"]
            if not follow:
                for event in self.events.since(last):
                    await call.event(event)
                    last = event["revision"]
                return {"revision": last}
            async for event in self.events.follow(last, kinds=kinds.get(method, ())):
                await call.event(event)
            return {"revision": last}
        if method == "Machines.Exec":
            return await self._exec(call, request)
        if method == "Machines.Logs":
            await call.write(1, b"log line 1\nlog line 2\n")
            return {}
        if method == "Volumes.List":
            return await list_volumes(self.context(request))
        if method == "System.Status":
            return {
                "pid": os.getpid(),
                "version": "test",
                "fingerprint": "f",
                "started": "2026-01-01T00:00:00+00:00",
                "uptime_seconds": 1.5,
                "busy": False,
                "plugins": [],
                "operations": [],
                "socket": "/x",
                "home": "/h",
                "connections": 1,
                "idle_timeout": 0.0,
            }
        if method == "System.Capabilities":
            return {"drivers": [{"name": "nope", "error": {"code": "NOT_FOUND", "message": "no driver 'nope'"}}]}
        if method == "Test.Misfit":
            raise AssertionError("unreachable")
        raise AssertionError(f"the test dispatcher does not serve {method}")

    async def _exec(self, call: Any, request: dict[str, Any]) -> dict[str, Any]:
        argv = request["argv"]
        if argv == ["misfit"]:
            return {"exit_code": 0, "signal": None, "surprise": True}
        if argv == ["refuse"]:  # refused before reading any input, as the service does for a bad selection
            raise SelectionNotFoundError("project 'demo' has no Environment yet; create one with `vz up`")
        stdio = request["stdio"]
        fds = list(call.fds)
        in_fd = fds.pop(0) if stdio[0] else None
        out_fd = fds.pop(0) if stdio[1] else None
        data = bytearray()
        if in_fd is not None:
            while chunk := os.read(in_fd, 65536):
                data.extend(chunk)
        else:
            while True:
                message = await call.receive()
                if message is None:
                    return {"exit_code": 130, "signal": "SIGINT"}
                if isinstance(message, tuple):
                    data.extend(message[1])
                elif "stdin_close" in message:
                    break
        answer = bytes(data).upper() + f" argv={' '.join(argv)}".encode()
        if out_fd is not None:
            os.write(out_fd, answer)
        else:
            await call.write(1, answer)
        await call.write(2, b"to stderr")
        return {"exit_code": 3, "signal": None}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    root = tmp_path / "proj"
    root.mkdir()
    machine = {"name": "web", "profile": "developer", "driver": "fake", "image": "vz:default"}
    definition = {"version": 1, "project_id": "demo", "machines": [{**machine, "workspace": {"projection": "none"}}]}
    (root / "vz.json").write_text(json.dumps(definition))
    return root


@contextlib.asynccontextmanager
async def daemon(tmp_path: Path) -> AsyncIterator[tuple[DaemonPaths, Dispatcher, GrpcFront]]:
    paths = DaemonPaths(str(tmp_path / "home"))
    events = EventLog(tmp_path / "home" / "state.db", poll_interval=0.1)
    dispatcher = Dispatcher(events)
    server = Daemon(paths, dispatcher, handle_signals=False, idle_timeout=0.0)
    front = GrpcFront(server.dispatch, paths.directory)
    server.http2 = front.handle
    server.on_shutdown.insert(0, front.close)
    ready = asyncio.Event()
    serving = asyncio.ensure_future(server.serve(ready=lambda: ready.set()))
    waiter = asyncio.ensure_future(ready.wait())
    await asyncio.wait([serving, waiter], return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        waiter.cancel()
        serving.result()
    await front.start()
    try:
        yield paths, dispatcher, front
    finally:
        server.request_shutdown("test over")
        await asyncio.wait_for(serving, 30)
        events.close()


def client(paths: DaemonPaths, transport: str, project: Path) -> Client:
    context: dict[str, Any] = {"cwd": str(project), "environ": {}, "definition_file": None}
    return Client(paths.home, autostart=False, transport=transport, context=context)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_up_status_stop_delete(transport: str, tmp_path: Path, project: Path) -> None:
    async with daemon(tmp_path) as (paths, _, _front):

        def run() -> dict[str, Any]:
            with client(paths, transport, project) as api:
                op = api.up()
                seen = [p for p in op]
                created = op.result()
                report = api.status()
                env = api.environment()
                machines = api.machines()
                one = api.machine()
                stopped = api.stop().result()
                deleted = api.delete().result()
                return {
                    "seen": seen,
                    "progress": op.progress,
                    "created": created,
                    "report": report,
                    "env": env,
                    "machines": machines,
                    "one": one,
                    "stopped": stopped,
                    "deleted": deleted,
                    "volumes": api.volumes(),
                }

        got = await asyncio.to_thread(run)
    created = got["created"]
    assert created.environment.name == "default" and created.environment.state == "running"
    assert [m["name"] for m in created.machines] == ["web"] and created.dry_run is False
    assert got["seen"] == got["progress"] and {p.event for p in got["seen"]} >= {"step", "note", "plan"}
    assert any(p.action == "create" and p.status == "succeeded" and p.seconds is not None for p in got["seen"])
    env = got["env"]
    assert env.id == created.environment.id and env.machines[0].state == "running"
    assert env.machines[0].health is not None and env.machines[0].health["source"] == "driver"
    assert got["report"].schema == "vz.status/1" and got["report"].environments[0].id == env.id
    assert [m.name for m in got["machines"]] == ["web"] and got["one"]["environment"]["id"] == env.id
    assert got["stopped"].environment.state == "stopped" and got["stopped"].machines[0]["state"] == "stopped"
    assert got["deleted"].environment.state == "deleted" and got["deleted"].operations_removed >= 1
    assert got["volumes"] == []


async def test_both_transports_return_the_identical_objects(tmp_path: Path, project: Path) -> None:
    async with daemon(tmp_path) as (paths, dispatcher, _front):
        await up(Context(cwd=project, environ={}))
        dispatcher.fixed = await status(Context(cwd=project, environ={}), all_environments=True)

        def run(transport: str) -> Any:
            with client(paths, transport, project) as api:
                return api.status(all=True), api.daemon_status(), api.capabilities(), list(api.logs())

        local, remote = await asyncio.to_thread(run, "local"), await asyncio.to_thread(run, "grpc")
        leftovers = [n for n in os.listdir(paths.directory) if n not in ("vz.sock", "grpc.sock")]
        assert all(not n.startswith("p") or n.endswith(".json") for n in leftovers), leftovers  # names unlinked
    assert dispatcher.peers == [os.getpid()] * 8  # the client's pid reaches the call on both fronts
    assert local == remote
    assert local[0] == dispatcher.fixed and json.dumps(local[0]) == json.dumps(dispatcher.fixed)
    assert local[1].pid == os.getpid() and local[2][0].error == {"code": "NOT_FOUND", "message": "no driver 'nope'"}
    assert b"".join(local[3]) == b"log line 1\nlog line 2\n"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_exec_streams_bytes_and_passes_descriptors(transport: str, tmp_path: Path, project: Path) -> None:
    async with daemon(tmp_path) as (paths, _, _front):
        read_end, write_end = os.pipe()
        in_read, in_write = os.pipe()
        os.write(in_write, b"from a pipe")
        os.close(in_write)
        try:

            def run() -> Any:
                with client(paths, transport, project) as api:
                    captured = api.exec(["cat"], stdin=b"hello")
                    passed = api.exec(["cat", "-"], stdin=in_read, stdout=write_end)
                    with api.open_exec(["live"]) as call:
                        call.send(0, b"abc")
                        call.send(0, b"def")
                        call.close_stdin()
                        messages = []
                        while True:
                            message = call.receive()
                            messages.append(message)
                            if message[0] == "result":
                                break
                    return captured, passed, messages

            captured, passed, messages = await asyncio.to_thread(run)
            os.close(write_end)
            write_end = -1
            piped = os.read(read_end, 65536)
        finally:
            for fd in (read_end, write_end, in_read):
                if fd >= 0:
                    os.close(fd)
    assert captured.exit_code == 3 and captured.signal is None
    assert captured.stdout == b"HELLO argv=cat" and captured.stderr == b"to stderr"
    assert passed.exit_code == 3 and passed.stdout == b"" and piped == b"FROM A PIPE argv=cat -"
    assert messages[0] == ("output", 1, b"ABCDEF argv=live") and messages[1] == ("output", 2, b"to stderr")
    assert messages[-1][0] == "result" and messages[-1][1] == {"exit_code": 3, "signal": None}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_watch_resumed_from_its_last_revision_loses_nothing(
    transport: str, tmp_path: Path, project: Path
) -> None:
    async with daemon(tmp_path) as (paths, dispatcher, _front):
        log = dispatcher.events
        for i in range(3):
            log.append("environment.updated", "env_a", None, {"i": i})

        def first() -> tuple[list[int], int]:
            with client(paths, transport, project) as api, api.watch(0) as stream:
                got = [next(stream).data["i"] for _ in range(3)]
                return got, stream.last_revision

        seen, last = await asyncio.to_thread(first)
        for i in range(3, 6):  # while nobody watches
            log.append("environment.updated", "env_a", None, {"i": i})
        log.append("machine.state", "env_a", "mch_a", {"i": -1})  # not an Environment event

        def again() -> tuple[list[int], list[int]]:
            with client(paths, transport, project) as api:
                with api.watch(last) as stream:
                    rest = [next(stream).data["i"] for _ in range(3)]
                every = [e.revision for e in api.events(0)]
                return rest, every

        rest, every = await asyncio.to_thread(again)
    assert seen + rest == list(range(6)) and last == 3
    assert every == list(range(1, 8))  # System.Events without follow: everything, then the end


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_errors_carry_kind_exit_code_and_the_runtime_error(transport: str, tmp_path: Path, project: Path) -> None:
    async with daemon(tmp_path) as (paths, _, _front):

        def run() -> tuple[ApiError, ApiError, ApiError]:
            with client(paths, transport, project) as api:
                api.up().result()
                errors = []
                for env in ("nope", "driver-broke"):
                    try:
                        api.environment(env)
                    except ApiError as exc:
                        errors.append(exc)
                try:
                    api.stop("nope").result()
                except ApiError as exc:
                    errors.append(exc)
                return errors[0], errors[1], errors[2]

        missing, broke, stop_missing = await asyncio.to_thread(run)
    assert (missing.code, missing.kind, missing.exit_code, missing.details) == ("NOT_FOUND", "not_found", 3, None)
    assert "nope" in missing.message and stop_missing.exit_code == 3
    assert (broke.code, broke.exit_code) == ("NOT_FOUND", 3)
    assert broke.details == {
        "code": "RUNTIME_ERROR_CODE_NOT_FOUND",
        "message": "no Machine 'web' in the driver",
        "runtime_message": "find: gone",
        "retryable": False,
        "details": {"workspace": "w1"},
    }


async def test_grpc_status_has_the_runtime_error_and_the_error_info(tmp_path: Path, project: Path) -> None:
    async with daemon(tmp_path) as (paths, _, _front):

        def run() -> Any:
            channel = grpc.insecure_channel("unix:" + paths.socket)  # through the daemon's own socket
            try:
                get = channel.unary_unary(
                    "/vz.api.v1.Environments/Get",
                    request_serializer=pb.api_pb2.GetEnvironmentRequest.SerializeToString,
                    response_deserializer=pb.api_pb2.StatusReport.FromString,
                )
                context = pb.api_pb2.Context(cwd=str(project))
                with pytest.raises(grpc.RpcError) as info:
                    get(pb.api_pb2.GetEnvironmentRequest(context=context, environment="driver-broke"), timeout=30)
                return info.value
            finally:
                channel.close()

        err = await asyncio.to_thread(run)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    raw = dict(err.trailing_metadata())["grpc-status-details-bin"]
    details = status_pb2.Status.FromString(raw).details
    assert [d.type_url for d in details] == [pb.RUNTIME_ERROR_TYPE_URL, pb.API_ERROR_TYPE_URL]
    runtime = pb.runtime_pb2.RuntimeError()
    details[0].Unpack(runtime)
    assert runtime.runtime_message == "find: gone" and dict(runtime.details) == {"workspace": "w1"}
    info = pb.api_pb2.ErrorInfo()
    details[1].Unpack(info)
    assert (info.kind, info.exit_code) == ("not_found", 3)


async def test_a_result_that_does_not_fit_the_proto_fails_loudly(tmp_path: Path, project: Path) -> None:
    async with daemon(tmp_path) as (paths, _, _front):

        def run(transport: str) -> Any:
            with client(paths, transport, project) as api:
                try:
                    return api.exec(["misfit"])
                except ApiError as exc:
                    return exc

        local = await asyncio.to_thread(run, "local")
        remote = await asyncio.to_thread(run, "grpc")
    assert local["surprise"] is True  # the local wire passes JSON through
    assert isinstance(remote, ApiError) and remote.code == "RUNTIME_FAILURE"
    assert "does not fit vz.api.v1" in remote.message and "surprise" in remote.message


async def test_cancel_of_a_watch_and_unknown_transport(tmp_path: Path, project: Path) -> None:
    with pytest.raises(ValueError, match="transport must be 'local' or 'grpc'"):
        Client(transport="tcp")
    async with daemon(tmp_path) as (paths, dispatcher, _front):

        def run() -> None:
            with client(paths, "grpc", project) as api:
                stream = api.watch(0)
                dispatcher.events.append("environment.updated", None, None, {})
                assert next(stream).kind == "environment.updated"
                stream.close()

        await asyncio.to_thread(run)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_cancelling_an_exec_ends_it_as_interrupted(transport: str, tmp_path: Path, project: Path) -> None:
    async with daemon(tmp_path) as (paths, _, _front):

        def run() -> ApiError:
            with client(paths, transport, project) as api, api.open_exec(["live"]) as call:
                call.send(0, b"partial")
                call.cancel()
                with pytest.raises(ApiError) as info:
                    while True:
                        call.receive()
                return info.value

        error = await asyncio.to_thread(run)
    assert (error.code, error.kind, error.exit_code) == ("CANCELLED", "interrupted", 130)


def test_a_terminal_descriptor_never_enters_a_call(tmp_path: Path) -> None:
    primary, secondary = os.openpty()
    try:
        api = Client(tmp_path / "home", autostart=False)
        with pytest.raises(ValueError, match="is a terminal: a terminal never enters a Machine"):
            api.open_exec(["sh"], stdio=(secondary, None, None))
        with pytest.raises(ValueError, match="non-empty argv"):
            api.open_exec([])
    finally:
        os.close(primary)
        os.close(secondary)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_exec_refused_at_once_reports_the_reason_not_a_broken_pipe(
    transport: str, tmp_path: Path, project: Path
) -> None:
    async with daemon(tmp_path) as (paths, _, _front):

        def run() -> ApiError:
            with client(paths, transport, project) as api:
                with pytest.raises(ApiError) as info:
                    api.exec(["refuse"], stdin=b"x" * (4 << 20))  # more than the socket buffers hold
                return info.value

        error = await asyncio.to_thread(run)
    assert (error.code, error.exit_code) == ("NOT_FOUND", 3) and "no Environment" in error.message
