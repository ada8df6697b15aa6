"""Reading a call's request: every field checked (type, range, unknown keys) with an error naming it.

A request's ``context`` (``{"cwd": str, "environ": {str: str}, "definition_file": str | null}``) becomes the
``vz_core.env.Context`` the Environment operation runs in: the client's working directory and environment
variables (held in memory for this call only: the values of ``from_env`` secrets come from there, they are
never written anywhere), and its ``--file``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vz_core.errors import UserError

if TYPE_CHECKING:
    from vz_core.env import Context, Progress

__all__ = ["Request", "RequestError", "context_of"]

MAX_ARGV = 4096
MAX_STRING = 1 << 20
MAX_WINDOW = 10000


class RequestError(UserError):
    """A request field is missing, of the wrong type or out of range; ``field`` names it (``request.argv[2]``)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"request field {field}: {problem}")
        self.field = field


def _check_text(where: str, value: str) -> str:
    if "\x00" in value:
        raise RequestError(where, "contains a NUL character, which no path, name or argument can hold")
    if len(value) > MAX_STRING:
        raise RequestError(where, f"is longer than {MAX_STRING} characters")
    return value


class Request:
    """One call's request object, read field by field; ``done()`` refuses the fields nobody read."""

    def __init__(self, method: str, data: object, allowed: Collection[str]) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise RequestError("request", f"must be a JSON object for {method}, not {type(data).__name__}")
        unknown = sorted(str(key) for key in data if key not in allowed)
        if unknown:
            known = ", ".join(sorted(allowed)) or "none"
            raise RequestError(f"request.{unknown[0]}", f"is not a field of {method} (its fields: {known}); remove it")
        self.method = method
        self.data: dict[str, Any] = data

    def _get(self, name: str) -> object:
        return self.data.get(name)

    def string(self, name: str, *, required: bool = False, empty: bool = True) -> str | None:
        value = self._get(name)
        if value is None:
            if required:
                raise RequestError(f"request.{name}", f"is required by {self.method}")
            return None
        if not isinstance(value, str):
            raise RequestError(f"request.{name}", f"must be a string, not {type(value).__name__}")
        if not empty and not value:
            raise RequestError(f"request.{name}", "must not be empty")
        return _check_text(f"request.{name}", value)

    def required_string(self, name: str) -> str:
        value = self.string(name, required=True, empty=False)
        assert value is not None
        return value

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise RequestError(f"request.{name}", f"must be true or false, not {value!r}")
        return value

    def integer(self, name: str, *, default: int | None = None, low: int = 0, high: int = 1 << 62) -> int | None:
        value = self._get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(f"request.{name}", f"must be an integer, not {value!r}")
        if not low <= value <= high:
            raise RequestError(f"request.{name}", f"must be between {low} and {high}, not {value}")
        return value

    def argv(self, name: str = "argv") -> list[str]:
        value = self._get(name)
        if not isinstance(value, list) or not value:
            raise RequestError(f"request.{name}", "must be a non-empty list of strings (the command and its arguments)")
        if len(value) > MAX_ARGV:
            raise RequestError(f"request.{name}", f"has more than {MAX_ARGV} arguments")
        out: list[str] = []
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise RequestError(f"request.{name}[{index}]", f"must be a string, not {type(item).__name__}")
            out.append(_check_text(f"request.{name}[{index}]", item))
        if not out[0]:
            raise RequestError(f"request.{name}[0]", "must name the command to run (it is empty)")
        return out

    def string_map(self, name: str) -> dict[str, str]:
        value = self._get(name)
        if value is None:
            return {}
        return _string_map(f"request.{name}", value)

    def flags(self, name: str, count: int) -> tuple[bool, ...]:
        value = self._get(name)
        if value is None:
            return (False,) * count
        if not isinstance(value, list) or len(value) != count or not all(isinstance(v, bool) for v in value):
            raise RequestError(f"request.{name}", f"must be a list of {count} booleans, not {value!r}")
        return tuple(value)

    def context(self, progress: Progress | None = None) -> Context:
        return context_of(self._get("context"), progress=progress)


def _string_map(where: str, value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise RequestError(where, f"must be an object of strings, not {type(value).__name__}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
            raise RequestError(f"{where}[{key!r}]", "is not a valid variable name (non-empty, no '=' or NUL)")
        if not isinstance(item, str):
            raise RequestError(f"{where}.{key}", f"must be a string, not {type(item).__name__}")
        if "\x00" in item:  # the value itself is never shown: it may be a secret
            raise RequestError(f"{where}.{key}", "contains a NUL character, which no environment value can hold")
        out[key] = item
    return out


def context_of(data: object, *, progress: Progress | None = None) -> Context:
    """The ``vz_core.env.Context`` of a request's ``context`` object (checked before anything is done)."""
    from vz_core.env import Context

    if data is None:
        raise RequestError(
            "request.context", 'is required: {"cwd": "/abs/dir", "environ": {...}, "definition_file": null}'
        )
    if not isinstance(data, dict):
        raise RequestError("request.context", f"must be an object, not {type(data).__name__}")
    unknown = sorted(str(key) for key in data if key not in ("cwd", "environ", "definition_file"))
    if unknown:
        raise RequestError(f"request.context.{unknown[0]}", "is not a field of context (cwd, environ, definition_file)")
    cwd = data.get("cwd")
    if not isinstance(cwd, str) or not cwd:
        raise RequestError("request.context.cwd", "must be the caller's working directory, an absolute path")
    _check_text("request.context.cwd", cwd)
    path = Path(cwd)
    if not path.is_absolute():
        raise RequestError("request.context.cwd", f"must be an absolute path, not {cwd!r}")
    if not path.is_dir():
        raise RequestError("request.context.cwd", f"{cwd} is not a directory (it may have been removed)")
    environ = _string_map("request.context.environ", data.get("environ") or {})
    definition = data.get("definition_file")
    definition_file: Path | None = None
    if definition is not None:
        if not isinstance(definition, str) or not definition:
            raise RequestError("request.context.definition_file", "must be a path (string) or null")
        _check_text("request.context.definition_file", definition)
        definition_file = Path(definition) if Path(definition).is_absolute() else path / definition
    from vz_core.daemon._sessions import running_pool

    ctx = Context(cwd=path, environ=_Environ(environ), definition_file=definition_file, drivers=running_pool())
    if progress is not None:
        ctx.progress = progress
    return ctx


class _Environ(Mapping[str, str]):
    """The caller's environment variables, in this process's memory only; never shown (``repr`` names keys)."""

    def __init__(self, values: dict[str, str]) -> None:
        self._values = values

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Any:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"<environ of the caller: {len(self._values)} variables>"
