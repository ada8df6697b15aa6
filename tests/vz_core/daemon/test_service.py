"""The daemon service: every method dispatched over the Environment layer with the reference fake driver
in-process (``warm_sessions=False``), through a Call with the server's interface."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vz_core.daemon._errors import CallFailed, classify_error, encode_error
from vz_core.daemon._service import Service
from vz_core.env import Context, Store, up
from vz_core.wire import METHODS

SECRET = "s3cr3t-token-value"


class FakeCall:
    """A call as the server hands it over: request, fds, client messages in, everything sent recorded."""

    def __init__(self, method: str, request: dict[str, Any], *, fds: list[int] | None = None) -> None:
        self.method = method
        self.request = request
        self.fds = list(fds or [])
        self.peer_pid: int | None = os.getpid()
        self.cancelled = asyncio.Event()
        self.sent: list[tuple[str, Any]] = []
        self.inbox: asyncio.Queue[dict[str, Any] | tuple[int, bytes] | None] = asyncio.Queue()
        self.progressed = asyncio.Event()
        self.evented = asyncio.Event()

    async def progress(self, message: dict[str, Any]) -> None:
        self.sent.append(("progress", message))
        self.progressed.set()

    async def event(self, message: dict[str, Any]) -> None:
        self.sent.append(("event", message))
        self.evented.set()

    async def write(self, stream: int, data: bytes) -> None:
        self.sent.append(("B", (stream, data)))

    async def receive(self) -> dict[str, Any] | tuple[int, bytes] | None:
        return await self.inbox.get()

    def progress_messages(self) -> list[dict[str, Any]]:
        return [m for kind, m in self.sent if kind == "progress"]

    def output(self, stream: int) -> bytes:
        return b"".join(d for kind, (s, d) in ((k, m) for k, m in self.sent if k == "B") if s == stream)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VZ_ENVIRONMENT_ID", raising=False)
    root = tmp_path / "proj"
    root.mkdir()
    machine = {
        "name": "web",
        "profile": "developer",
        "driver": "fake",
        "image": "vz:default",
        "workspace": {"projection": "none"},
        "environment": {"TOKEN": {"from_env": "MY_TOKEN"}},
    }
    (root / "vz.json").write_text(json.dumps({"version": 1, "project_id": "demo", "machines": [machine]}))
    return root


def context(root: Path, **extra: Any) -> dict[str, Any]:
    return {"cwd": str(root), "environ": {"MY_TOKEN": SECRET}, "definition_file": None, **extra}


async def until(call: FakeCall, wanted: Any) -> None:
    """Wait until ``call`` has sent a progress message for which ``wanted(message)`` is true."""
    while not any(wanted(m) for m in call.progress_messages()):
        call.progressed.clear()
        await call.progressed.wait()


class Events:
    """The state directory's event log (``EventLog``), read back whole."""

    def __init__(self) -> None:
        from vz_core.daemon._events import EventLog

        self.log = EventLog()

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.log.since(0, 100000)


@pytest.fixture
def events(project: Path) -> Iterator[Events]:
    log = Events()
    yield log
    log.log.close()


async def _service(events: Events | None = None) -> Service:
    service = Service(warm_sessions=False, events=events.log if events is not None else None)
    await service.start()
    return service


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


async def _up(service: Service, root: Path, **request: Any) -> tuple[FakeCall, dict[str, Any]]:
    call = FakeCall("Environments.Up", {"context": context(root), **request})
    return call, await service.dispatch(call)


# --- Environments ----------------------------------------------------------------------------------------------


