"""`vz completion bash|zsh|fish` (a shell's completion script) and `vz __complete` (the names it asks for).

The script knows the commands, their sub-commands and their flags itself: it is generated from the same
argparse parsers `vz help` prints, so completing them starts no process. Environment and Machine names (after
``--environment`` and ``--machine``) come from the running vz daemon through `vz __complete environments` /
`vz __complete machines [ENVIRONMENT]`: the daemon is never started for a completion (no daemon, no names),
and each answer is kept in ``<VZ_HOME>/cache/completion.json`` per directory: a later completion prints the
names last seen at once and refreshes them in the background (see ``complete_names``).
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

__all__ = ["complete_names", "completion_script"]

SHELLS = ("bash", "zsh", "fish")
ASK_SECONDS = 0.5
"""How long a completion waits for the daemon before it answers from the cache."""
SUBCOMMANDS: dict[str, tuple[str, ...]] = {
    "volume": ("list", "rm"),
    "guest": ("build", "verify", "fetch"),
    "completion": SHELLS,
}
"""Sub-commands argparse does not hold as sub-parsers (`vz driver` and `vz daemon` are read from theirs)."""
_VALUE_FLAGS_FILES = ("-f", "--file", "--env-file")


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every option of ``parser`` and of its sub-parsers (argparse has no public list of them)."""
    import argparse

    found: list[str] = []
    for action in parser._actions:
        found += [o for o in action.option_strings if o != "-h" and o not in found]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += [o for o in _flags(sub) if o not in found]
    return found


def _sub_commands(parser: argparse.ArgumentParser) -> tuple[str, ...]:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return tuple(action.choices)
    return ()


def _command_flags() -> tuple[dict[str, list[str]], dict[str, tuple[str, ...]]]:
    """(flags of each command, "" for those before a command; sub-commands of each command that has some)."""
    from vz_core.cli._daemon_cmd import daemon_parser
    from vz_core.cli._main import COMMANDS, GLOBAL_OPTIONS, _parser

    flags: dict[str, list[str]] = {}
    subs = dict(SUBCOMMANDS)
    for command in COMMANDS:
        if command in ("up", "exec", "status", "stop", "delete", "volume", "driver", "daemon"):
            parser = daemon_parser() if command == "daemon" else _parser(command)
            flags[command] = _flags(parser)
            found = _sub_commands(parser)
            if found:
                subs[command] = found
        else:
            flags[command] = ["--help"]
    flags[""] = [*GLOBAL_OPTIONS, "--help", "--version"]
    return flags, subs


def completion_script(shell: str) -> str:
    """The completion script for ``shell`` (one of ``SHELLS``)."""
    from vz_core.cli._main import COMMANDS

    flags, subs = _command_flags()
    render: dict[str, Callable[[list[str], dict[str, list[str]], dict[str, tuple[str, ...]]], str]] = {
        "bash": _bash,
        "zsh": _zsh,
        "fish": _fish,
    }
    return render[shell](list(COMMANDS), flags, subs)


def _bash(commands: list[str], flags: dict[str, list[str]], sub_commands: dict[str, tuple[str, ...]]) -> str:
    cases = "\n".join(f"        {c}) opts={json.dumps(' '.join(flags.get(c, [])))} ;;" for c in commands)
    subs = "\n".join(f"        {c}) subs={json.dumps(' '.join(s))} ;;" for c, s in sub_commands.items())
    files = "|".join(_VALUE_FLAGS_FILES)
    return f"""\
# vz completion for bash: `source <(vz completion bash)` (or save it in
# ~/.local/share/bash-completion/completions/vz).
_vz() {{
    local cur prev cmd="" sub="" env="" i w
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        case "$w" in
            --) [[ "$cmd" == exec ]] && return 0 ;;
            --environment) env="${{COMP_WORDS[i+1]}}"; ((i++)) ;;
            --environment=*) env="${{w#--environment=}}" ;;
            -f|--file|--machine|-e|--env|--env-file|-u|--user|-w|--workdir|--tail) ((i++)) ;;
            -*) ;;
            *) if [[ -z "$cmd" ]]; then cmd="$w"; elif [[ -z "$sub" ]]; then sub="$w"; fi ;;
        esac
    done
    case "$prev" in
        --environment) COMPREPLY=($(compgen -W "$(vz __complete environments 2>/dev/null)" -- "$cur")); return 0 ;;
        --machine) COMPREPLY=($(compgen -W "$(vz __complete machines "$env" 2>/dev/null)" -- "$cur")); return 0 ;;
        {files}) COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;
        -e|--env|-u|--user|-w|--workdir|--tail) return 0 ;;
    esac
    if [[ -z "$cmd" ]]; then
        if [[ "$cur" == -* ]]; then
            COMPREPLY=($(compgen -W {json.dumps(" ".join(flags[""]))} -- "$cur"))
        else
            COMPREPLY=($(compgen -W {json.dumps(" ".join(commands))} -- "$cur"))
        fi
        return 0
    fi
    local opts="" subs=""
    case "$cmd" in
{cases}
    esac
    case "$cmd" in
{subs}
        help) subs={json.dumps(" ".join(commands))} ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif [[ -n "$subs" && -z "$sub" ]]; then
        COMPREPLY=($(compgen -W "$subs" -- "$cur"))
    elif [[ "$cmd" == exec ]]; then
        COMPREPLY=($(compgen -W "-- $opts" -- "$cur"))
    fi
    return 0
}}
complete -o default -F _vz vz
"""


