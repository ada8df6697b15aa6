"""The `vz` command line: parse, send the command to the vz daemon, render what it answers.

`vz up`, `exec`, `status`, `stop`, `delete` and `volume` are calls to the daemon through ``vz_core.api``
(``_remote``, ``_exec``): no driver runs in this process. Errors print one line and exit with a documented
code (docs/cli.md); the daemon's errors arrive already mapped (kind, exit code) and are printed the same way.

Bare `vz` (and `vz --help`) prints static help and touches nothing. `vz exec` is the hot path (B7): it parses
its few options by hand (argparse only for help and mistakes) and imports neither argparse, typing, asyncio
nor pydantic or rich when it succeeds.
"""

from __future__ import annotations

import sys

from vz_core.cli._help import TOP_HELP

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any

    from vz_core.redact import Redactor

__all__ = ["main"]

COMMANDS = (
    "up",
    "exec",
    "status",
    "stop",
    "delete",
    "volume",
    "driver",
    "daemon",
    "guest",
    "completion",
    "version",
    "help",
)


LEGACY_COMMANDS: dict[str, str] = {
    "run": "declare the Machine in vz.json, then `vz up` and `vz exec -- CMD`",
    "shell": "`vz exec -- sh` (or any shell) in the Machine of this worktree's Environment",
    "logs": "`vz status --logs [--machine M] [--service S] [--follow] [--tail N]` (a Machine's or a service's "
    "log); `vz status` shows each "
    "Machine's state and errors",
    "stack": "an Environment is the stack: list its Machines in vz.json, then `vz up` / `vz stop` / `vz delete`",
    "vm": "a VM is a Machine with a VM driver (qemu, vfkit, hyperv, macos_vm) in vz.json; `vz up` creates it",
    "init": "write vz.json by hand (docs/user-guide.md; schema: schemas/vz.schema.json), then `vz up`",
    "ps": "`vz status` (this worktree's Environment) or `vz status --all`",
    "start": "`vz up` starts the stopped Machines of the Environment",
    "rm": "`vz delete` deletes the selected Environment and everything it owns",
    "ssh": "`vz exec -- CMD` runs a command in a Machine (no SSH needed)",
}
"""Command families of earlier vz releases that no longer exist → what replaces them (docs/cli.md, "Removed
commands"). The message names no release: this vz's own version is what `vz version` prints."""


class _UsageError(Exception):
    pass


EXEC_OWN_ERROR = 125
"""`vz exec`'s exit status when vz itself failed (a usage mistake, a selection, the daemon, a driver), as
`docker exec` reserves 125: the command's own 1-4 and 69 are then never mistaken for vz's. 126 (cannot
invoke) and 127 (not found) come from the Machine, as the command's own status."""


GLOBAL_OPTIONS = {"--json": False, "--environment": True, "-f": True, "--file": True}
"""Options that may come before the command (`vz --json status`, `vz --environment feat exec -- sh`):
name → whether it takes a value. They are moved after the command, where the command's parser reads them."""


def _hoist_global_options(args: list[str]) -> list[str] | str:
    """``args`` with the global options before the command moved after it; a message for a mistake."""
    leading: list[str] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        name, eq, _ = arg.partition("=")
        if name not in GLOBAL_OPTIONS:
            known = ", ".join(GLOBAL_OPTIONS)
            return f"unknown option {arg!r} before the command; options allowed there: {known} (see `vz --help`)"
        if GLOBAL_OPTIONS[name] and not eq:
            if i + 1 >= len(args):
                return f"{name} needs a value (see `vz --help`)"
            leading += [arg, args[i + 1]]
            i += 2
            continue
        if not GLOBAL_OPTIONS[name] and eq:
            return f"{name} takes no value (see `vz --help`)"
        leading.append(arg)
        i += 1
    if i >= len(args):
        return f"no command after {' '.join(leading)}; commands: {', '.join(COMMANDS)} (see `vz --help`)"
    command, rest = args[i], args[i + 1 :]
    if command == "exec":  # before its `--` (everything after the command's name may be the command)
        return [command, *leading, *rest]
    return [command, *rest, *leading]  # after sub-commands (`vz --json daemon status`)


def _legacy(command: str, rest: list[str]) -> int:
    """A removed command: exit 2 with a structured ``legacy_command_removed`` error and migration guidance."""
    import json

    guidance = LEGACY_COMMANDS[command]
    message = f'`vz {command}` was removed; instead: {guidance} (see docs/cli.md, "Removed commands")'
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