def test_up_progress_is_the_cli_json_lines_of_the_same_up_and_the_result_its_report(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: Events
) -> None:
    async def main() -> tuple[FakeCall, dict[str, Any]]:
        service = await _service(events)
        try:
            return await _up(service, project)
        finally:
            await service.close()

    call, result = run(main())
    # The same vz.json, the same state (a second home), run directly: each step and note the Environment layer
    # reported, as the `--json` events of docs/cli.md describe them (a step: started, then succeeded or failed
    # with seconds; a note: "note", or "plan" for the plan), without "command".
    from contextlib import contextmanager

    from vz_core.env import Progress

    lines: list[dict[str, Any]] = []

    class Reference(Progress):
        @contextmanager
        def step(self, action: str, message: str, **fields: Any) -> Iterator[None]:
            lines.append({"event": "step", "action": action, "status": "started", "message": message, **fields})
            yield
            lines.append(
                {"event": "step", "action": action, "status": "succeeded", "message": message, "seconds": 0, **fields}
            )

        def note(self, kind: str, message: str, **fields: Any) -> None:
            lines.append({"event": "plan" if kind == "plan" else "note", "kind": kind, "message": message, **fields})

    monkeypatch.setenv("VZ_HOME", str(tmp_path / "other-home"))
    direct = asyncio.run(up(Context(cwd=project, environ={"MY_TOKEN": SECRET}, progress=Reference())))

    def shape(message: dict[str, Any]) -> tuple[Any, ...]:
        return (message["event"], message.get("action"), message.get("status"), message.get("kind"), sorted(message))

    sent = call.progress_messages()
    assert [shape(m) for m in sent] == [shape(m) for m in lines]
    assert [m["message"] for m in sent if m["event"] == "step"] == [m["message"] for m in lines if m["event"] == "step"]
    assert sorted(result) == sorted(direct)
    assert result["environment"]["state"] == "running" and result["machines"][0]["state"] == "running"
    assert SECRET not in json.dumps(call.sent) + json.dumps(result) + json.dumps(events.events)
    assert "MY_TOKEN" not in os.environ  # the caller's environment stays in the call's memory


def test_get_shows_live_health_from_the_driver_beside_the_record(project: Path, events: Events) -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        service = await _service(events)
        try:
            await _up(service, project)
            first = await service.dispatch(FakeCall("Environments.Get", {"context": context(project)}))
            from vz_conformance.fake import FakeDriver

            machine = first["environments"][0]["machines"][0]
            await FakeDriver().delete(machine["workspace_id"])  # gone behind vz's back
            second = await service.dispatch(FakeCall("Environments.Get", {"context": context(project)}))
            return first, second
        finally:
            await service.close()

    first, second = run(main())
    env, machine = first["environments"][0], first["environments"][0]["machines"][0]
    assert machine["health"]["source"] == "driver" and machine["health"]["state"] == "running"
    assert env["health"]["state"] == "running"
    for key in ("id", "name", "state", "recorded_state", "find", "driver", "drift"):  # old consumers keep working
        assert key in machine
    gone = second["environments"][0]["machines"][0]
    assert (gone["health"]["state"], gone["recorded_state"], gone["state"]) == ("missing", "running", "missing")
    assert second["environments"][0]["health"]["state"] == "degraded"
    observed = [e for e in events.events if e["kind"] == "machine.state" and e["data"]["source"] == "driver"]
    assert [e["data"]["state"] for e in observed] == ["missing"]


def test_up_stop_delete_publish_operation_machine_and_environment_events(project: Path, events: Events) -> None:
    seen: list[dict[str, Any]] = []

    async def main() -> None:
        service = await _service(events)
        try:
            await _up(service, project)
            await service.dispatch(FakeCall("Environments.Stop", {"context": context(project)}))
            await service.dispatch(FakeCall("Environments.Delete", {"context": context(project)}))
            seen.extend(events.events)  # what a watcher reads right after the deletion
        finally:
            await service.close()

    run(main())
    summary = [(e["kind"], e["data"].get("state") or e["data"].get("status") or e["data"].get("method")) for e in seen]
    assert summary[0] == ("operation.started", "Environments.Up")
    assert ("environment.updated", "creating") in summary or ("environment.updated", "running") in summary
    assert ("machine.state", "running") in summary
    assert summary.index(("operation.finished", "succeeded")) < summary.index(
        ("operation.started", "Environments.Stop")
    )
    assert ("machine.state", "stopped") in summary and ("environment.updated", "stopped") in summary
    assert summary[-2:] == [("environment.updated", "deleted"), ("operation.finished", "succeeded")]
    finished = [e for e in seen if e["kind"] == "operation.finished"]
    assert all(e["environment_id"] and e["data"]["operation_id"] for e in finished)
    # Then the deleted Environment's events leave the log (at the latest when the service closes): `vz delete`
    # leaves nothing of it on disk.
    env_id = finished[-1]["environment_id"]
    assert [e for e in events.events if e["environment_id"] == env_id] == []


