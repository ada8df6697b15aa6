"""What the vz daemon does for each method: the one dispatcher both fronts (local wire, gRPC) call.

``await service.dispatch(call)`` reads the call's request (``_calls``), runs the Environment operation it names
(``vz_core.env``: up, status, stop, delete, exec, volumes: nothing here repeats their logic), streams its
progress (``_progress``) and output, and returns the result object, or raises ``CallFailed`` carrying the wire's
error object (``_errors``), redacted with the call's secrets.

Several calls run at once on the daemon's one event loop; each gets its own ``vz_core.env.Context`` (the
client's cwd, environment variables in memory only, definition file), its own ``Redactor`` and its own
progress. Operations on one Environment serialize exactly as separate commands did: through the Environment
and project file locks (``flock`` per open file description, so two calls of one process exclude each other;
waits happen in threads, never on the loop).

What still runs on the loop, and why it is short: state-store reads and writes (SQLite in WAL mode; every
write transaction of the Environment layer and of the event log is synchronous and opened and committed
without an await in between, so calls of this process never wait for each other's locks; only another
process holding the database's write lock makes a call wait, up to the store's busy timeout), reading
vz.json (the definition model is imported at start, in a thread) and the driver registry lookups. File-lock
waits run in threads (``FileLock.acquire``), drivers are plugin processes reached over gRPC (``SessionPool``).

Cancellation: a client that closes its connection, sends ``cancel`` or a ``signal`` cancels its call's task; the
Environment layer then records the operation as interrupted (exactly what Ctrl-C did to a command) and the
next operation explains and converges. An exec's command is killed.

Events (``_events.EventLog`` when there is one): ``operation.started`` / ``operation.finished`` around every
Environment operation, ``machine.state`` when a Machine's recorded state (or the state its driver reports to a
status call) changes, ``environment.updated`` when an Environment is created, changes state or is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from vz_core.daemon._calls import MAX_WINDOW, Request, RequestError
from vz_core.daemon._errors import CallFailed, cancelled_message, encode_error
from vz_core.daemon._exec import cancel_reason, exec_streams, signal_name, stop_task, terminal
from vz_core.daemon._progress import CallProgress
from vz_core.redact import Redactor
from vz_core.wire import METHODS

__all__ = ["METHODS", "CallLike", "EventSink", "Service", "create_service", "dispatch"]


class CallLike(Protocol):
    """The interface of ``vz_core.daemon.Call`` the service uses (both fronts build one)."""

    method: str
    request: dict[str, Any]
    fds: list[int]
    peer_pid: int | None
    cancelled: asyncio.Event

    async def progress(self, message: dict[str, Any]) -> None: ...

    async def event(self, message: dict[str, Any]) -> None: ...

    async def write(self, stream: int, data: bytes) -> None: ...

    async def receive(self) -> dict[str, Any] | tuple[int, bytes] | None: ...


class EventSink(Protocol):
    """What the service needs of the event log (``vz_core.daemon._events.EventLog``)."""

    def append(self, kind: str, environment_id: str | None, machine_id: str | None, data: dict[str, Any]) -> int: ...

    def follow(
        self, from_revision: int = 0, *, environment_id: str | None = None, kinds: Sequence[str] = ()
    ) -> AsyncIterator[dict[str, Any]]: ...


FORGET_DELAY = 5.0
"""Seconds between an Environment's deletion event and the removal of its events from the log."""