def _parser(command: str) -> argparse.ArgumentParser:
    import argparse
    from pathlib import Path

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> Any:  # argparse's own exits are replaced by our exit code 2
            raise _UsageError(f"{message} (see `{self.prog} --help`)")

    summaries = {
        "up": "Create or reconcile an Environment from vz.json (the nearest one upward from here).",
        "exec": "Run a command in a Machine; stdin/stdout/stderr are streamed and its exit code is vz's.",
        "status": "Show Environments, Machines, their drivers, observed state and drift from vz.json.",
        "stop": "Stop every Machine of an Environment (Machine-local data survives).",
        "delete": "Delete an Environment: its Machines and its records. Other Environments are untouched.",
        "driver": "List, add (a manifest or an https URL), upgrade, roll back, remove, verify or configure drivers; "
        "sign manifests; choose the keys you trust.",
        "volume": "List named volumes (in use, or kept after their Environment was deleted: vz delete "
        "--keep-volumes) or remove a kept one.",
    }
    parser = Parser(prog=f"vz {command}", description=summaries.get(command), allow_abbrev=False)
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
        parser.add_argument("action", choices=("list", "rm"), help="list volumes, or remove a kept one")
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
        parser.add_argument("-w", "--workdir", metavar="DIR", help="working directory inside the Machine")
        parser.add_argument(
            "-e",
            "--env",
            action="append",
            default=[],
            metavar="KEY[=VALUE]",
            help="set a variable for the command (KEY alone: its value here, when set); repeatable",
        )
        parser.add_argument(
            "--env-file",
            action="append",
            default=[],
            metavar="PATH",
            help="read KEY=VALUE lines (# comments, blank lines; KEY alone as for -e); -e wins; repeatable",
        )
        parser.add_argument(
            "-u", "--user", metavar="USER[:GROUP]", help="run as this user (name or uid) and group (name or gid)"
        )
        parser.add_argument(
            "-d",
            "--detach",
            action="store_true",
            help="start the command in the background and return (no input, output discarded)",
        )
        parser.add_argument(
            "--pass-pipes",
            action="store_true",
            help="hand stdout/stderr pipes to the command as they are (fastest; a reader of them then waits "
            "until every process holding them, background ones too, has closed them)",
        )
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
        parser.add_argument(
            "--logs",
            action="store_true",
            help="print the Machine's log (its main process's output) instead: the default Machine, or --machine",
        )
        parser.add_argument(
            "--follow", action="store_true", help="with --logs: keep printing what is added (Ctrl-C ends)"
        )
        parser.add_argument(
            "--tail", type=int, metavar="N", help="with --logs: start with the last N lines of what is there now"
        )
        parser.add_argument(
            "--service",
            metavar="NAME",
            help="with --logs: that service's output instead (kept across its restarts while the Machine runs)",
        )
    if command == "driver":
        from vz_core.cli._driver_cmd import add_driver_arguments

        add_driver_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `vz` console script; returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0].startswith("-") and args[0] not in ("-h", "--help", "-V", "--version"):
        hoisted = _hoist_global_options(args)
        if isinstance(hoisted, str):
            sys.stderr.write(f"vz: error: {hoisted}\n")
            return 2
        args = hoisted
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(TOP_HELP)
        return 0
    if args[0] in ("-V", "--version"):
        args = ["version"]
    command, rest = args[0], args[1:]
    if command == "help":
        if rest and rest[0] == "daemon":
            return _daemon(["--help"])
        if rest and rest[0] == "guest":
            return _guest(["--help"])
        if rest and rest[0] == "completion":
            return _completion(["--help"])
        if rest and rest[0] in COMMANDS and rest[0] not in ("help", "version"):
            _parser(rest[0]).print_help()
        else:
            sys.stdout.write(TOP_HELP)
        return 0
    if command in LEGACY_COMMANDS:
        return _legacy(command, rest)
    if command == "__complete":  # the completion scripts' question (not a command of its own)
        from vz_core.cli._completion import complete_names

        return complete_names(rest)
    if command == "completion":
        return _completion(rest)
    if command not in COMMANDS:
        sys.stderr.write(f"vz: unknown command {command!r}; commands: {', '.join(COMMANDS)} (see `vz --help`)\n")
        return 2
    if command == "version":
        return _version()
    if command == "daemon":
        return _daemon(rest)
    if command == "guest":
        return _guest(rest)
    json_mode = "--json" in rest and command != "exec"
    try:
        _check_state_home()
        if command == "exec":
            return _exec(rest)
        parsed = _parser(command).parse_args(rest)
        if command == "driver":
            from vz_core.cli._driver_cmd import run_driver_command

            return run_driver_command(parsed)
        return _environment_command(command, parsed)
    except _UsageError as exc:
        sys.stderr.write(f"vz {command}: error: {_local_redactor(rest).redact(str(exc))}\n")
        return EXEC_OWN_ERROR if command == "exec" else 2
    except KeyboardInterrupt:
        sys.stderr.write(
            f"vz {command}: interrupted" + ("" if command == "exec" else "; run it again to converge") + "\n"
        )
        return 130
    except Exception as exc:
        from vz_core.errors import VzError

        if not isinstance(exc, VzError):
            raise  # a bug: let the traceback show
        code = _report(command, exc, json_mode, _local_redactor(rest))
        return EXEC_OWN_ERROR if command == "exec" else code