def test_watch_streams_from_a_revision_until_cancelled(project: Path, events: Events) -> None:
    async def main() -> tuple[FakeCall, int]:
        service = await _service(events)
        try:
            await _up(service, project)
            middle = len(events.events) // 2
            watch = FakeCall("Environments.Watch", {"from_revision": middle})
            task = asyncio.ensure_future(service.dispatch(watch))
            await asyncio.sleep(0.2)
            await service.dispatch(FakeCall("Environments.Stop", {"context": context(project)}))
            await asyncio.sleep(0.2)
            watch.cancelled.set()
            with pytest.raises(CallFailed) as failed:
                await task
            assert failed.value.error["kind"] == "interrupted"
            return watch, middle
        finally:
            await service.close()

    watch, middle = run(main())
    streamed = [m for kind, m in watch.sent if kind == "event"]
    expected = [e for e in events.events[middle:] if e["kind"].startswith(("environment.", "operation."))]
    assert streamed == expected and any(e["data"].get("method") == "Environments.Stop" for e in streamed)


def test_two_concurrent_ups_of_one_environment_serialize_and_the_loop_stays_free(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vz_conformance.fake._driver import FakeDriver

    release = asyncio.Event()
    real_start = FakeDriver.start

    async def held_start(self: FakeDriver, workspace_id: str) -> None:
        await release.wait()
        await real_start(self, workspace_id)

    async def main() -> tuple[FakeCall, dict[str, Any], dict[str, Any], dict[str, Any]]:
        service = await _service()
        try:
            await _up(service, project)
            await service.dispatch(FakeCall("Environments.Stop", {"context": context(project)}))
            monkeypatch.setattr(FakeDriver, "start", held_start)
            first = FakeCall("Environments.Up", {"context": context(project)})
            first.peer_pid = 4242  # the client that holds the lock, as the waiter is told
            second = FakeCall("Environments.Up", {"context": context(project)})
            one = asyncio.ensure_future(service.dispatch(first))
            await until(first, lambda m: m.get("action") == "start")
            two = asyncio.ensure_future(service.dispatch(second))
            await until(second, lambda m: m.get("kind") == "waiting")
            # While one Up works and the other waits for its lock, the loop serves other calls.
            status = await service.dispatch(FakeCall("System.Status", {}))
            release.set()
            return second, await one, await two, status
        finally:
            await service.close()

    second, one, two, status = run(main())
    assert [s["action"] for s in one["plan"]["steps"]] == ["start"]
    assert [s["action"] for s in two["plan"]["steps"]] == ["keep"]  # it saw what the first one did
    waiting = next(m for m in second.progress_messages() if m.get("kind") == "waiting")
    assert "waiting for another operation" in waiting["message"]
    assert waiting["holder"] == f"vz up (pid 4242, run by the vz daemon, pid {os.getpid()})"
    assert sorted(op["method"] for op in status["operations"]) == ["Environments.Up", "Environments.Up"]
    assert status["busy"] is True


def test_a_client_that_goes_away_interrupts_the_up_and_the_operation_says_so(
    project: Path, monkeypatch: pytest.MonkeyPatch, events: Events
) -> None:
    from vz_conformance.fake._driver import FakeDriver

    async def never(self: FakeDriver, request: Any) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(FakeDriver, "run_image", never)

    async def main() -> tuple[FakeCall, CallFailed]:
        service = await _service(events)
        try:
            call = FakeCall("Environments.Up", {"context": context(project)})
            task = asyncio.ensure_future(service.dispatch(call))
            await until(call, lambda m: m.get("action") == "create")
            await call.inbox.put(None)  # the connection closed
            with pytest.raises(CallFailed) as failed:
                await task
            return call, failed.value
        finally:
            await service.close()

    call, failed = run(main())
    assert (failed.error["kind"], failed.error["exit_code"], failed.error["code"]) == ("interrupted", 130, "CANCELLED")
    assert "client closed the connection" in failed.error["message"]
    assert call.progress_messages()[-1]["status"] == "failed"  # the failed step was sent before the error
    with Store() as store:
        env = store.environments("demo")[0]
        op = store.operations(env.env_id)[-1]
    assert (op.kind, op.status, op.step) == ("up", "interrupted", "create web")
    assert events.events[-1]["data"]["status"] == "interrupted"


def test_a_call_the_server_cancels_interrupts_the_operation_the_same_way(
    project: Path, monkeypatch: pytest.MonkeyPatch, events: Events
) -> None:
    from vz_conformance.fake._driver import FakeDriver

    async def never(self: FakeDriver, request: Any) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(FakeDriver, "run_image", never)

    async def main() -> FakeCall:
        service = await _service(events)
        try:
            call = FakeCall("Environments.Up", {"context": context(project)})
            task = asyncio.ensure_future(service.dispatch(call))
            await until(call, lambda m: m.get("action") == "create")
            call.cancelled.set()
            task.cancel()  # what the listener does on {"cancel": {}}
            with pytest.raises(asyncio.CancelledError):
                await task
            return call
        finally:
            await service.close()

    call = run(main())
    assert call.progress_messages()[-1]["status"] == "failed"
    with Store() as store:
        op = store.operations(store.environments("demo")[0].env_id)[-1]
    assert (op.status, op.step) == ("interrupted", "create web")
    finished = events.events[-1]
    assert finished["kind"] == "operation.finished" and finished["data"]["status"] == "interrupted"
    assert finished["data"]["error"]["exit_code"] == 130


# --- requests and errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "request_", "field"),
    [
        ("Environments.Up", {"recreate": True}, "request.context"),
        ("Environments.Up", {"context": {"cwd": "relative/dir"}}, "request.context.cwd"),
        ("Environments.Up", {"context": {"cwd": "/", "environ": {"A": 1}}}, "request.context.environ.A"),
        ("Environments.Up", {"context": {"cwd": "/", "shell": "bash"}}, "request.context.shell"),
        ("Environments.Up", {"context": {"cwd": "/"}, "recreate": "yes"}, "request.recreate"),
        ("Environments.Up", {"context": {"cwd": "/"}, "force": True}, "request.force"),
        ("Machines.Exec", {"context": {"cwd": "/"}, "argv": []}, "request.argv"),
        ("Machines.Exec", {"context": {"cwd": "/"}, "argv": ["sh", 3]}, "request.argv[1]"),
        ("Machines.Exec", {"context": {"cwd": "/"}, "argv": ["sh"], "rows": 0}, "request.rows"),
        ("Machines.Exec", {"context": {"cwd": "/"}, "argv": ["sh"], "stdio": [True]}, "request.stdio"),
        ("Machines.Exec", {"context": {"cwd": "/"}, "argv": ["sh"], "stdio": [True, False, False]}, "request.stdio"),
        ("Volumes.Remove", {"context": {"cwd": "/"}}, "request.name"),
        ("System.Status", {"verbose": True}, "request.verbose"),
    ],
)
def test_bad_requests_fail_naming_the_field_before_anything_runs(
    project: Path, method: str, request_: dict[str, Any], field: str
) -> None:
    async def main() -> CallFailed:
        service = await _service()
        try:
            with pytest.raises(CallFailed) as failed:
                await service.dispatch(FakeCall(method, request_))
            return failed.value
        finally:
            await service.close()

    error = run(main()).error
    assert (error["code"], error["kind"], error["exit_code"]) == ("INVALID_ARGUMENT", "user_error", 2)
    assert f"request field {field}:" in error["message"]
    with Store() as store:
        assert store.environments() == []


