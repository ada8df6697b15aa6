"""`vz up / status / stop / delete / volume` as calls to the vz daemon through ``vz_core.api.Client``.

The CLI process only parses arguments, sends the command's context (working directory, environment variables,
``-f``) and renders what comes back: progress messages with the same renderers as ever (``Output.show``), the
result, or the daemon's error object ``{code, message, kind, exit_code, details}`` as one line (and the
``--json`` error object) with its exit code. No driver, no state database and no vz.json parsing happen here.

Ctrl-C (SIGINT) during an operation sends ``cancel`` to the daemon, which stops the operation the way an
interrupted `vz up` always stopped (the running step fails, the operation is recorded as interrupted); the
CLI renders what the daemon reports up to its end and exits 130. A second Ctrl-C leaves at once (the
connection closes, which the daemon also takes as cancel).
"""

from __future__ import annotations

import os
import signal
import sys

TYPE_CHECKING = False  # `typing` costs milliseconds on `vz exec`'s path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import FrameType
    from typing import Any

    from vz_core.cli._output import Output
    from vz_core.daemon import Connection

__all__ = [
    "DaemonClient",
    "Interrupted",
    "call_context",
    "report_api_error",
    "run_environment_command",
    "run_operation",
]

INTERRUPTED = 130


class Interrupted(Exception):
    """The operation was interrupted by Ctrl-C (after the daemon was asked to cancel it)."""


def call_context(definition_file: object = None) -> dict[str, Any]:
    """The request context of this command: where it runs, its environment (secrets, selectors), ``-f``."""
    return {
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
        "definition_file": None if definition_file is None else str(definition_file),
    }


class Operation:
    """One long call (up, stop, delete): iterate its progress messages, then ``result()``; ``cancel()`` any time."""

    def __init__(self, connection: Connection) -> None:
        self._conn = connection
        self._result: dict[str, Any] | None = None
        self._error: dict[str, Any] | None = None

    def __iter__(self) -> Any:
        try:
            while True:
                message = self._conn.receive()
                if message is None:
                    from vz_core.daemon import DaemonError

                    raise DaemonError(
                        f"the vz daemon (pid {self._conn.pid}) went away before the command ended; "
                        "see `vz daemon logs` (the next command starts a new one and converges)",
                        code="UNAVAILABLE",
                        kind="backend_failure",
                        exit_code=1,
                    )
                if isinstance(message, dict):
                    if "progress" in message and isinstance(message["progress"], dict):
                        yield message["progress"]
                    elif "result" in message:
                        self._result = message["result"] if isinstance(message["result"], dict) else {}
                        return
                    elif "error" in message:
                        self._error = message["error"] if isinstance(message["error"], dict) else {}
                        return
        finally:
            if self._result is not None or self._error is not None:
                self._conn.close()

    def result(self) -> dict[str, Any]:
        if self._result is None and self._error is None:
            for _ in self:
                pass
        if self._error is not None:
            from vz_core.daemon import DaemonError

            raise DaemonError.from_wire(self._error)
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        self._conn.cancel()

    def close(self) -> None:
        self._conn.close()


class DaemonClient:
    """The calls of the CLI, each on its own connection to the daemon of this state home (started on demand)."""

    def _call(self, method: str, request: dict[str, Any], fds: tuple[int, ...] = ()) -> Connection:
        from vz_core.daemon import connect

        conn = connect()
        try:
            conn.call(method, request, fds)
        except BaseException:
            conn.close()
            raise
        return conn

    def _request(self, method: str, request: dict[str, Any]) -> dict[str, Any]:
        with self._call(method, request) as conn:
            return conn.result()

    def up(self, *, context: dict[str, Any], environment: str | None, recreate: bool, dry_run: bool) -> Operation:
        request = {"context": context, "environment": environment, "recreate": recreate, "dry_run": dry_run}
        return Operation(self._call("Environments.Up", request))

    def stop(self, *, context: dict[str, Any], environment: str | None) -> Operation:
        return Operation(self._call("Environments.Stop", {"context": context, "environment": environment}))

    def delete(self, *, context: dict[str, Any], environment: str | None, keep_volumes: bool) -> Operation:
        request = {"context": context, "environment": environment, "keep_volumes": keep_volumes}
        return Operation(self._call("Environments.Delete", request))

    def environment(self, *, context: dict[str, Any], environment: str | None, machine: str | None) -> dict[str, Any]:
        request = {"context": context, "environment": environment, "machine": machine}
        return self._request("Environments.Get", request)

    def environments(self, *, context: dict[str, Any], all: bool, machine: str | None) -> dict[str, Any]:
        return self._request("Environments.List", {"context": context, "all": all, "machine": machine})

    def volumes(self, *, context: dict[str, Any]) -> dict[str, Any]:
        return self._request("Volumes.List", {"context": context})

    def remove_volume(self, name: str, *, context: dict[str, Any]) -> dict[str, Any]:
        return self._request("Volumes.Remove", {"context": context, "name": name})

    def open_exec(
        self,
        argv: list[str],
        *,
        context: dict[str, Any],
        environment: str | None,
        machine: str | None,
        workdir: str | None,
        stdio: tuple[int | None, ...],
        tty: bool,
        rows: int,
        cols: int,
        term: str | None,
    ) -> Any:
        from vz_core.cli._exec import ConnectionCall

        request = {
            "context": context,
            "environment": environment,
            "machine": machine,
            "argv": argv,
            "workdir": workdir,
            "env": None,
            "tty": tty,
            "rows": rows,
            "cols": cols,
            "term": term,
            "stdio": [fd is not None for fd in stdio],
        }
        return ConnectionCall(self._call("Machines.Exec", request, tuple(fd for fd in stdio if fd is not None)))