def _check_state_home() -> None:
    """A state home others may write to is refused; one they may read or enter is warned about (the fix named)."""
    from vz_core.daemon import state_home_problem

    problem = state_home_problem()
    if problem is None:
        return
    refuse, message = problem
    if refuse:
        from vz_core.errors import UserError

        raise UserError(message)
    sys.stderr.write(f"vz: warning: {message}\n")


def _local_redactor(rest: list[str]) -> Redactor:
    """For an error this process found itself (a usage mistake): the secret values vz.json declares, read from
    this environment, so that an argument holding one is masked. The daemon masks everything it answers."""
    import os
    from pathlib import Path

    from vz_core.env import Context, learn_project_secrets

    definition: Path | None = None
    for index, arg in enumerate(rest):
        if arg in ("-f", "--file") and index + 1 < len(rest):
            definition = Path(rest[index + 1])
        elif arg.startswith("--file="):
            definition = Path(arg.partition("=")[2])
    try:
        ctx = Context(cwd=Path.cwd(), environ=os.environ, definition_file=definition)
    except OSError:  # the working directory is gone
        from vz_core.redact import Redactor

        return Redactor()
    learn_project_secrets(ctx, recorded=False)
    return ctx.redactor


def _report(command: str, exc: Exception, json_mode: bool, redactor: Redactor | None = None) -> int:
    from vz_core.cli._exit import classify
    from vz_core.cli._output import Output
    from vz_core.errors import VzError

    assert isinstance(exc, VzError)
    code, kind = classify(exc)
    Output("json" if json_mode else "plain", command, redactor=redactor).error(code, kind, str(exc))
    return code


def _completion(rest: list[str]) -> int:
    from vz_core.cli._completion import SHELLS, completion_script

    if rest in (["-h"], ["--help"]):
        sys.stdout.write(
            "usage: vz completion bash|zsh|fish\n\nPrint the shell's completion script for vz: commands, flags, "
            "Environment and Machine names.\n  bash: source <(vz completion bash)\n  zsh:  source <(vz "
            "completion zsh)\n  fish: vz completion fish > ~/.config/fish/completions/vz.fish\n"
        )
        return 0
    if len(rest) != 1 or rest[0] not in SHELLS:
        given = " ".join(rest) or "nothing"
        sys.stderr.write(f"vz completion: error: which shell: bash, zsh or fish (got {given})\n")
        return 2
    sys.stdout.write(completion_script(rest[0], COMMANDS, GLOBAL_OPTIONS, _parser))
    return 0


def _version() -> int:
    from importlib.metadata import PackageNotFoundError, version

    from vz_core._types import API_MAJOR, API_MINOR

    try:
        ours = version("vz")
    except PackageNotFoundError:
        ours = "0+unknown"
    sys.stdout.write(f"vz {ours} (Runtime Protocol {API_MAJOR}.{API_MINOR})\n")
    return 0


def _daemon(rest: list[str]) -> int:
    from vz_core.cli._daemon_cmd import run_daemon_command

    return run_daemon_command(rest)


def _guest(rest: list[str]) -> int:
    """`vz guest build | verify | fetch`: guest bundles, by the built-in drivers' tool (``python -m
    vz_drivers.guest``, named by string: the CLI imports no driver code)."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "vz_drivers.guest", *rest], check=False).returncode


class _ExecArgs:
    """`vz exec`'s options (the same names argparse gives them)."""

    def __init__(self) -> None:
        self.environment: str | None = None
        self.file: str | None = None
        self.machine: str | None = None
        self.workdir: str | None = None
        self.user: str | None = None
        self.env: list[str] = []
        self.env_file: list[str] = []
        self.interactive = False
        self.tty = False
        self.detach = False
        self.pass_pipes = False
        self.argv: list[str] = []