def test_unknown_method_and_unknown_environment_errors(project: Path) -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        service = await _service()
        try:
            await _up(service, project)
            errors = []
            for call in (
                FakeCall("Environments.Frobnicate", {}),
                FakeCall("Environments.Get", {"context": context(project), "environment": "nope"}),
            ):
                with pytest.raises(CallFailed) as failed:
                    await service.dispatch(call)
                errors.append(failed.value.error)
            return errors[0], errors[1]
        finally:
            await service.close()

    unknown, missing = run(main())
    assert unknown["kind"] == "user_error" and "Environments.Up" in unknown["message"]
    assert (missing["code"], missing["kind"], missing["exit_code"]) == ("NOT_FOUND", "not_found", 3)
    assert "--environment nope" in missing["message"]


def test_error_objects_are_redacted_and_carry_the_runtime_error_of_a_driver() -> None:
    from vz_core.errors import RuntimeFailureError
    from vz_core.redact import Redactor

    redactor = Redactor([SECRET], short_tokens=True)
    exc = RuntimeFailureError(
        f"boom {SECRET}", runtime_message=f"trace {SECRET}", details={"arg": SECRET}, retryable=True
    )
    error = encode_error(exc, redactor)
    assert SECRET not in json.dumps(error)
    assert (error["code"], error["kind"], error["exit_code"]) == ("RUNTIME_FAILURE", "backend_failure", 1)
    assert error["details"] == {
        "code": "RUNTIME_ERROR_CODE_RUNTIME_FAILURE",
        "message": "boom ***",
        "runtime_message": "trace ***",
        "retryable": True,
        "details": {"arg": "***"},
    }
    bug = encode_error(KeyError("x"))
    assert bug["code"] == "UNKNOWN" and bug["details"] is None and "KeyError" in bug["message"]