def report_api_error(output: Output, exc: Any) -> int:
    """Print the daemon's error exactly as the CLI prints its own errors; the exit code."""
    code = int(exc.exit_code) if 0 < int(exc.exit_code) < 256 else 1
    output.error(code, str(exc.kind), str(exc.message))
    return code


def run_operation(operation: Any, output: Output) -> dict[str, Any]:
    """Render an operation's progress until its end; its result (raises ApiError, or Interrupted on Ctrl-C)."""
    interrupted: list[int] = []

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if interrupted:  # a second Ctrl-C: leave now
            raise KeyboardInterrupt
        interrupted.append(signum)
        cancel: Callable[[], None] = operation.cancel
        cancel()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        try:
            progress: Iterable[dict[str, Any]] = operation
            for message in progress:
                output.show(message)
            result: dict[str, Any] = operation.result()
        except Exception:
            if interrupted:
                raise Interrupted from None
            raise
        if interrupted:
            # Cancel arrived after the operation had finished: its result stands.
            pass
        return result
    finally:
        signal.signal(signal.SIGINT, previous)
        output.close()


def exit_interrupted(command: str) -> int:
    sys.stderr.write(f"vz {command}: interrupted; run it again to converge\n")
    return INTERRUPTED


def run_environment_command(command: str, parsed: Any, output: Output, usage_error: type[Exception]) -> int:
    """`vz up|status|stop|delete|volume` through the daemon; the exit code."""
    from vz_core.daemon import DaemonError

    if command == "status" and parsed.all and parsed.environment:
        raise usage_error("--all and --environment exclude each other")
    if command == "volume" and parsed.action == "rm" and not parsed.name:
        raise usage_error("vz volume rm NAME: which volume (see `vz volume list`)")
    context = call_context(getattr(parsed, "file", None))
    try:
        client = DaemonClient()
        if command == "up":
            from vz_core.cli._render import render_up

            op = client.up(
                context=context, environment=parsed.environment, recreate=parsed.recreate, dry_run=parsed.dry_run
            )
            result = run_operation(op, output)
            output.result(result, render_up(result))
        elif command == "stop":
            result = run_operation(client.stop(context=context, environment=parsed.environment), output)
            env = result["environment"]
            output.result(
                result, [f"Environment {env['name']} ({env['id']}) stopped: {len(result['machines'])} machine(s)"]
            )
        elif command == "delete":
            from vz_core.cli._render import render_delete

            op = client.delete(context=context, environment=parsed.environment, keep_volumes=parsed.keep_volumes)
            result = run_operation(op, output)
            output.result(result, render_delete(result))
        elif command == "status":
            from vz_core.cli._render import render_status

            if parsed.all:
                report = client.environments(context=context, all=True, machine=parsed.machine)
            else:
                report = client.environment(context=context, environment=parsed.environment, machine=parsed.machine)
            if parsed.json:
                output.document(report)
            else:
                output.text(render_status(report))
        else:  # volume
            from vz_core.cli._render import render_volumes

            if parsed.action == "rm":
                report = client.remove_volume(parsed.name, context=context)
            else:
                report = client.volumes(context=context)
            if parsed.json:
                output.document(report)
            else:
                output.text(render_volumes(report, removed=parsed.action == "rm"))
    except Interrupted:
        return exit_interrupted(command)
    except DaemonError as exc:
        return report_api_error(output, exc)
    return 0