_EXEC_VALUES = {"--environment": "environment", "-f": "file", "--file": "file", "--machine": "machine"}
_EXEC_VALUES.update({"--workdir": "workdir", "-w": "workdir", "--user": "user", "-u": "user"})
_EXEC_LISTS = {"-e": "env", "--env": "env", "--env-file": "env_file"}
_EXEC_FLAGS = {"-i": "i", "--interactive": "i", "-t": "t", "--tty": "t", "-it": "it", "-ti": "it"}
_EXEC_FLAGS.update({"-d": "d", "--detach": "d", "--pass-pipes": "p"})


def _quick_exec_args(rest: list[str]) -> _ExecArgs | None:
    """The common spellings of `vz exec` options, parsed without argparse; None for anything else.

    Anything unusual (help, a mistake, an abbreviation) goes to argparse, which explains it.
    """
    parsed = _ExecArgs()
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--":
            parsed.argv = rest[i + 1 :]
            return parsed
        if not arg.startswith("-") or arg == "-":
            parsed.argv = rest[i:]
            return parsed
        name, eq, value = arg.partition("=")
        if name in _EXEC_VALUES or name in _EXEC_LISTS:
            if not eq:
                if i + 1 >= len(rest) or rest[i + 1].startswith("-"):
                    return None
                value = rest[i + 1]
                i += 1
            if name in _EXEC_LISTS:
                getattr(parsed, _EXEC_LISTS[name]).append(value)
            else:
                setattr(parsed, _EXEC_VALUES[name], value)
        elif arg in _EXEC_FLAGS:
            flags = _EXEC_FLAGS[arg]
            parsed.interactive = parsed.interactive or "i" in flags
            parsed.tty = parsed.tty or "t" in flags
            parsed.detach = parsed.detach or "d" in flags
            parsed.pass_pipes = parsed.pass_pipes or "p" in flags
        else:
            return None
        i += 1
    return parsed


def _exec_args(rest: list[str]) -> Any:
    quick = _quick_exec_args(rest)
    if quick is not None:
        parsed: Any = quick
        command = quick.argv
    elif "--" in rest:
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
    parsed.argv = command
    return parsed


def _exec(rest: list[str]) -> int:
    parsed = _exec_args(rest)
    variables: dict[str, str] = {}
    if parsed.env or parsed.env_file or parsed.user is not None or parsed.detach:
        from vz_core.cli._exec_options import check_exec_options

        try:
            variables = check_exec_options(parsed)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
    from vz_core.api import ApiError, Client
    from vz_core.cli._exec import run_exec
    from vz_core.cli._remote import call_context

    client = Client()
    context = call_context(parsed.file)
    try:
        status = run_exec(
            client,
            context=context,
            argv=parsed.argv,
            environment=parsed.environment,
            machine=parsed.machine,
            workdir=parsed.workdir,
            tty=parsed.tty,
            interactive=parsed.interactive,
            env=variables,
            user=parsed.user,
            detach=parsed.detach,
            pass_pipes=parsed.pass_pipes,
        )
    except ApiError as exc:  # already masked by the daemon with the secrets of the Environment it selected
        from vz_core.cli._output import Output
        from vz_core.cli._remote import report_api_error

        report_api_error(Output("plain", "exec"), exc)
        return EXEC_OWN_ERROR
    if status == 127 and parsed.machine is None and "/" not in parsed.argv[0]:
        _hint_positional_machine(client, context, parsed)
    return status


def _hint_positional_machine(client: Any, context: dict[str, Any], parsed: Any) -> None:
    """`vz exec db -- true` (docker's `docker exec CONTAINER CMD`) ran a command named db: when db is a Machine
    of the Environment, say how to name it. Asked only after a command was not found."""
    from vz_core.api import ApiError

    name = parsed.argv[0]
    try:
        machines = client.machines(parsed.environment, context=context)
    except ApiError:
        return
    if any(name in (m.get("name"), m.get("id")) for m in machines):
        import shlex

        command = shlex.join(parsed.argv[2:] if parsed.argv[1:2] == ["--"] else parsed.argv[1:]) or "CMD"
        sys.stderr.write(f"vz exec: {name} is a Machine: did you mean `vz exec --machine {name} -- {command}`?\n")


def _environment_command(command: str, parsed: argparse.Namespace) -> int:
    from vz_core.cli._output import Output, choose_mode
    from vz_core.cli._remote import run_environment_command

    if command in ("status", "volume"):
        output = Output("json" if parsed.json else "plain", command)
    else:
        output = Output(choose_mode(parsed.json), command)
    return run_environment_command(command, parsed, output, _UsageError)
