"""The `vz` command line: parse, dispatch, map understood errors to one line and a documented exit code.

Bare `vz` (and `vz --help`) prints static help and touches nothing. Heavy modules (pydantic, rich) are only
imported by the commands that need them; `vz exec` needs neither.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vz_core.cli._help import TOP_HELP

if TYPE_CHECKING:
    from vz_core.cli._output import Output
    from vz_core.env import Context
    from vz_core.redact import Redactor

__all__ = ["main"]

COMMANDS = ("up", "exec", "status", "stop", "delete", "volume", "driver", "version", "help")


LEGACY_COMMANDS: dict[str, str] = {
    "run": "declare the Machine in vz.json, then `vz up` and `vz exec -- CMD`",
    "shell": "`vz exec -- sh` (or any shell) in the Machine of this worktree's Environment",
    "logs": "`vz exec -- <command that shows the logs>`; `vz status` shows each Machine's state and errors",
    "stack": "an Environment is the stack: list its Machines in vz.json, then `vz up` / `vz stop` / `vz delete`",
    "vm": "a VM is a Machine with a VM driver (qemu, vfkit, hyperv, macos_vm) in vz.json; `vz up` creates it",
    "init": "write vz.json by hand (docs/user-guide.md; schema: schemas/vz.schema.json), then `vz up`",
    "ps": "`vz status` (this worktree's Environment) or `vz status --all`",
    "start": "`vz up` starts the stopped Machines of the Environment",
    "rm": "`vz delete` deletes the selected Environment and everything it owns",
    "ssh": "`vz exec -- CMD` runs a command in a Machine (no SSH needed)",
}
"""0.3 command families that no longer exist → what replaces them (docs/cli.md, "Removed commands")."""


class _UsageError(Exception):
    pass


def _legacy(command: str, rest: list[str]) -> int:
    """A removed 0.3 command: exit 2 with a structured ``legacy_command_removed`` error and migration guidance."""
    import json

    guidance = LEGACY_COMMANDS[command]
    message = f'`vz {command}` was removed in vz 0.4; instead: {guidance} (see docs/cli.md, "Removed commands")'
    if "--json" in rest:
        error = {
            "kind": "legacy_command_removed",
            "exit_code": 2,
            "message": message,
            "removed_command": command,
            "replacement": guidance,
        }
        sys.stdout.write(json.dumps({"event": "error", "command": command, "error": error}) + "\n")
    sys.stderr.write(f"vz {command}: error: {message}\n")
    return 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exits are replaced by our exit code 2
        raise _UsageError(f"{message} (see `{self.prog} --help`)")


def _parser(command: str) -> argparse.ArgumentParser:
    summaries = {
        "up": "Create or reconcile an Environment from vz.json (the nearest one upward from here).",
        "exec": "Run a command in a Machine; stdin/stdout/stderr are streamed and its exit code is vz's.",
        "status": "Show Environments, Machines, their drivers, observed state and drift from vz.json.",
        "stop": "Stop every Machine of an Environment (Machine-local data survives).",
        "delete": "Delete an Environment: its Machines and its records. Other Environments are untouched.",
        "driver": "List, add, verify or configure drivers.",
        "volume": "List or remove named volumes kept after their Environment was deleted (vz delete --keep-volumes).",
    }
    parser = _Parser(prog=f"vz {command}", description=summaries.get(command), allow_abbrev=False)
    if command in ("up", "exec", "status", "stop", "delete"):
        parser.add_argument("--environment", metavar="NAME|ID", help="the Environment (name or id)")
        parser.add_argument(
            "-f", "--file", type=Path, metavar="PATH", help="use this vz.json instead of searching upward"
        )
    if command in ("up", "status", "stop", "delete", "volume"):
        parser.add_argument("--json", action="store_true", help="machine-readable output (see docs/cli.md)")
    if command == "delete":
        parser.add_argument(
            "--keep-volumes",
            action="store_true",
            help="keep the Environment's named volumes (listed by `vz volume list`, removed by `vz volume rm`)",
        )
    if command == "volume":
        parser.add_argument("action", choices=("list", "rm"), help="list kept volumes, or remove one")
        parser.add_argument(
            "name", nargs="?", metavar="NAME", help="the volume to remove (as `vz volume list` names it)"
        )
    if command == "up":
        parser.add_argument(
            "--recreate", action="store_true", help="allow replacing or removing Machines whose definition changed"
        )
        parser.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    if command == "exec":
        parser.add_argument("--machine", metavar="NAME|ID", help="the Machine (name or id)")
        parser.add_argument("--workdir", metavar="DIR", help="working directory inside the Machine")
        parser.add_argument(
            "-i", "--interactive", action="store_true", help="with -t: send what you type (stdin must be a terminal)"
        )
        parser.add_argument(
            "-t", "--tty", action="store_true", help="run the command on a terminal inside the Machine (vz exec -it)"
        )
        parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")
    if command == "status":
        parser.add_argument("--all", action="store_true", help="every Environment of the project")
        parser.add_argument("--machine", metavar="NAME|ID", help="only this Machine")
    if command == "driver":
        from vz_core.cli._driver_cmd import add_driver_arguments

        add_driver_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `vz` console script; returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(TOP_HELP)
        return 0
    if args[0] in ("-V", "--version"):
        args = ["version"]
    command, rest = args[0], args[1:]
    if command == "help":
        if rest and rest[0] in COMMANDS and rest[0] not in ("help", "version"):
            _parser(rest[0]).print_help()
        else:
            sys.stdout.write(TOP_HELP)
        return 0
    if command in LEGACY_COMMANDS:
        return _legacy(command, rest)
    if command not in COMMANDS:
        sys.stderr.write(f"vz: unknown command {command!r}; commands: {', '.join(COMMANDS)} (see `vz --help`)\n")
        return 2
    if command == "version":
        return _version()
    json_mode = "--json" in rest and command != "exec"
    try:
        if command == "exec":
            return _exec(rest)
        parsed = _parser(command).parse_args(rest)
        if command == "driver":
            from vz_core.cli._driver_cmd import run_driver_command

            return run_driver_command(parsed)
        return _environment_command(command, parsed)
    except _UsageError as exc:
        sys.stderr.write(f"vz {command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(
            f"vz {command}: interrupted" + ("" if command == "exec" else "; run it again to converge") + "\n"
        )
        return 130
    except Exception as exc:
        from vz_core.errors import VzError

        if not isinstance(exc, VzError):
            raise  # a bug: let the traceback show
        return _report(command, exc, json_mode)


def _report(command: str, exc: Exception, json_mode: bool, redactor: Redactor | None = None) -> int:
    from vz_core.cli._exit import classify
    from vz_core.cli._output import Output
    from vz_core.errors import VzError

    assert isinstance(exc, VzError)
    code, kind = classify(exc)
    Output("json" if json_mode else "plain", command, redactor=redactor).error(code, kind, str(exc))
    return code


def _version() -> int:
    from importlib.metadata import PackageNotFoundError, version

    from vz_core._types import API_MAJOR, API_MINOR

    try:
        ours = version("vz")
    except PackageNotFoundError:
        ours = "0+unknown"
    sys.stdout.write(f"vz {ours} (Runtime Protocol {API_MAJOR}.{API_MINOR})\n")
    return 0


def _exec(rest: list[str]) -> int:
    if "--" in rest:
        cut = rest.index("--")
        options, command = rest[:cut], rest[cut + 1 :]
        parsed = _parser("exec").parse_args(options)
        if parsed.argv:
            raise _UsageError(f"unexpected arguments before '--': {' '.join(parsed.argv)}")
    else:
        parsed = _parser("exec").parse_args(rest)
        command = list(parsed.argv)
    if not command:
        raise _UsageError("no command given: vz exec [--environment E] [--machine M] -- CMD [ARG...]")
    from vz_core.cli._exec import run_exec
    from vz_core.env import Context
    from vz_core.errors import VzError

    ctx = Context(cwd=Path.cwd(), environ=os.environ, definition_file=parsed.file)
    try:
        if parsed.tty:
            from vz_core.cli._exec import run_terminal

            return run_terminal(
                ctx,
                argv=command,
                environment=parsed.environment,
                machine=parsed.machine,
                workdir=parsed.workdir,
                interactive=parsed.interactive,
            )
        return run_exec(
            ctx, argv=command, environment=parsed.environment, machine=parsed.machine, workdir=parsed.workdir
        )
    except VzError as exc:  # masked with the secrets of the Environment the exec selected
        return _report("exec", exc, False, ctx.redactor)


def _environment_command(command: str, parsed: argparse.Namespace) -> int:
    from vz_core.cli._exit import classify
    from vz_core.cli._output import Output, choose_mode
    from vz_core.env import Context
    from vz_core.errors import VzError

    if command in ("status", "volume"):
        output = Output("json" if parsed.json else "plain", command)
    else:
        output = Output(choose_mode(parsed.json), command)
    ctx = Context(cwd=Path.cwd(), environ=os.environ, progress=output, definition_file=getattr(parsed, "file", None))
    try:
        return _run_environment_command(command, parsed, ctx, output)
    except VzError as exc:
        # Secrets resolved by this command never reach the terminal, even inside a driver's message.
        code, kind = classify(exc)
        output.error(code, kind, ctx.redactor.redact(str(exc)))
        return code


def _run_environment_command(command: str, parsed: argparse.Namespace, ctx: Context, output: Output) -> int:
    import asyncio

    from vz_core.cli._render import render_status, render_up
    from vz_core.env import delete, status, stop, up

    if command == "up":
        result = asyncio.run(up(ctx, environment=parsed.environment, recreate=parsed.recreate, dry_run=parsed.dry_run))
        output.result(result, render_up(result))
    elif command == "status":
        if parsed.all and parsed.environment:
            raise _UsageError("--all and --environment exclude each other")
        report = asyncio.run(
            status(ctx, environment=parsed.environment, all_environments=parsed.all, machine=parsed.machine)
        )
        if parsed.json:
            output.document(report)
        else:
            output.text(render_status(report))
    elif command == "volume":
        from vz_core.cli._render import render_volumes
        from vz_core.env import list_volumes, remove_volume

        if parsed.action == "rm":
            if not parsed.name:
                raise _UsageError("vz volume rm NAME: which volume (see `vz volume list`)")
            report = asyncio.run(remove_volume(ctx, parsed.name))
        else:
            report = asyncio.run(list_volumes(ctx))
        if parsed.json:
            output.document(report)
        else:
            output.text(render_volumes(report, removed=parsed.action == "rm"))
    elif command == "stop":
        result = asyncio.run(stop(ctx, environment=parsed.environment))
        env = result["environment"]
        output.result(
            result, [f"Environment {env['name']} ({env['id']}) stopped: {len(result['machines'])} machine(s)"]
        )
    else:
        from vz_core.cli._render import render_delete

        result = asyncio.run(delete(ctx, environment=parsed.environment, keep_volumes=parsed.keep_volumes))
        output.result(result, render_delete(result))
    return 0