def test_the_exit_code_table_is_the_clis() -> None:
    from vz_core.cli._exit import classify
    from vz_core.env import (
        AmbiguousSelectionError,
        ConflictError,
        DefinitionError,
        DefinitionNotFoundError,
        PlanError,
        SelectionNotFoundError,
        StoreBusyError,
    )
    from vz_core.errors import (
        AlreadyExistsError,
        FailedPreconditionError,
        NotFoundError,
        OperationCancelledError,
        PluginError,
        TrustError,
        UnavailableError,
        UnsupportedError,
        UserError,
    )

    samples = [
        DefinitionNotFoundError("x"),
        SelectionNotFoundError("x"),
        NotFoundError("x"),
        AmbiguousSelectionError("x"),
        ConflictError("x"),
        PlanError("x"),
        AlreadyExistsError("x"),
        StoreBusyError("x"),
        OperationCancelledError("x"),
        UserError("x"),
        DefinitionError("x"),
        UnsupportedError("x"),
        FailedPreconditionError("x"),
        UnavailableError("x"),
        TrustError("x"),
        PluginError("x"),
    ]
    for exc in samples:
        assert classify_error(exc) == classify(exc), exc
    assert classify_error(asyncio.CancelledError()) == (130, "interrupted")


# --- Machines --------------------------------------------------------------------------------------------------


def _exec_service_run(project: Path, scenario: Any) -> Any:
    async def main() -> Any:
        service = await _service()
        try:
            await _up(service, project)
            return await scenario(service)
        finally:
            await service.close()

    return run(main())


def test_exec_streams_travel_as_messages(project: Path) -> None:
    async def scenario(service: Service) -> tuple[FakeCall, dict[str, Any]]:
        call = FakeCall(
            "Machines.Exec",
            {"context": context(project), "argv": ["sh", "-c", "cat; echo err >&2; exit 3"], "env": {"X": "1"}},
        )
        await call.inbox.put((0, b"hello "))
        await call.inbox.put((0, b"world\n"))
        await call.inbox.put({"stdin_close": {}})
        return call, await service.dispatch(call)

    call, result = _exec_service_run(project, scenario)
    assert result == {"exit_code": 3, "signal": None}
    assert (call.output(1), call.output(2)) == (b"hello world\n", b"err\n")


