"""``Client``: the typed, synchronous Python client of the vz daemon (docs/api.md).

One method per vz.api.v1 rpc. Long operations return an ``Operation`` (iterate its progress, then
``result()``); watches return an ``EventStream``; Exec has a live handle (``open_exec`` -> ``ExecCall``) and a
blocking form (``exec``). Every failure raises ``ApiError``. Project-scoped calls carry a context (the caller's
working directory, environment variables and ``-f`` file): by default this process's.
"""

from __future__ import annotations

import os

from vz_core.api._errors import ApiError
from vz_core.api._exec_result import ExecResult

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from typing import Any, Generic, Self, TypeVar

    from vz_core.api._transport import CallStream, Transport
    from vz_core.api._types import (
        Capability,
        DaemonStatus,
        DeleteResult,
        Environment,
        Event,
        Machine,
        Progress,
        StatusReport,
        StopResult,
        UpResult,
        Volume,
    )

    _R = TypeVar("_R")
    from vz_core.api import _types as _typed
else:  # no `typing` at run time: it costs milliseconds on the CLI's path

    class _LazyTypes:
        """The typed results' module, imported on first use (the exec path never needs it)."""

        def __getattr__(self, name: str) -> object:
            from vz_core.api import _types

            return getattr(_types, name)

    _typed = _LazyTypes()

    class Generic:
        def __class_getitem__(cls, item: object) -> type:
            return cls

    _R = None

__all__ = ["Client", "EventStream", "ExecCall", "ExecResult", "Operation", "default_context"]


class _Handle:
    """A context manager that hangs up (``close()``) when its ``with`` block is left."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def default_context(
    cwd: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    definition_file: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The context of a project-scoped call: ``{"cwd", "environ", "definition_file"}`` (default: this process's
    working directory and environment, no ``-f``). The daemon keeps ``environ`` in memory only."""
    return {
        "cwd": os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd()),
        "environ": dict(os.environ if environ is None else environ),
        "definition_file": None if definition_file is None else os.path.abspath(os.fspath(definition_file)),
    }