def _now() -> str:
    """The current UTC time, RFC 3339 with milliseconds (as the state store writes it)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


@dataclass
class _Operation:
    number: int
    method: str
    started: str
    peer_pid: int | None
    environment: str | None = None
    environment_id: str | None = None

    def row(self) -> dict[str, Any]:
        return {
            "call": self.number,
            "method": self.method,
            "environment": self.environment,
            "environment_id": self.environment_id,
            "started": self.started,
            "peer_pid": self.peer_pid,
        }


@dataclass
class _CallState:
    """One call in progress: its request, secrets, progress and what it observed."""

    call: CallLike
    operation: _Operation
    redactor: Redactor = field(default_factory=lambda: Redactor(short_tokens=True))
    progress: CallProgress | None = None
    tracker: _Tracker | None = None
    store_path: Path | None = None
    signal: str | None = None
    cancel_reason: str | None = None


class _Tracker:
    """Turns what an operation did to the state store into events (the Environment layer reports progress with
    ``environment_id``/``machine_id`` fields; after each such report the records are compared with the last
    look)."""

    def __init__(self, service: Service, store_path: Path | None) -> None:
        self._service = service
        self._store_path = store_path
        self._store: Any = None
        self._seen: dict[str, tuple[str, str, dict[str, tuple[str, str]]] | None] = {}

    def _snapshot(self, env_id: str) -> tuple[str, str, dict[str, tuple[str, str]]] | None:
        from vz_core.env import Store

        if self._store is None:
            self._store = Store(self._store_path)
        store = self._store
        env = store.environment(env_id)
        if env is None:
            return None
        machines = {m.machine_id: (m.name, m.state) for m in store.machines(env_id)}
        return env.name, env.state, machines

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def listen(self, message: dict[str, Any]) -> None:
        env_id = message.get("environment_id")
        if not isinstance(env_id, str) or not env_id:
            return
        if env_id not in self._seen:
            baseline = None if message.get("kind") == "environment-created" else self._snapshot(env_id)
            self._seen[env_id] = baseline
            if baseline is not None:
                return
        self.compare(env_id)

    def compare(self, env_id: str, *, name: str | None = None) -> None:
        before = self._seen.get(env_id)
        after = self._snapshot(env_id)
        self._seen[env_id] = after
        events = self._service._publish
        if after is None:
            if before is not None:
                for machine_id, (machine, state) in before[2].items():
                    events(
                        "machine.state",
                        env_id,
                        machine_id,
                        {"name": machine, "state": "deleted", "previous": state, "source": "record"},
                    )
                events(
                    "environment.updated",
                    env_id,
                    None,
                    {"name": before[0], "state": "deleted", "previous": before[1], "change": "deleted"},
                )
            elif env_id in self._seen and name is not None:
                events(
                    "environment.updated",
                    env_id,
                    None,
                    {"name": name, "state": "deleted", "previous": None, "change": "deleted"},
                )
            return
        env_name, env_state, machines = after
        old_machines = before[2] if before is not None else {}
        for machine_id, (machine, state) in machines.items():
            previous = old_machines.get(machine_id)
            if previous is None or previous[1] != state:
                events(
                    "machine.state",
                    env_id,
                    machine_id,
                    {
                        "name": machine,
                        "state": state,
                        "previous": previous[1] if previous else None,
                        "source": "record",
                    },
                )
        for machine_id, (machine, state) in old_machines.items():
            if machine_id not in machines:
                events(
                    "machine.state",
                    env_id,
                    machine_id,
                    {"name": machine, "state": "deleted", "previous": state, "source": "record"},
                )
        if before is None:
            events(
                "environment.updated",
                env_id,
                None,
                {"name": env_name, "state": env_state, "previous": None, "change": "created"},
            )
        elif before[1] != env_state:
            events(
                "environment.updated",
                env_id,
                None,
                {"name": env_name, "state": env_state, "previous": before[1], "change": "state"},
            )

    def finish(self, result: dict[str, Any] | None) -> None:
        env = result.get("environment") if isinstance(result, dict) else None
        env = env if isinstance(env, dict) else {}
        env_id = env.get("id")
        for known in list(self._seen):
            if known != env_id:
                self.compare(known)
        if isinstance(env_id, str) and env_id:
            if env_id not in self._seen:  # nothing reported along the way: no baseline, say what it is now
                self._seen[env_id] = None
                after = self._snapshot(env_id)
                if after is None:
                    self._service._publish(
                        "environment.updated",
                        env_id,
                        None,
                        {"name": env.get("name"), "state": "deleted", "previous": None, "change": "deleted"},
                    )
                    return
                self._seen[env_id] = after
                self._service._publish(
                    "environment.updated",
                    env_id,
                    None,
                    {"name": after[0], "state": after[1], "previous": None, "change": "state"},
                )
                return
            self.compare(env_id, name=env.get("name"))


Handler = Callable[[_CallState], Awaitable[dict[str, Any]]]


class Service:
    """The daemon's methods. ``start`` before the first call, ``close`` at shutdown.

    ``pool``: the driver sessions to use (default: a ``SessionPool`` this service starts and stops);
    ``warm_sessions=False`` keeps drivers in-process (tests and benchmarks only). ``events``: the event log
    (default: ``_events.EventLog`` on the state store). ``on_shutdown``: called (soon, on the loop) when a client
    asks the daemon to stop.
    """

    def __init__(
        self,
        *,
        events: EventSink | None = None,
        on_shutdown: Callable[[], object] | None = None,
        pool: Any = None,
        version: str | None = None,
        fingerprint: str | None = None,
        store_path: Path | None = None,
        warm_sessions: bool = True,
        daemon_status: Callable[[], dict[str, Any]] | None = None,
        network: Any = None,
    ) -> None:
        self._daemon_status = daemon_status
        from vz_core.daemon._network import DaemonNetwork

        self._network: DaemonNetwork = network if network is not None else DaemonNetwork(store_path)
        self._warm_sessions = warm_sessions
        self._events = events
        self._forget: set[str] = set()
        self._own_events = False
        self._on_shutdown = on_shutdown
        self._pool = pool
        self._own_pool = False
        self._numbers = itertools.count(1)
        self._operations: dict[int, _Operation] = {}
        self._started = _now()
        self._t0 = time.monotonic()
        self._version = version
        self._fingerprint = fingerprint
        self._store_path = store_path
        self._observed: dict[tuple[str, str], str] = {}
        self.shutdown_requested = asyncio.Event()
        self._stopping = asyncio.Event()
        self._secrets = Redactor(short_tokens=True)
        # One handler per row of the method table (vz_core.wire.METHODS): Environments.Up -> _environments_up.
        self._methods: dict[str, Handler] = {name: getattr(self, "_" + row.handler) for name, row in METHODS.items()}

    # --- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the warm driver sessions (``SessionPool.start`` makes them the source of every driver) and open
        the event log."""
        if self._pool is None and self._warm_sessions:
            from vz_core.daemon._sessions import SessionPool

            self._pool = SessionPool()
            self._own_pool = True
        if self._pool is not None:
            await _maybe_await(self._pool.start())
        # Network parts (DNS, exports, imports) of the version 2 Environments running when the daemon stopped.
        await self._network.restore()
        # The first `vz up` would otherwise import pydantic and the definition model on the loop, stalling
        # every other call for a few hundred milliseconds: import them now, in a thread.
        await asyncio.to_thread(_warm_imports)
        if self._events is None:
            import importlib

            try:
                events = importlib.import_module("vz_core.daemon._events")
            except ImportError:  # the event log is not part of this installation: no events, Watch says so
                events = None
            if events is not None:
                self._events = events.EventLog(self._store_path)
                self._own_events = True

    async def close(self) -> None:
        """Stop the sessions this service started (Machines keep running), close the network parts it serves
        (their records stay for the next start) and close the event log."""
        with contextlib.suppress(Exception):
            await self._network.close()
        for environment_id in list(self._forget):
            self._forget_now(environment_id)
        if self._own_pool and self._pool is not None:
            await _maybe_await(self._pool.aclose())
        if self._own_events and self._events is not None:
            closing = getattr(self._events, "close", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    closing()

    async def aclose(self) -> None:
        await self.close()

    def stopping(self) -> None:
        """The daemon is stopping: every watch (Environments.Watch, Machines.Watch, System.Events with follow)
        ends now with its result, the last revision it returned (the client resumes from it)."""
        self._stopping.set()

    @property
    def redactor(self) -> Redactor:
        """Every secret of every call served so far (the daemon's log is masked with it); the warm sessions'
        redactor learns them too, as soon as a driver is acquired for a call."""
        return self._secrets

    @property
    def busy(self) -> bool:
        """A Machine operation is in flight (the daemon's idle timer waits)."""
        return any(not METHODS[op.method].passive for op in self._operations.values())

    def operations(self) -> list[dict[str, Any]]:
        return [op.row() for op in self._operations.values()]

    # --- dispatch -----------------------------------------------------------------------------------------------

    async def dispatch(self, call: CallLike) -> dict[str, Any]:
        """Run one call to its end: the result object, or ``CallFailed`` with the wire's error object."""
        handler = self._methods.get(call.method)
        if handler is None:
            error = RequestError("call.method", f"{call.method!r} is not a method; methods: {', '.join(METHODS)}")
            raise CallFailed(encode_error(error), error)
        operation = _Operation(next(self._numbers), call.method, _now(), getattr(call, "peer_pid", None))
        state = _CallState(call, operation, store_path=self._store_path)
        # Before anything the caller sent is shown, stored or published: the secret values of its project, so
        # that a selector, argv or workdir holding one is masked everywhere (events, errors, results, the log).
        state.redactor = self._call_secrets(call)
        self._secrets.merge(state.redactor)
        self._operations[operation.number] = operation
        kind = METHODS[call.method].operation or None
        started = time.monotonic()
        started_revision: int | None = None
        if kind is not None:
            request = call.request if isinstance(call.request, dict) else {}
            selector = request.get("environment") if isinstance(request.get("environment"), str) else None
            selector = state.redactor.redact(selector) if selector is not None else None
            operation.environment = selector
            started_revision = self._publish(
                "operation.started",
                None,
                None,
                {
                    "method": call.method,
                    "call": operation.number,
                    "environment": selector,
                    "peer_pid": operation.peer_pid,
                },
            )
        result: dict[str, Any] | None = None
        failure: dict[str, Any] | None = None
        try:
            result = await self._run(handler, state)
            return result
        except CallFailed as exc:
            failure = exc.error
            raise
        except BaseException as exc:  # cancelled by the server (the client's cancel or hangup, shutdown)
            failure = encode_error(exc, state.redactor)
            raise
        finally:
            del self._operations[operation.number]
            self._secrets.merge(state.redactor)
            if state.progress is not None:
                state.progress.abandon()
            if state.tracker is not None:
                with contextlib.suppress(Exception):
                    state.tracker.finish(result)
                state.tracker.close()
            if kind is not None:
                status = (
                    "succeeded"
                    if failure is None
                    else ("interrupted" if failure.get("kind") == "interrupted" else "failed")
                )
                op_id = self._operation_id(kind, operation, result)
                self._publish(
                    "operation.finished",
                    operation.environment_id,
                    None,
                    {
                        "method": call.method,
                        "call": operation.number,
                        "status": status,
                        "operation_id": op_id,
                        "error": failure,
                        "seconds": round(time.monotonic() - started, 3),
                        **({"started_revision": started_revision} if started_revision is not None else {}),
                    },
                )

    def _call_secrets(self, call: CallLike) -> Redactor:
        """A redactor holding the secret values of the project a call's context names (``vz_core.env``'s
        ``learn_project_secrets``: vz.json's references and the recorded Machines', read from the caller's
        environment, in memory only); an empty one for a call without a usable context."""
        request = call.request if isinstance(call.request, dict) else {}
        if not isinstance(request.get("context"), dict):
            return Redactor(short_tokens=True)
        from vz_core.daemon._calls import context_of
        from vz_core.env import learn_project_secrets

        try:
            ctx = context_of(request["context"])
        except Exception:  # the handler reports the bad context itself
            return Redactor(short_tokens=True)
        ctx.store_path = self._store_path
        explicit = request.get("environment")
        learn_project_secrets(ctx, explicit if isinstance(explicit, str) else None)
        redactor: Redactor = ctx.redactor
        return redactor

    def _operation_id(self, kind: str, operation: _Operation, result: dict[str, Any] | None) -> str | None:
        """The state store's id of the operation a call ran (``vz up`` results do not carry it)."""
        env = result.get("environment") if isinstance(result, dict) else None
        if isinstance(env, dict) and isinstance(env.get("id"), str):
            operation.environment_id = operation.environment_id or env["id"]
        if isinstance(result, dict) and isinstance(result.get("operation_id"), str):
            return str(result["operation_id"])
        if operation.environment_id is None:
            return None
        from vz_core.env import Store

        with contextlib.suppress(Exception), Store(self._store_path) as store:
            ops = [op for op in store.operations(operation.environment_id) if op.kind == kind]
            return ops[-1].op_id if ops else None
        return None

    async def _run(self, handler: Handler, state: _CallState) -> dict[str, Any]:
        call = state.call
        # Exec and terminal sessions read the client's messages themselves (stdin, resize, signals).
        reads_messages = METHODS[call.method].client_streaming
        inner = asyncio.ensure_future(handler(state))
        waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(call.cancelled.wait())}
        if not reads_messages:
            waiters.add(asyncio.ensure_future(self._cancel_messages(state)))
        try:
            done, _ = await asyncio.wait({inner, *waiters}, return_when=asyncio.FIRST_COMPLETED)
            if inner not in done:
                state.cancel_reason = cancel_reason(state)
                await stop_task(inner)
            result = inner.result()
            if state.progress is not None:
                await state.progress.flush()
            return state.redactor.redact_data(result)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not inner.done() or (task is not None and task.cancelling()):
                # The server cancelled this call (the client's cancel or hangup, or shutdown): so is the
                # operation; what it reported on its way out (the failed step) still goes first.
                await stop_task(inner)
                if state.progress is not None:
                    with contextlib.suppress(BaseException):
                        await asyncio.wait_for(state.progress.flush(), timeout=2.0)
                raise
            if state.progress is not None:  # the failed step is reported before the error
                with contextlib.suppress(Exception):
                    await state.progress.flush()
            error = encode_error(asyncio.CancelledError(), state.redactor)
            error["message"] = state.redactor.redact(cancelled_message(call.method, cancel_reason(state)))
            raise CallFailed(error) from None
        except CallFailed:
            raise
        except Exception as exc:
            if state.progress is not None:
                with contextlib.suppress(Exception):
                    await state.progress.flush()
            raise CallFailed(encode_error(exc, state.redactor), exc) from None
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _cancel_messages(self, state: _CallState) -> None:
        """Returns when the client asks to stop (``cancel``, ``signal``) or its connection ends."""
        while True:
            message = await state.call.receive()
            if message is None:
                state.cancel_reason = "the client closed the connection"
                return
            if isinstance(message, dict):
                if "cancel" in message:
                    state.cancel_reason = "cancelled by the client"
                    return
                if "signal" in message:
                    state.signal = signal_name(message.get("signal"))
                    state.cancel_reason = f"the client received {state.signal or 'a signal'}"
                    return

    # --- helpers ------------------------------------------------------------------------------------------------

    def _publish(
        self, kind: str, environment_id: str | None, machine_id: str | None, data: dict[str, Any]
    ) -> int | None:
        """Record one event; its revision (None when there is no event log or it could not be stored)."""
        if self._events is None:
            return None
        # Stored events hold no secret: every value is masked with every secret the daemon has learned (the
        # call's project's are merged in before its first event).
        data = self._secrets.redact_data(data)
        revision: int | None = None
        with contextlib.suppress(Exception):  # an event that cannot be stored never fails an operation
            revision = self._events.append(kind, environment_id, machine_id, data)
        if kind == "environment.updated" and data.get("change") == "deleted" and environment_id:
            # `vz delete` leaves nothing of the Environment on disk, its events included: live watchers get the
            # deletion first (they are woken by the append), then its events are dropped from the log.
            self._forget.add(environment_id)  # dropped at close() at the latest
            with contextlib.suppress(RuntimeError):  # no running loop: close() does it
                asyncio.get_running_loop().call_later(FORGET_DELAY, self._forget_now, environment_id)
        return revision

    def _forget_now(self, environment_id: str) -> None:
        if environment_id in self._forget and self._events is not None:
            self._forget.discard(environment_id)
            forget = getattr(self._events, "forget_environment", None)
            if forget is not None:
                with contextlib.suppress(Exception):
                    forget(environment_id)

    def _request(self, state: _CallState, allowed: tuple[str, ...]) -> Request:
        return Request(state.call.method, state.call.request, allowed)

    def _context(self, state: _CallState, request: Request, *, track: bool = False) -> Any:
        ctx = request.context()
        ctx.store_path = self._store_path
        ctx.client_pid = state.operation.peer_pid
        ctx.redactor = state.redactor  # already holds the project's secrets (dispatch)
        tracker = _Tracker(self, self._store_path) if track else None
        state.tracker = tracker

        def listen(message: dict[str, Any]) -> None:
            env_id = message.get("environment_id")
            if isinstance(env_id, str) and state.operation.environment_id is None:
                state.operation.environment_id = env_id
            if tracker is not None:
                tracker.listen(message)

        progress = CallProgress(state.call.progress, ctx.redactor, listen)
        progress.start()
        state.progress = progress
        ctx.progress = progress
        return ctx

    # --- Environments -------------------------------------------------------------------------------------------

    async def _environments_up(self, state: _CallState) -> dict[str, Any]:
        from vz_core.env import up

        request = self._request(state, ("context", "environment", "recreate", "dry_run"))
        environment = request.string("environment", empty=False)
        recreate = request.boolean("recreate")
        dry_run = request.boolean("dry_run")
        ctx = self._context(state, request, track=not dry_run)
        result = await up(ctx, environment=environment, recreate=recreate, dry_run=dry_run)
        env_id = _result_environment_id(result)
        if not dry_run and env_id is not None:
            await self._serve_network(ctx, result, env_id)
        return result

    async def _serve_network(self, ctx: Any, result: dict[str, Any], env_id: str) -> None:
        """After a successful up: the Environment's DNS responder, export listeners and import relays (a version
        2 Environment whose route domain `vz up` realized; nothing otherwise)."""
        from vz_core.daemon._network import has_domain

        if not has_domain(env_id):
            await self._network.after_up(ctx, env_id)  # forgets what it served for it, if anything
            return
        env = result.get("environment") or {}
        fields = {"environment": env.get("name"), "environment_id": env_id}
        with ctx.progress.step("network", f"serving DNS, exports and imports of {env.get('name')}", **fields):
            await self._network.after_up(ctx, env_id)

    async def _environments_stop(self, state: _CallState) -> dict[str, Any]:
        from vz_core.env import stop

        request = self._request(state, ("context", "environment"))
        environment = request.string("environment", empty=False)
        ctx = self._context(state, request, track=True)
        result = await stop(ctx, environment=environment)
        env_id = _result_environment_id(result)
        if env_id is not None:
            await self._network.after_stop(env_id)
        return result

    async def _environments_delete(self, state: _CallState) -> dict[str, Any]:
        from vz_core.env import delete

        request = self._request(state, ("context", "environment", "keep_volumes"))
        environment = request.string("environment", empty=False)
        keep = request.boolean("keep_volumes")
        ctx = self._context(state, request, track=True)
        result = await delete(ctx, environment=environment, keep_volumes=keep)
        env_id = _result_environment_id(result)
        if env_id is not None:
            await self._network.after_delete(env_id)
        return result

    async def _status_report(
        self,
        state: _CallState,
        request: Request,
        *,
        environment: str | None,
        all_environments: bool,
        machine: str | None,
    ) -> dict[str, Any]:
        from vz_core.env import status

        ctx = self._context(state, request)
        report = await status(ctx, environment=environment, all_environments=all_environments, machine=machine)
        self._observe(report)
        for env in report.get("environments") or ():
            # The exports this daemon listens on now for the Environment (127.0.0.1 only).
            endpoints = self._network.endpoints(env["id"]) if isinstance(env.get("id"), str) else []
            if endpoints:
                env["endpoints"] = endpoints
        return report

    def _observe(self, report: dict[str, Any]) -> None:
        """A state a driver reported that differs from the last one seen becomes a ``machine.state`` event."""
        for env in report.get("environments") or ():
            for row in env.get("machines") or ():
                health = row.get("health") or {}
                if health.get("source") != "driver":
                    continue
                key = (env["id"], row["id"])
                previous = self._observed.get(key, row.get("recorded_state"))
                if health["state"] != previous:
                    self._publish(
                        "machine.state",
                        env["id"],
                        row["id"],
                        {"name": row["name"], "state": health["state"], "previous": previous, "source": "driver"},
                    )
                self._observed[key] = health["state"]

    async def _environments_get(self, state: _CallState) -> dict[str, Any]:
        request = self._request(state, ("context", "environment", "machine"))
        environment = request.string("environment", empty=False)
        machine = request.string("machine", empty=False)
        return await self._status_report(
            state, request, environment=environment, all_environments=False, machine=machine
        )

    async def _environments_list(self, state: _CallState) -> dict[str, Any]:
        """The project's Environments (`vz status --all --json`). Without a vz.json from the caller's directory:
        every project's with ``all`` true, else the not-found error naming where it looked."""
        request = self._request(state, ("context", "all", "machine"))
        every = request.boolean("all", default=True)
        machine = request.string("machine", empty=False)
        if not every:
            from vz_core.env import find_definition

            probe = request.context()
            find_definition(probe.cwd, probe.definition_file)
        return await self._status_report(state, request, environment=None, all_environments=True, machine=machine)

    async def _follow(
        self, state: _CallState, request: Request, kinds: tuple[str, ...], environment_id: str | None
    ) -> dict[str, Any]:
        revision = request.integer("from_revision", default=None)
        if self._events is None:
            raise _unavailable("events are not recorded by this daemon (no event log)")
        start = revision if revision is not None else _latest(self._events)
        last = start
        events = aiter(self._events.follow(start, environment_id=environment_id, kinds=kinds))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            while not stopping.done():
                following = asyncio.ensure_future(anext(events))
                await asyncio.wait({following, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not following.done():
                    await stop_task(following)
                    break
                try:
                    event = following.result()
                except StopAsyncIteration:
                    break
                last = int(event.get("revision") or last)
                await state.call.event(state.redactor.redact_data(event))
        finally:
            stopping.cancel()
            closing = getattr(events, "aclose", None)
            if closing is not None:
                with contextlib.suppress(BaseException):
                    await closing()
        return {"revision": last}

    async def _environments_watch(self, state: _CallState) -> dict[str, Any]:
        request = self._request(state, ("from_revision", "environment"))
        environment = self._watched_environment(request)
        return await self._follow(state, request, ("environment.", "operation."), environment)

    async def _machines_watch(self, state: _CallState) -> dict[str, Any]:
        request = self._request(state, ("from_revision", "environment"))
        environment = self._watched_environment(request)
        return await self._follow(state, request, ("machine.",), environment)

    def _watched_environment(self, request: Request) -> str | None:
        """A watch's ``environment``: an Environment id the state store records or the event log still holds
        events of; ``NotFoundError`` for any other (a typo would otherwise watch nothing, silently)."""
        environment = request.string("environment", empty=False)
        if environment is None:
            return None
        from vz_core.env import Store
        from vz_core.errors import NotFoundError

        with Store(self._store_path) as store:
            if store.environment(environment) is not None:
                return environment
        knows = getattr(self._events, "knows_environment", None)
        if knows is not None and knows(environment):
            return environment
        raise NotFoundError(
            f"request.environment: no Environment has the id {environment!r} (a watch takes an Environment id, "
            "as Environments.List reports it, not a name)",
            details={"field": "environment"},
        )

    async def _system_events(self, state: _CallState) -> dict[str, Any]:
        request = self._request(state, ("from_revision", "follow"))
        if request.boolean("follow", default=True):
            return await self._follow(state, request, (), None)
        revision = request.integer("from_revision", default=None)
        if self._events is None:
            raise _unavailable("events are not recorded by this daemon (no event log)")
        if revision is None:  # from now on, and not following: nothing yet; the revision to start from later
            return {"revision": _latest(self._events)}
        since = getattr(self._events, "since", None)
        last = revision
        while since is not None:
            batch = since(last)
            if not batch:
                break
            for event in batch:
                last = int(event.get("revision") or last)
                await state.call.event(state.redactor.redact_data(event))
        return {"revision": last}

    # --- Machines -----------------------------------------------------------------------------------------------

    async def _machines_get(self, state: _CallState) -> dict[str, Any]:
        request = self._request(state, ("context", "environment", "machine"))
        environment = request.string("environment", empty=False)
        machine = request.string("machine", empty=False)
        report = await self._status_report(
            state, request, environment=environment, all_environments=False, machine=machine
        )
        env = report["environments"][0]
        return {**env["machines"][0], "environment": {"id": env["id"], "name": env["name"]}}

    async def _machines_list(self, state: _CallState) -> dict[str, Any]:
        request = self._request(state, ("context", "environment"))
        environment = request.string("environment", empty=False)
        report = await self._status_report(
            state, request, environment=environment, all_environments=False, machine=None
        )
        env = report["environments"][0]
        return {"environment": {"id": env["id"], "name": env["name"]}, "machines": env["machines"]}

    async def _machines_exec(self, state: _CallState) -> dict[str, Any]:
        from vz_core.env import prepare_exec

        request = self._request(
            state,
            (
                "context",
                "environment",
                "machine",
                "argv",
                "workdir",
                "env",
                "tty",
                "rows",
                "cols",
                "term",
                "stdio",
                "user",
            ),
        )
        environment = request.string("environment", empty=False)
        machine = request.string("machine", empty=False)
        argv = request.argv()
        workdir = request.string("workdir")
        variables = request.string_map("env")
        tty = request.boolean("tty")
        rows = request.integer("rows", default=None, low=1, high=MAX_WINDOW)
        cols = request.integer("cols", default=None, low=1, high=MAX_WINDOW)
        term = request.string("term")
        stdio = request.flags("stdio", 3)
        user = request.string("user", empty=False)
        fds = list(state.call.fds)
        if tty and any(stdio):
            raise RequestError(
                "request.stdio",
                "a terminal session (tty=true) takes no descriptors: its bytes travel "
                "as stream 3; send [false, false, false]",
            )
        if len(fds) != sum(stdio):
            raise RequestError(
                "request.stdio", f"marks {sum(stdio)} descriptor(s) as attached, {len(fds)} arrived with the call"
            )
        for index, fd in enumerate(fds):
            if os.isatty(fd):
                raise RequestError(
                    f"call.fds[{index}]",
                    "is a terminal; a terminal's descriptor never enters a "
                    "Machine (send its bytes as messages, or use tty=true)",
                )
        ctx = self._context(state, request)
        ctx.redactor.add_environment(variables)
        target = prepare_exec(ctx, environment=environment, machine=machine)
        if user is not None:  # `vz exec -u USER[:GROUP]`: instead of the Machine's remote_user
            target = replace(target, user=user)
        state.operation.environment_id = target.environment.env_id
        # A command name or workdir holding a secret would be echoed by the Machine's own messages (the agent's
        # "no such file" line goes straight to the command's stderr): that stderr is then copied here, masked.
        masked = any(ctx.redactor.redact(text) != text for text in (argv[0], workdir or ""))
        if tty:
            return await terminal(state, ctx, target, argv, workdir, variables, rows, cols, term, masked)
        return await exec_streams(state, ctx, target, argv, workdir, variables, stdio, fds, masked)

    async def _machines_logs(self, state: _CallState) -> dict[str, Any]:
        from vz_core.env import execute_logs, prepare_exec

        request = self._request(state, ("context", "environment", "machine", "follow", "tail", "service"))
        environment = request.string("environment", empty=False)
        machine = request.string("machine", empty=False)
        follow = request.boolean("follow")
        tail = request.integer("tail", default=None)
        service = request.string("service", empty=False)
        ctx = self._context(state, request)
        target = prepare_exec(ctx, environment=environment, machine=machine)
        masked = ctx.redactor.stream()

        async def output(data: bytes) -> None:
            clean = masked.feed(data)
            if clean:
                await state.call.write(1, clean)

        if service is None:
            await execute_logs(ctx, target, output, follow=follow, tail=tail)
        else:
            from vz_core.env import execute_service_logs

            await execute_service_logs(ctx, target, service, output, follow=follow, tail=tail)
        rest = masked.flush()
        if rest:
            await state.call.write(1, rest)
        return {}

    # --- Volumes ------------------------------------------------------------------------------------------------

    async def _volumes_list(self, state: _CallState) -> dict[str, Any]:
        from vz_core.env import list_volumes

        request = self._request(state, ("context",))
        ctx = self._context(state, request)
        return await list_volumes(ctx)

    async def _volumes_remove(self, state: _CallState) -> dict[str, Any]:
        from vz_core.env import remove_volume

        request = self._request(state, ("context", "name"))
        name = request.required_string("name")
        ctx = self._context(state, request)
        return await remove_volume(ctx, name)

    # --- System -------------------------------------------------------------------------------------------------

    async def _system_capabilities(self, state: _CallState) -> dict[str, Any]:
        from vz_core.drivers import list_drivers

        request = Request(state.call.method, state.call.request, ("drivers",))
        names = [row["name"] for row in list_drivers()]
        wanted = request.data.get("drivers")
        if wanted is not None:
            if not isinstance(wanted, list) or not all(isinstance(n, str) for n in wanted):
                raise RequestError("request.drivers", "must be a list of driver names")
            unknown = [n for n in wanted if n not in names]
            if unknown:
                raise RequestError(
                    "request.drivers", f"names no installed driver: {', '.join(unknown)}; installed: {', '.join(names)}"
                )
            names = list(wanted)
        if self._pool is not None and hasattr(self._pool, "capabilities"):
            return {"drivers": await self._pool.capabilities(names)}
        return {"drivers": await _negotiate_each(names, state.redactor)}

    async def _system_status(self, state: _CallState) -> dict[str, Any]:
        Request(state.call.method, state.call.request, ())
        plugins: list[Any] = []
        describe = getattr(self._pool, "status", None) if self._pool is not None else None
        if describe is not None:
            plugins = list(await _maybe_await(describe()))
        report: dict[str, Any] = {
            "pid": os.getpid(),
            "version": self._version or _vz_version(),
            "fingerprint": self._fingerprint,
            "started": self._started,
            "uptime_seconds": round(time.monotonic() - self._t0, 3),
        }
        if self._daemon_status is not None:  # the server's view: socket, connections, idle timeout
            report.update(self._daemon_status())
        report.update(
            busy=self.busy,
            plugins=plugins,
            operations=[op.row() for op in self._operations.values() if not METHODS[op.method].passive],
        )
        return report

    async def _drivers_connect(self, state: _CallState) -> dict[str, Any]:
        raise _unsupported(
            "Drivers.Connect is answered by the daemon's listener (vz_core.daemon.Daemon, next to the warm "
            "sessions), not by the service on its own"
        )

    async def _system_shutdown(self, state: _CallState) -> dict[str, Any]:
        Request(state.call.method, state.call.request, ())
        busy = self.busy and any(
            not METHODS[op.method].passive and op is not state.operation for op in self._operations.values()
        )
        self.shutdown_requested.set()
        if self._on_shutdown is not None:
            asyncio.get_running_loop().call_soon(self._on_shutdown)
        return {"stopping": True, "busy": busy}


async def _negotiate_each(names: list[str], redactor: Redactor) -> list[dict[str, Any]]:
    """``{"name", "facts"}`` (``DriverFacts.describe()``) or ``{"name", "error": {"code", "message"}}`` per driver
    (the rows ``SessionPool.capabilities`` gives, for a service whose drivers are opened in-process)."""
    from vz_core.env import DriverPool
    from vz_core.errors import DriverError, VzError

    pool = DriverPool(redactor)
    rows: list[dict[str, Any]] = []
    try:
        for name in names:
            try:
                _, facts = await pool.get(name)
            except VzError as exc:
                code = exc.code if isinstance(exc, DriverError) else type(exc).__name__
                rows.append({"name": name, "error": {"code": code, "message": redactor.redact(str(exc))}})
            else:
                rows.append({"name": name, "facts": facts.describe()})
    finally:
        await pool.aclose()
    return rows


def _warm_imports() -> None:
    import vz_core.capability_matrix
    import vz_core.env

    for name in ("load_definition", "up", "status", "stop"):  # each loads its module (PEP 562)
        getattr(vz_core.env, name)


def _unsupported(message: str) -> Exception:
    from vz_core.errors import UnsupportedError

    return UnsupportedError(message)


def _unavailable(message: str) -> Exception:
    from vz_core.errors import UnavailableError

    return UnavailableError(message)


def _latest(events: Any) -> int:
    latest = getattr(events, "latest", None)
    return int(latest()) if latest is not None else 0


def _result_environment_id(result: Any) -> str | None:
    env = result.get("environment") if isinstance(result, dict) else None
    env_id = env.get("id") if isinstance(env, dict) else None
    return env_id if isinstance(env_id, str) and env_id else None


async def _maybe_await(value: Any) -> Any:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value


def _vz_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vz")
    except PackageNotFoundError:
        return "0+unknown"


async def create_service(daemon: Any) -> Service:
    """The started service of a running daemon (``vz_core.daemon._server.Daemon``): its identity, its status,
    its shutdown."""
    service = Service(
        version=getattr(daemon, "version", None),
        fingerprint=getattr(daemon, "fingerprint", None),
        daemon_status=getattr(daemon, "status", None),
        on_shutdown=lambda: daemon.request_shutdown("System.Shutdown"),
    )
    await service.start()
    return service


_default: Service | None = None


async def dispatch(call: CallLike) -> dict[str, Any]:
    """``Service.dispatch`` of this process's default service (started on first use)."""
    global _default
    if _default is None:
        service = Service()
        await service.start()
        _default = service
    return await _default.dispatch(call)