def test_exec_uses_the_descriptors_it_is_given(project: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"from a file\n" * 1000)

    async def scenario(service: Service) -> tuple[FakeCall, dict[str, Any], bytes]:
        stdin = os.open(source, os.O_RDONLY)
        read_end, write_end = os.pipe()
        try:
            call = FakeCall(
                "Machines.Exec",
                {"context": context(project), "argv": ["sh", "-c", "wc -l; echo e >&2"], "stdio": [True, True, False]},
                fds=[stdin, write_end],
            )
            result = await service.dispatch(call)
            os.close(write_end)
            write_end = -1
            out = os.read(read_end, 1000)
            return call, result, out
        finally:
            for fd in (stdin, read_end, write_end):
                if fd >= 0:
                    os.close(fd)

    call, result, out = _exec_service_run(project, scenario)
    assert result == {"exit_code": 0, "signal": None}
    assert out.strip() == b"1000" and call.output(2) == b"e\n" and call.output(1) == b""


def test_exec_refuses_a_terminal_descriptor(project: Path) -> None:
    async def scenario(service: Service) -> dict[str, Any]:
        leader, follower = os.openpty()
        try:
            call = FakeCall(
                "Machines.Exec",
                {"context": context(project), "argv": ["true"], "stdio": [True, False, False]},
                fds=[follower],
            )
            with pytest.raises(CallFailed) as failed:
                await service.dispatch(call)
            return failed.value.error
        finally:
            os.close(leader)
            os.close(follower)

    error = _exec_service_run(project, scenario)
    assert error["kind"] == "user_error" and "call.fds[0]" in error["message"] and "terminal" in error["message"]


def test_a_signal_from_the_client_kills_the_command(project: Path) -> None:
    import psutil

    marker = "1234.5678"

    async def scenario(service: Service) -> tuple[dict[str, Any], list[int]]:
        call = FakeCall("Machines.Exec", {"context": context(project), "argv": ["sleep", marker]})
        task = asyncio.ensure_future(service.dispatch(call))
        for _ in range(200):
            running = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
            if running:
                break
            await asyncio.sleep(0.05)
        await call.inbox.put({"signal": {"name": "SIGINT"}})
        result = await task
        await asyncio.sleep(0.5)
        left = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
        return result, left

    result, left = _exec_service_run(project, scenario)
    assert result == {"exit_code": 130, "signal": "SIGINT"}
    assert left == []


def test_exec_on_a_terminal_session(project: Path) -> None:
    async def scenario(service: Service) -> tuple[FakeCall, dict[str, Any]]:
        call = FakeCall(
            "Machines.Exec",
            {
                "context": context(project),
                "argv": ["sh", "-c", "stty size; read line; echo got:$line; exit 7"],
                "tty": True,
                "rows": 33,
                "cols": 101,
            },
        )
        await call.inbox.put((3, b"typed\r"))
        return call, await service.dispatch(call)

    call, result = _exec_service_run(project, scenario)
    assert result == {"exit_code": 7, "signal": None}
    screen = call.output(3)
    assert b"33 101" in screen and b"got:typed" in screen


def test_machines_get_and_list(project: Path) -> None:
    async def scenario(service: Service) -> tuple[dict[str, Any], dict[str, Any]]:
        one = await service.dispatch(FakeCall("Machines.Get", {"context": context(project), "machine": "web"}))
        every = await service.dispatch(FakeCall("Machines.List", {"context": context(project)}))
        return one, every

    one, every = _exec_service_run(project, scenario)
    assert one["name"] == "web" and one["health"]["state"] == "running"
    assert one["environment"]["name"] == "default"
    assert [m["id"] for m in every["machines"]] == [one["id"]]


# --- Volumes and System -----------------------------------------------------------------------------------------


