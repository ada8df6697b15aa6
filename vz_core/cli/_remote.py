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
import sys

from vz_core.wire import INTERRUPTED

TYPE_CHECKING = False  # `typing` costs milliseconds on `vz exec`'s path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import FrameType
    from typing import Any

    from vz_core.api import ApiError
    from vz_core.cli._output import Output

__all__ = [
    "Interrupted",
    "call_context",
    "report_api_error",
    "run_environment_command",
    "run_operation",
]


class Interrupted(Exception):
    """The operation was interrupted by Ctrl-C (after the daemon was asked to cancel it)."""


def call_context(definition_file: object = None) -> dict[str, Any]:
    """The request context of this command: where it runs, its environment (secrets, selectors), ``-f``."""
    return {
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
        "definition_file": None if definition_file is None else str(definition_file),
    }


def report_api_error(output: Output, exc: ApiError) -> int:
    """Print the daemon's error exactly as the CLI prints its own errors; the exit code."""
    code = int(exc.exit_code) if 0 < int(exc.exit_code) < 256 else 1
    output.error(code, str(exc.kind), str(exc.message))
    return code


def run_operation(operation: Any, output: Output) -> dict[str, Any]:
    """Render an operation's progress until its end; its result (raises ApiError, or Interrupted on Ctrl-C)."""
    import signal  # not at the top: `vz exec` imports this module for call_context only

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


def _check_logs_options(parsed: Any, usage_error: type[Exception]) -> None:
    if not parsed.logs:
        given = [
            flag
            for flag, value in (("--follow", parsed.follow), ("--tail", parsed.tail), ("--service", parsed.service))
            if value not in (None, False)
        ]
        if given:
            raise usage_error(f"{' and '.join(given)}: only with --logs (vz status --logs [--machine M] ...)")
        return
    if parsed.all:
        raise usage_error("--logs shows one Machine's log: name it with --machine (and --environment), not --all")
    if parsed.json:
        raise usage_error("--logs prints the log's bytes as they are; --json has no shape for them")
    if parsed.tail is not None and parsed.tail < 0:
        raise usage_error(f"--tail {parsed.tail}: give a number of lines, 0 or more")


def _print_logs(client: Any, parsed: Any) -> int:
    """`vz status --logs`: the Machine's log to stdout as bytes (Ctrl-C ends --follow with exit 0)."""
    out = sys.stdout.buffer
    chunks = client.logs(
        parsed.machine, environment=parsed.environment, follow=parsed.follow, tail=parsed.tail, service=parsed.service
    )
    try:
        for chunk in chunks:
            out.write(chunk)
            out.flush()
    except KeyboardInterrupt:
        if not parsed.follow:
            raise
    except BrokenPipeError:  # `vz status --logs | head`: the reader has what it wanted
        pass
    finally:
        chunks.close()
    return 0


def run_environment_command(command: str, parsed: Any, output: Output, usage_error: type[Exception]) -> int:
    """`vz up|status|stop|delete|volume` through the daemon; the exit code."""
    from vz_core.api import ApiError, Client

    if command == "status" and parsed.all and parsed.environment:
        raise usage_error("--all and --environment exclude each other")
    if command == "status":
        _check_logs_options(parsed, usage_error)
    if command == "volume" and parsed.action == "rm" and not parsed.name:
        raise usage_error("vz volume rm NAME: which volume (see `vz volume list`)")
    context = call_context(getattr(parsed, "file", None))
    try:
        client = Client(context=context)
        if command == "up":
            from vz_core.cli._render import render_up

            op = client.up(parsed.environment, recreate=parsed.recreate, dry_run=parsed.dry_run)
            result = dict(run_operation(op, output))
            output.result(result, render_up(result))
        elif command == "stop":
            result = dict(run_operation(client.stop(parsed.environment), output))
            env = result["environment"]
            output.result(
                result, [f"Environment {env['name']} ({env['id']}) stopped: {len(result['machines'])} machine(s)"]
            )
        elif command == "delete":
            from vz_core.cli._render import render_delete

            result = dict(run_operation(client.delete(parsed.environment, keep_volumes=parsed.keep_volumes), output))
            output.result(result, render_delete(result))
        elif command == "status" and parsed.logs:
            return _print_logs(client, parsed)
        elif command == "status":
            from vz_core.cli._render import render_status

            report = dict(client.status(parsed.environment, all=parsed.all, machine=parsed.machine))
            if parsed.json:
                output.document(report)
            else:
                output.text(render_status(report))
        else:  # volume
            from vz_core.cli._render import render_volumes

            volumes = client.remove_volume(parsed.name) if parsed.action == "rm" else client.volumes()
            report = {"volumes": [dict(v) for v in volumes]}
            if parsed.json:
                output.document(report)
            else:
                output.text(render_volumes(report, removed=parsed.action == "rm"))
    except Interrupted:
        return exit_interrupted(command)
    except ApiError as exc:
        return report_api_error(output, exc)
    return 0
