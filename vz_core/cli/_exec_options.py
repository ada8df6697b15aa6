"""`vz exec`'s docker-style options, checked before the daemon is asked anything: `-e`, `--env-file`, `-u`, `-d`.

Their meanings are `docker exec`'s: ``-e KEY=VALUE`` sets a variable, ``-e KEY`` passes this process's value of
KEY (nothing when it is unset); ``--env-file PATH`` reads one ``KEY=VALUE`` (or ``KEY``) per line, skipping blank
lines and lines starting with ``#``, values taken literally (no quotes, no expansion); every file is read
first, in order, then every ``-e``, a later setting winning. ``-u USER[:GROUP]`` names an account by name or
number. Imported only when one of them is given (`vz exec -- true` stays lean).
"""

from __future__ import annotations

import os
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = ["check_exec_options", "parse_env_file", "parse_env_setting"]

_ACCOUNT = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?")


def parse_env_setting(text: str, environ: Mapping[str, str], where: str) -> tuple[str, str] | None:
    """(KEY, VALUE) of ``KEY=VALUE``, or of ``KEY`` from ``environ`` (None when unset); ValueError names
    ``where`` and never quotes a value (it may be a secret)."""
    key, eq, value = text.partition("=")
    if not key:
        raise ValueError(f"{where}: a setting has no variable name; write KEY=VALUE")
    if any(c.isspace() for c in key):
        raise ValueError(f"{where}: variable {key!r} contains whitespace")
    if "\0" in key or "\0" in value:
        raise ValueError(f"{where}: variable {key!r} holds a NUL character, which no process environment can")
    if not eq:
        found = environ.get(key)
        return None if found is None else (key, found)
    return key, value


def parse_env_file(path: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of one `--env-file` (see the module docstring); ValueError naming the file and line."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ValueError(f"--env-file {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--env-file {path}: not UTF-8 text") from None
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.lstrip()
        if not line or line.startswith("#"):
            continue
        setting = parse_env_setting(line, environ, f"--env-file {path} line {number}")
        if setting is not None:
            found[setting[0]] = setting[1]
    return found


def check_user(user: str) -> None:
    """``USER[:GROUP]``: names or numbers; ValueError saying what is wrong."""
    name, colon, group = user.partition(":")
    if not name or (colon and not group):
        raise ValueError(f"--user {user!r}: write USER or USER:GROUP (a name or a uid, a group name or a gid)")
    for part, what in ((name, "user"), (group, "group")):
        if part and not _ACCOUNT.fullmatch(part):
            raise ValueError(f"--user {user!r}: {part!r} is not a valid {what} name or number")


def check_exec_options(parsed: Any) -> dict[str, str]:
    """Check `-u`, `-d` against the rest; the variables of `--env-file` and `-e` (ValueError for a mistake)."""
    if parsed.user is not None:
        check_user(parsed.user)
    if parsed.detach and (parsed.tty or parsed.interactive):
        raise ValueError("--detach runs the command in the background with no terminal and no input: drop -i/-t")
    variables: dict[str, str] = {}
    for path in parsed.env_file:
        variables.update(parse_env_file(path, os.environ))
    for text in parsed.env:
        setting = parse_env_setting(text, os.environ, f"-e {text.partition('=')[0]}")
        if setting is not None:
            variables[setting[0]] = setting[1]
    return variables