def test_volumes_and_system(project: Path) -> None:
    async def scenario(service: Service) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        volumes = await service.dispatch(FakeCall("Volumes.List", {"context": context(project)}))
        with pytest.raises(CallFailed) as failed:
            await service.dispatch(FakeCall("Volumes.Remove", {"context": context(project), "name": "nope"}))
        caps = await service.dispatch(FakeCall("System.Capabilities", {"drivers": ["fake"]}))
        status = await service.dispatch(FakeCall("System.Status", {}))
        return volumes, failed.value.error, caps, status

    volumes, missing, caps, status = _exec_service_run(project, scenario)
    assert volumes == {"volumes": []}
    assert missing["kind"] == "not_found"
    assert [row["name"] for row in caps["drivers"]] == ["fake"] and caps["drivers"][0]["facts"]["name"] == "fake"
    assert status["pid"] == os.getpid() and status["operations"] == [] and status["busy"] is False


def test_every_method_is_served() -> None:
    service = Service(warm_sessions=False)
    assert sorted(service._methods) == sorted(METHODS)


@pytest.fixture(autouse=True)
def _no_driver_source() -> Iterator[None]:
    from vz_core.daemon._sessions import running_pool

    assert running_pool() is None
    yield
    assert running_pool() is None


def test_exec_stdin_as_messages_keeps_every_byte_in_order(project: Path) -> None:
    payload = os.urandom(3 * 1024 * 1024 + 17)

    async def scenario(service: Service) -> tuple[FakeCall, dict[str, Any]]:
        call = FakeCall("Machines.Exec", {"context": context(project), "argv": ["cat"]})
        for start in range(0, len(payload), 65536):
            await call.inbox.put((0, payload[start : start + 65536]))
        await call.inbox.put({"stdin_close": {}})
        return call, await service.dispatch(call)

    call, result = _exec_service_run(project, scenario)
    assert result == {"exit_code": 0, "signal": None}
    assert call.output(1) == payload