class Operation(_Handle, Generic[_R]):
    """A long operation (Up, Stop, Delete) in flight: iterate its ``Progress``, then ``result()``.

    Iterating is optional: ``result()`` reads what is left (``progress`` keeps every message seen).
    ``cancel()`` asks the daemon to cancel (the operation is recorded interrupted and ``result()`` raises
    ``ApiError`` with kind "interrupted"); leaving a ``with`` block or ``close()`` before the result hangs up,
    which cancels too.
    """

    def __init__(self, stream: CallStream, wrap: Callable[[dict[str, Any]], _R]) -> None:
        self._stream = stream
        self._wrap = wrap
        self._result: _R | None = None
        self._error: ApiError | None = None
        self._finished = False
        self.progress: list[Progress] = []
        """Every progress message received so far."""

    def __iter__(self) -> Iterator[Progress]:
        while not self._finished:
            try:
                message = self._stream.receive()
            except ApiError as exc:
                self._finished, self._error = True, exc
                self._stream.close()
                raise
            if message[0] == "result":
                self._finished = True
                self._result = self._wrap(message[1])
                self._stream.close()
                return
            if message[0] == "progress":
                progress = _typed.Progress(message[1])
                self.progress.append(progress)
                yield progress

    def result(self) -> _R:
        """The operation's result (waits for it); raises ``ApiError`` when it failed."""
        for _ in self:
            pass
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Ask the daemon to cancel the operation (its end still arrives: call ``result()``)."""
        self._stream.cancel()

    def close(self) -> None:
        """Hang up (cancels the operation when it has not ended)."""
        self._finished = True
        self._stream.close()


class EventStream(_Handle):
    """Events of a watch, in revision order; ``close()`` (or leaving ``with``) ends the watch.

    ``last_revision`` is the revision of the last event received: watch again from it after a reconnect and
    nothing is lost.
    """

    def __init__(self, stream: CallStream, from_revision: int | None) -> None:
        self._stream = stream
        self.last_revision = from_revision or 0
        self._finished = False

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        while not self._finished:
            try:
                message = self._stream.receive()
            except ApiError:
                self.close()
                raise
            if message[0] == "event":
                event = _typed.Event(message[1])
                self.last_revision = event.revision
                return event
            if message[0] == "result":
                revision = message[1].get("revision")
                if isinstance(revision, int):
                    self.last_revision = max(self.last_revision, revision)
                self.close()
        raise StopIteration

    def close(self) -> None:
        """Stop watching."""
        self._finished = True
        self._stream.close()


class ExecCall(_Handle):
    """A running command (``Client.open_exec``): a poll-friendly handle over one call.

    ``receive()`` reads exactly one message: ``("output", stream, bytes)`` (1 stdout, 2 stderr, 3 terminal)
    or ``("result", ExecResult)``, last; it raises ``ApiError`` for the call's error. ``fileno()`` is readable
    when a message waits (local transport). Input: ``send(stream, data)`` (0 stdin, 3 terminal),
    ``close_stdin()``, ``resize(rows, cols)``, ``signal(name)``; ``cancel()`` kills the command; ``close()``
    hangs up (and cancels a running command).
    """

    def __init__(self, stream: CallStream) -> None:
        self._stream = stream

    def fileno(self) -> int:
        """The connection's descriptor, for select/poll (local transport)."""
        return self._stream.fileno()

    def receive(self) -> tuple[str, int, bytes] | tuple[str, ExecResult]:
        """The next message (see the class docstring)."""
        while True:
            message = self._stream.receive()
            if message[0] == "output":
                return ("output", int(message[1]), bytes(message[2]))
            if message[0] == "result":
                return ("result", ExecResult(message[1]))

    def send(self, stream: int, data: bytes) -> None:
        """Input bytes (0 stdin; 3 terminal with tty)."""
        if data:
            self._stream.send(stream, data)

    def close_stdin(self) -> None:
        """No more input."""
        self._stream.close_stdin()

    def resize(self, rows: int, cols: int) -> None:
        """The terminal's new size (tty)."""
        self._stream.resize(rows, cols)

    def signal(self, name: str) -> None:
        """Deliver a signal to the command (``"SIGINT"``, ``"SIGTERM"``...)."""
        self._stream.signal(name)

    def cancel(self) -> None:
        """Kill the command (its result still arrives)."""
        self._stream.cancel()

    def close(self) -> None:
        """Hang up."""
        self._stream.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Client(_Handle):
    """The vz daemon's API (see the module docstring and docs/api.md).

    ``home``: the state directory (default ``VZ_HOME``); ``socket``: the daemon's socket (default
    ``VZ_DAEMON_SOCKET`` or ``<home>/daemon/vz.sock``); ``autostart``: start a daemon when none runs (default
    ``VZ_DAEMON_AUTOSTART``, on); ``transport``: ``"local"`` (the local wire: no grpc import, descriptors can be
    passed) or ``"grpc"`` (vz.api.v1 over gRPC on the same socket). ``context``: the default context of
    project-scoped calls (``default_context()`` of this process when None).
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | None = None,
        socket: str | None = None,
        autostart: bool | None = None,
        transport: str = "local",
        context: Mapping[str, Any] | None = None,
    ) -> None:
        home_str = None if home is None else os.fspath(home)
        self.transport: Transport
        if transport == "local":
            from vz_core.api._transport import LocalTransport

            self.transport = LocalTransport(home_str, socket, autostart)
        elif transport == "grpc":
            from vz_core.api._grpc_transport import GrpcTransport

            self.transport = GrpcTransport(home_str, socket, autostart)
        else:
            raise ValueError(f"transport must be 'local' or 'grpc', not {transport!r}")
        self.context = None if context is None else dict(context)

    def close(self) -> None:
        """Release the transport (a gRPC channel); the client can no longer be used."""
        self.transport.close()

    # --- plumbing -------------------------------------------------------------------------------------------

    def _context(self, context: Mapping[str, Any] | None, definition_file: str | os.PathLike[str] | None) -> Any:
        if context is not None:
            ctx = dict(context)
        elif self.context is not None:
            ctx = dict(self.context)
        else:
            ctx = default_context()
        if definition_file is not None:
            ctx["definition_file"] = os.path.abspath(os.fspath(definition_file))
        return ctx

    def _request(
        self, context: Mapping[str, Any] | None, definition_file: str | os.PathLike[str] | None, **fields: Any
    ) -> dict[str, Any]:
        """A call's request: its ``context`` (``_context``) and ``fields``."""
        return {"context": self._context(context, definition_file), **fields}

    def _call(self, method: str, request: Mapping[str, Any]) -> dict[str, Any]:
        from vz_core.api._transport import drain

        stream = self.transport.start(method, request)
        try:
            return drain(stream)
        finally:
            stream.close()

    # --- Environments ---------------------------------------------------------------------------------------

    def up(
        self,
        environment: str | None = None,
        *,
        recreate: bool = False,
        dry_run: bool = False,
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
    ) -> Operation[UpResult]:
        """Create or reconcile the selected Environment (`vz up`)."""
        request = self._request(context, definition_file, environment=environment, recreate=recreate, dry_run=dry_run)
        return Operation(self.transport.start("Environments.Up", request), _typed.UpResult)

    def stop(
        self,
        environment: str | None = None,
        *,
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
    ) -> Operation[StopResult]:
        """Stop every Machine of the selected Environment (`vz stop`)."""
        request = self._request(context, definition_file, environment=environment)
        return Operation(self.transport.start("Environments.Stop", request), _typed.StopResult)

    def delete(
        self,
        environment: str | None = None,
        *,
        keep_volumes: bool = False,
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
    ) -> Operation[DeleteResult]:
        """Delete the selected Environment and what it owns (`vz delete`)."""
        request = self._request(context, definition_file, environment=environment, keep_volumes=keep_volumes)
        return Operation(self.transport.start("Environments.Delete", request), _typed.DeleteResult)

    def status(
        self,
        environment: str | None = None,
        *,
        all: bool = False,
        machine: str | None = None,
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
    ) -> StatusReport:
        """The `vz status --json` document: the selected Environment (Get), or all of them (List)."""
        request = self._request(context, definition_file)
        if machine is not None:
            request["machine"] = machine
        if all:
            return _typed.StatusReport(self._call("Environments.List", {**request, "all": True}))
        return _typed.StatusReport(self._call("Environments.Get", {**request, "environment": environment}))

    def environment(
        self,
        environment: str | None = None,
        *,
        machine: str | None = None,
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
    ) -> Environment:
        """One Environment with live health (Environments.Get)."""
        report = self.status(environment, machine=machine, context=context, definition_file=definition_file)
        (found,) = report.environments
        return found

    def environments(
        self,
        *,
        all: bool = False,
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
    ) -> list[Environment]:
        """The project's Environments (with ``all``: of every project when no vz.json is found)."""
        request = self._request(context, definition_file, all=all)
        return _typed.StatusReport(self._call("Environments.List", request)).environments

    def watch(self, from_revision: int | None = 0, *, environment_id: str | None = None) -> EventStream:
        """Events about Environments (and their operations; of one Environment, by id) after ``from_revision``
        (None: from now), then live."""
        request: dict[str, Any] = {"from_revision": from_revision}
        if environment_id is not None:
            request["environment"] = environment_id
        return EventStream(self.transport.start("Environments.Watch", request), from_revision)

    # --- Machines -------------------------------------------------------------------------------------------

    def machine(
        self,
        machine: str | None = None,
        *,
        environment: str | None = None,
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
    ) -> Machine:
        """One Machine's status row (Machines.Get; None = the default Machine)."""
        request = self._request(context, definition_file, environment=environment, machine=machine)
        return _typed.Machine(self._call("Machines.Get", request))

    def machines(
        self,
        environment: str | None = None,
        *,
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
    ) -> list[Machine]:
        """The Machines of the selected Environment (Machines.List)."""
        request = self._request(context, definition_file, environment=environment)
        return [_typed.Machine(m) for m in self._call("Machines.List", request).get("machines") or ()]

    def watch_machines(self, from_revision: int | None = 0, *, environment_id: str | None = None) -> EventStream:
        """Events about Machines (of one Environment, by id) after ``from_revision``, then live ones."""
        request: dict[str, Any] = {"from_revision": from_revision}
        if environment_id is not None:
            request["environment"] = environment_id
        return EventStream(self.transport.start("Machines.Watch", request), from_revision)

    def open_exec(
        self,
        argv: Sequence[str],
        *,
        environment: str | None = None,
        machine: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        tty: bool = False,
        rows: int = 0,
        cols: int = 0,
        term: str | None = None,
        stdio: tuple[int | None, int | None, int | None] = (None, None, None),
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
        user: str | None = None,
    ) -> ExecCall:
        """Start a command in a Machine; the live handle (``ExecCall``).

        ``stdio[i]`` a descriptor: the command uses it directly (local transport: passed to the daemon, never a
        terminal); None: stream i travels as messages (``send``/``receive``). With ``tty`` the command runs on a
        terminal inside the Machine and every byte is stream 3.
        """
        if not argv:
            raise ValueError("exec needs a non-empty argv")
        if tty and any(fd is not None for fd in stdio):
            raise ValueError("a terminal session streams its bytes: pass stdio=(None, None, None) with tty=True")
        fds = [fd for fd in stdio if fd is not None]
        for fd in fds:
            if os.isatty(fd):
                raise ValueError(
                    f"descriptor {fd} is a terminal: a terminal never enters a Machine; leave it None and copy the "
                    "bytes (tty=True for an interactive session)"
                )
        request = self._request(
            context,
            definition_file,
            environment=environment,
            machine=machine,
            argv=list(argv),
            workdir=workdir,
            env=dict(env or {}),
            tty=tty,
            rows=rows or None,
            cols=cols or None,
            term=term,
            stdio=[fd is not None for fd in stdio],
            **({} if user is None else {"user": user}),
        )
        return ExecCall(self.transport.start("Machines.Exec", request, fds))

    def exec(
        self,
        argv: Sequence[str],
        *,
        environment: str | None = None,
        machine: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: int | bytes | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        tty: bool = False,
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run a command to its end. ``stdin``: a descriptor, bytes, or None (no input); ``stdout``/``stderr``:
        descriptors, or None to capture the stream in ``ExecResult.stdout``/``.stderr``.

        Over the local transport descriptors are passed to the daemon; over gRPC the bytes are copied here."""
        passing = self.transport.name == "local"
        in_fd = stdin if isinstance(stdin, int) and passing and not tty else None
        out_fd = stdout if passing and not tty else None
        err_fd = stderr if passing and not tty else None
        call = self.open_exec(
            argv,
            environment=environment,
            machine=machine,
            workdir=workdir,
            env=env,
            tty=tty,
            stdio=(in_fd, out_fd, err_fd),
            context=context,
            definition_file=definition_file,
            user=user,
        )
        captured = {1: bytearray(), 2: bytearray(), 3: bytearray()}
        targets = {1: stdout, 2: stderr, 3: stdout}
        with call:
            feeder = None
            if in_fd is None:
                data_stream = 3 if tty else 0
                if isinstance(stdin, bytes):
                    call.send(data_stream, stdin)
                    if not tty:
                        call.close_stdin()
                elif isinstance(stdin, int):
                    import threading

                    def feed(fd: int = stdin) -> None:
                        try:
                            while chunk := os.read(fd, 256 * 1024):
                                call.send(data_stream, chunk)
                            if not tty:
                                call.close_stdin()
                        except (ApiError, OSError):
                            pass

                    feeder = threading.Thread(target=feed, daemon=True, name="vz-exec-stdin")
                    feeder.start()
                elif not tty:
                    call.close_stdin()
            while True:
                message = call.receive()
                if message[0] == "result":
                    result = message[1]
                    assert isinstance(result, ExecResult)
                    return ExecResult(result, bytes(captured[1] + captured[3]), bytes(captured[2]))
                stream, data = message[1], message[2]  # type: ignore[misc]
                assert isinstance(stream, int) and isinstance(data, bytes)
                target = targets.get(stream)
                if target is not None:
                    _write_all(target, data)
                else:
                    captured.setdefault(stream, bytearray()).extend(data)

    def logs(
        self,
        machine: str | None = None,
        *,
        environment: str | None = None,
        follow: bool = False,
        tail: int | None = None,
        context: Mapping[str, Any] | None = None,
        definition_file: str | os.PathLike[str] | None = None,
        service: str | None = None,
    ) -> Iterator[bytes]:
        """A Machine's logs as chunks of bytes (with ``follow``, until the iterator is closed); with ``service``,
        that service's output instead (kept across its restarts while the Machine runs)."""
        fields: dict[str, Any] = {"service": service} if service is not None else {}
        request = self._request(
            context, definition_file, environment=environment, machine=machine, follow=follow, tail=tail, **fields
        )
        stream = self.transport.start("Machines.Logs", request)
        try:
            while True:
                message = stream.receive()
                if message[0] == "result":
                    return
                if message[0] == "output":
                    yield bytes(message[2])
        finally:
            stream.close()

    # --- Volumes --------------------------------------------------------------------------------------------

    def volumes(self, *, context: Mapping[str, Any] | None = None) -> list[Volume]:
        """Every kept volume of every project (`vz volume list`)."""
        result = self._call("Volumes.List", self._request(context, None))
        return [_typed.Volume(v) for v in result.get("volumes") or ()]

    def remove_volume(self, name: str, *, context: Mapping[str, Any] | None = None) -> list[Volume]:
        """Remove one kept volume (`vz volume rm NAME`); the removed volume's row (state "removed")."""
        result = self._call("Volumes.Remove", self._request(context, None, name=name))
        return [_typed.Volume(v) for v in result.get("volumes") or ()]

    # --- System ---------------------------------------------------------------------------------------------

    def capabilities(self, drivers: Sequence[str] = ()) -> list[Capability]:
        """Each driver's negotiated facts (only ``drivers`` when given)."""
        request: dict[str, Any] = {"drivers": list(drivers)} if drivers else {}
        return [_typed.Capability(row) for row in self._call("System.Capabilities", request).get("drivers") or ()]

    def events(self, from_revision: int | None = 0, *, follow: bool = False) -> EventStream:
        """Every event after ``from_revision`` (with ``follow``: then live ones until closed)."""
        request = {"from_revision": from_revision, "follow": follow}
        return EventStream(self.transport.start("System.Events", request), from_revision)

    def daemon_status(self) -> DaemonStatus:
        """The daemon's pid, version, uptime, plugins and operations in flight."""
        return _typed.DaemonStatus(self._call("System.Status", {}))

    def shutdown(self) -> dict[str, Any]:
        """Ask the daemon to exit once its operations finished: ``{"pid", "operations"}``."""
        return self._call("System.Shutdown", {})