def _zsh(commands: list[str], flags: dict[str, list[str]], sub_commands: dict[str, tuple[str, ...]]) -> str:
    return (
        "# vz completion for zsh: `source <(vz completion zsh)` (runs the bash completion through zsh's\n"
        "# bashcompinit, which ships with zsh).\n"
        "autoload -U +X compinit && compinit\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + _bash(commands, flags, sub_commands)
    )


def _fish(commands: list[str], flags: dict[str, list[str]], sub_commands: dict[str, tuple[str, ...]]) -> str:
    lines = [
        "# vz completion for fish: `vz completion fish > ~/.config/fish/completions/vz.fish`",
        "complete -c vz -e",
        f"complete -c vz -f -n __fish_use_subcommand -a '{' '.join(commands)}'",
    ]
    for option in flags[""]:
        lines.append(f"complete -c vz -n __fish_use_subcommand {_fish_option(option)}")
    for command in commands:
        for option in flags.get(command, []):
            lines.append(f"complete -c vz -n '__fish_seen_subcommand_from {command}' {_fish_option(option)}")
        if command in sub_commands:
            subs = " ".join(sub_commands[command])
            lines.append(f"complete -c vz -f -n '__fish_seen_subcommand_from {command}' -a '{subs}'")
    lines.append("complete -c vz -f -l environment -r -a '(vz __complete environments 2>/dev/null)'")
    lines.append("complete -c vz -f -l machine -r -a '(vz __complete machines 2>/dev/null)'")
    return "\n".join(lines) + "\n"


def _fish_option(option: str) -> str:
    return f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}"


# --- names ------------------------------------------------------------------------------------------------


def _cache_file() -> str:
    from vz_core.daemon import daemon_paths

    return os.path.join(daemon_paths().home, "cache", "completion.json")


def _read_cache(path: str) -> dict[str, list[str]]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: str, key: str, names: list[str]) -> None:
    data = _read_cache(path)
    data[key] = names
    if len(data) > 200:  # a bounded file: the oldest keys go first
        data = dict(list(data.items())[-200:])
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        temporary = f"{path}.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(temporary, path)
    except OSError:
        pass


def _ask(what: str, environment: str | None) -> list[str]:
    """The names, from the running daemon (never started for this); raises when it cannot answer."""
    import socket

    os.environ["VZ_DAEMON_AUTOSTART"] = "0"
    socket.setdefaulttimeout(ASK_SECONDS)
    from vz_core.api import Client
    from vz_core.cli._remote import call_context

    with Client(context=call_context()) as client:
        if what == "environments":
            return [str(e["name"]) for e in client.environments()]
        return [str(m["name"]) for m in client.machines(environment or None)]


def complete_names(argv: list[str]) -> int:
    """`vz __complete environments | machines [ENVIRONMENT]`: one name per line (nothing when none are known).

    Names seen before for this directory are printed at once, and a background process then asks the daemon
    to refresh them for the next completion (a completion never waits for a daemon it has an answer for);
    the first time, the daemon is asked directly (at most ``ASK_SECONDS``).
    """
    if not argv or argv[0] not in ("environments", "machines"):
        sys.stderr.write("vz __complete: environments | machines [ENVIRONMENT]\n")
        return 2
    what = argv[0]
    environment = argv[1] if what == "machines" and len(argv) > 1 and argv[1] else None
    key = f"{what}\0{environment or ''}\0{os.getcwd()}"
    path = _cache_file()
    cached = _read_cache(path).get(key)
    if isinstance(cached, list):
        sys.stdout.write("".join(f"{name}\n" for name in cached))
        sys.stdout.flush()
        if sys.platform == "win32":  # no fork: the names are refreshed before returning, for the next time
            _refresh(what, environment, path, key)
            return 0
        if os.fork() != 0:
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        _refresh(what, environment, path, key)
        os._exit(0)
    names = _refresh(what, environment, path, key)
    sys.stdout.write("".join(f"{name}\n" for name in names))
    return 0


def _refresh(what: str, environment: str | None, path: str, key: str) -> list[str]:
    try:
        names = _ask(what, environment)
    except Exception:  # no daemon, a slow one, no project here: no names
        return []
    _write_cache(path, key, names)
    return names