def test_logs_of_a_machine_are_streamed_and_masked(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vz_conformance.fake._driver import FakeDriver

    async def logs(self: FakeDriver, workspace_id: str) -> Any:
        for line in (b"one\n", f"token {SECRET}\n".encode(), b"three\n"):
            yield line

    monkeypatch.setattr(FakeDriver, "logs", logs)

    async def scenario(service: Service) -> tuple[bytes, bytes]:
        every = FakeCall("Machines.Logs", {"context": context(project)})
        assert await service.dispatch(every) == {}
        last = FakeCall("Machines.Logs", {"context": context(project), "tail": 1})
        await service.dispatch(last)
        return every.output(1), last.output(1)

    every, last = _exec_service_run(project, scenario)
    assert every == b"one\ntoken ***\nthree\n" and last == b"three\n"


def test_list_gives_the_projects_environments(project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "no-project"
    elsewhere.mkdir()

    async def scenario(service: Service) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        await service.dispatch(FakeCall("Environments.Up", {"context": context(project), "environment": "second"}))
        listed = await service.dispatch(FakeCall("Environments.List", {"context": context(project), "all": False}))
        anywhere = await service.dispatch(FakeCall("Environments.List", {"context": context(elsewhere), "all": True}))
        with pytest.raises(CallFailed) as failed:
            await service.dispatch(FakeCall("Environments.List", {"context": context(elsewhere), "all": False}))
        return listed, anywhere, failed.value.error

    listed, anywhere, error = _exec_service_run(project, scenario)
    assert sorted(e["name"] for e in listed["environments"]) == ["default", "second"]
    assert sorted(e["name"] for e in anywhere["environments"]) == ["default", "second"]
    assert anywhere["project"] is None and error["kind"] == "not_found"


def test_system_events_and_machines_watch(project: Path, events: Events) -> None:
    async def main() -> tuple[FakeCall, FakeCall, dict[str, Any], str]:
        service = await _service(events)
        try:
            _, result = await _up(service, project)
            env_id = result["environment"]["id"]
            every = FakeCall("System.Events", {"from_revision": 0, "follow": False})
            end = await service.dispatch(every)
            watch = FakeCall("Machines.Watch", {"from_revision": 0, "environment": env_id})
            task = asyncio.ensure_future(service.dispatch(watch))
            await service.dispatch(FakeCall("Environments.Stop", {"context": context(project)}))
            while not any(m["data"].get("state") == "stopped" for k, m in watch.sent if k == "event"):
                watch.evented.clear()
                await asyncio.wait_for(watch.evented.wait(), 10)
            watch.cancelled.set()
            with pytest.raises(CallFailed):
                await task
            return every, watch, end, env_id
        finally:
            await service.close()

    every, watch, end, env_id = run(main())
    streamed = [m for k, m in every.sent if k == "event"]
    assert [e["revision"] for e in streamed] == list(range(1, len(streamed) + 1))
    assert end == {"revision": streamed[-1]["revision"]}
    machine_events = [m for k, m in watch.sent if k == "event"]
    assert machine_events and all(
        e["kind"] == "machine.state" and e["environment_id"] == env_id for e in machine_events
    )
    assert [e["data"]["state"] for e in machine_events][-1] == "stopped"


def test_a_terminal_session_follows_resizes_and_ends_on_a_signal(project: Path) -> None:
    async def scenario(service: Service) -> tuple[FakeCall, dict[str, Any], dict[str, Any]]:
        call = FakeCall(
            "Machines.Exec",
            {"context": context(project), "argv": ["sh", "-c", "read a; stty size; exit 0"], "tty": True},
        )
        await call.inbox.put({"resize": {"rows": 50, "cols": 120}})
        await call.inbox.put((3, b"go\r"))
        resized = await service.dispatch(call)
        held = FakeCall("Machines.Exec", {"context": context(project), "argv": ["sh", "-c", "sleep 30"], "tty": True})
        task = asyncio.ensure_future(service.dispatch(held))
        await asyncio.sleep(0.3)
        await held.inbox.put({"signal": {"name": "TERM"}})
        return call, resized, await task

    call, resized, ended = _exec_service_run(project, scenario)
    assert resized == {"exit_code": 0, "signal": None} and b"50 120" in call.output(3)
    assert ended == {"exit_code": 143, "signal": "SIGTERM"}


def test_followed_logs_send_what_is_added_until_the_machine_stops(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vz_conformance.fake._driver import FakeDriver

    fetched: list[int] = []
    real_find = FakeDriver.find

    async def logs(self: FakeDriver, workspace_id: str) -> Any:
        fetched.append(1)
        for number in range(len(fetched)):
            yield f"line {number}\n".encode()

    async def find(self: FakeDriver, workspace_id: str) -> Any:
        return None if len(fetched) >= 3 else await real_find(self, workspace_id)

    async def scenario(service: Service) -> tuple[FakeCall, dict[str, Any]]:
        monkeypatch.setattr(FakeDriver, "logs", logs)
        monkeypatch.setattr(FakeDriver, "find", find)
        call = FakeCall("Machines.Logs", {"context": context(project), "follow": True})
        return call, await service.dispatch(call)

    call, result = _exec_service_run(project, scenario)
    assert result == {} and call.output(1) == b"line 0\nline 1\nline 2\n" and len(fetched) == 3


def test_forget_environment_drops_only_that_environments_events(tmp_path: Path) -> None:
    from vz_core.daemon._events import EventLog

    log = EventLog(tmp_path / "state.db")
    try:
        log.append("environment.updated", "env-a", None, {"change": "created"})
        kept = log.append("environment.updated", "env-b", None, {"change": "created"})
        log.append("machine.state", "env-a", "m1", {"state": "running"})
        log.append("daemon.note", None, None, {})
        assert log.forget_environment("env-a") == 2
        rows = log.since(0)
        assert [(e["environment_id"], e["kind"]) for e in rows] == [
            ("env-b", "environment.updated"),
            (None, "daemon.note"),
        ]
        assert rows[0]["revision"] == kept  # nothing renumbered
        assert log.forget_environment("") == 0
    finally:
        log.close()
