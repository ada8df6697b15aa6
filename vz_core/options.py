"""Driver options, each declared once with a type, a real default and bounds; parsed by one piece of code.

An ``Option`` (part of a driver's ``vz_core.registry.DriverDeclaration``) says what an option is: its kind, its
typed default, its bounds or choices, who may set it (``scope``) and a sentence of help. From the declaration
come the plugin's ``--help``, the docs tables, the options schema of a generated manifest, the host's check of a
vz.json ``driver_options`` and of the host configuration, and the frozen ``Options`` object a driver's factory
receives: a driver reads attributes (``options.stop_timeout`` is a ``float``), it never parses text.

Kinds and what they accept (a JSON value, or text from a command line or ``vz driver configure``):

============ ==================================================================================================
``duration`` seconds: a finite number (or its text) within the bounds; NaN and infinities are refused
``float``    a finite number within the bounds
``int``      an integer (or its decimal text) within the bounds
``size``     bytes: an integer, or text with a unit (``512MiB``, ``64GiB``; K/M/G/T are powers of 1024)
``bool``     ``true``/``false`` (text: 1/0, true/false, yes/no, on/off)
``choice``   one of ``choices``
``path``     a file system path (``absolute=True``: must be absolute); ``""`` means "not set"
``str``      text without NUL
``list``     a list of strings, or one comma-separated string
============ ==================================================================================================

Numeric kinds always carry explicit bounds (``minimum``, ``maximum``; ``exclusive_minimum`` makes the lower
one open), checked when the declaration is registered. This module imports only the standard library (a plugin
imports it before its handshake).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypeVar, dataclass_transform

__all__ = [
    "KINDS",
    "NUMERIC_KINDS",
    "Option",
    "OptionError",
    "OptionKind",
    "Options",
    "Scope",
    "parse_options",
    "timeout",
]

Scope = Literal["project", "host"]
OptionKind = Literal["duration", "float", "int", "size", "bool", "choice", "path", "str", "list"]
KINDS: tuple[str, ...] = ("duration", "float", "int", "size", "bool", "choice", "path", "str", "list")
NUMERIC_KINDS = frozenset({"duration", "float", "int", "size"})
MAX_TEXT = 4096
"""Characters of a text, path or list item option (a longer value is not an option value but a mistake)."""

_METAVARS = {
    "duration": "SECONDS",
    "float": "N",
    "int": "N",
    "size": "BYTES",
    "bool": "true|false",
    "choice": "CHOICE",
    "path": "PATH",
    "str": "VALUE",
    "list": "A,B",
}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,30}")
_NUMBER_TEXT = re.compile(r"[+-]?([0-9]{1,30}(\.[0-9]{0,30})?|\.[0-9]{1,30})([eE][+-]?[0-9]{1,4})?")
_SIZE_TEXT = re.compile(r"([0-9]{1,30})\s*(|b|[kmgt]|[kmgt]i?b)", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_T = TypeVar("_T")


class OptionError(ValueError):
    """A value an option does not accept: ``option`` is its name, ``problem`` says what it must be and what was
    given ("must be a number of seconds in (0, 3600], got -1")."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"{option}: {problem}")
        self.option = option
        self.problem = problem


def _shown(value: Any) -> str:
    """A given value as the error shows it: JSON-like, one line, at most 80 characters."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    elif isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        text = repr(int(value)) if abs(value) < 1e15 else repr(value)
    elif isinstance(value, int | float):
        text = repr(value)
    elif value is None:
        text = "null"
    else:
        text = f"a {'list' if isinstance(value, list | tuple) else 'JSON ' + type(value).__name__}"
    text = text.replace("\n", "\\n").replace("\r", "\\r")
    return text if len(text) <= 80 else text[:77] + "..."


def _number(value: float) -> str:
    return f"{value:g}" if not float(value).is_integer() else str(int(value))


def _bytes(value: float) -> str:
    number = int(value)
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if number >= size and number % size == 0:
            return f"{number // size} {unit}"
    return f"{number} bytes"


@dataclass_transform(frozen_default=True)
def _frozen(cls: type[_T]) -> type[_T]:
    """A frozen record class (init with defaults, eq, hash, repr) without dataclasses' per-class code generation,
    which would cost a plugin process milliseconds before its handshake."""
    names = tuple(cls.__annotations__)
    defaults = {n: cls.__dict__[n] for n in names if n in cls.__dict__}
    title = cls.__name__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(names):
            raise TypeError(f"{title}() takes {len(names)} arguments, {len(args)} given")
        values = dict(zip(names, args, strict=False))
        for key, value in kwargs.items():
            if key not in names:
                raise TypeError(f"{title}() got an unexpected keyword argument {key!r}")
            if key in values:
                raise TypeError(f"{title}() got multiple values for argument {key!r}")
            values[key] = value
        for name in names:
            if name not in values:
                if name not in defaults:
                    raise TypeError(f"{title}() missing required argument {name!r}")
                values[name] = defaults[name]
            object.__setattr__(self, name, values[name])
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    def __setattr__(self: Any, name: str, value: Any) -> None:
        raise AttributeError(f"{title} is immutable (cannot set {name!r})")

    def __eq__(self: Any, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in names)

    def __hash__(self: Any) -> int:
        return hash(tuple(getattr(self, n) for n in names))

    def __repr__(self: Any) -> str:
        return f"{title}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    for function in (__init__, __setattr__, __eq__, __hash__, __repr__):
        function.__qualname__ = f"{title}.{function.__name__}"
        setattr(cls, function.__name__, function)
    return cls


@_frozen
class Option:
    """One driver option, declared once (see the module docstring for the kinds).

    ``default`` is the typed value used when nobody sets the option (``""`` for a path or text that is "not
    set": the driver then finds or computes it, and ``default_text`` says how, for ``--help`` and the docs).
    ``scope``: ``"project"`` (vz.json ``driver_options`` or the host configuration) or ``"host"`` (the host
    configuration only: options choosing binaries, host paths or host networks). ``flag`` overrides the plugin's
    command-line flag (default ``--name-with-dashes``); ``repeat`` makes a ``list`` option's flag take one item
    per use.
    """

    name: str
    help: str
    default: Any = ""
    kind: OptionKind = "str"
    scope: Scope = "project"
    flag: str = ""
    repeat: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[str, ...] = ()
    absolute: bool = False
    default_text: str = ""

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def metavar(self) -> str:
        if self.repeat:
            return "NAME"
        if self.kind == "choice" and self.choices:
            return "|".join(self.choices)
        return _METAVARS.get(self.kind, "VALUE")

    # What it accepts, in words ---------------------------------------------------------------------------

    def bounds(self) -> str:
        """The range of a numeric option, ``(0, 3600]`` style (sizes with units); "" for other kinds."""
        if self.kind not in NUMERIC_KINDS or self.minimum is None or self.maximum is None:
            return ""
        show = _bytes if self.kind == "size" else _number
        return f"{'(' if self.exclusive_minimum else '['}{show(self.minimum)}, {show(self.maximum)}]"

    def expects(self) -> str:
        """What a value must be, as a phrase: "a number of seconds in (0, 3600]"."""
        within = f" in {self.bounds()}" if self.bounds() else ""
        if self.kind == "duration":
            return f"a number of seconds{within}"
        if self.kind == "float":
            return f"a number{within}"
        if self.kind == "int":
            return f"an integer{within}"
        if self.kind == "size":
            return f"a size in bytes (an integer, or text such as 512MiB or 64GiB){within}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join(f'"{c}"' for c in self.choices)
        if self.kind == "path":
            return "an absolute path" if self.absolute else "a path"
        if self.kind == "list":
            return "a list of strings (or one comma-separated string)"
        return "a string"

    def shown_default(self) -> str:
        """The default as ``--help`` and the docs show it."""
        if self.default_text:
            return self.default_text
        value = self.default
        if isinstance(value, bool):
            return "true" if value else "false"
        if self.kind == "size" and isinstance(value, int):
            return _bytes(value)
        if isinstance(value, float):
            return _number(value)
        if isinstance(value, tuple | list):
            return ", ".join(value) or "none"
        return str(value) if value != "" else "none"

    # Parsing -----------------------------------------------------------------------------------------------

    def _refuse(self, value: Any) -> OptionError:
        return OptionError(self.name, f"must be {self.expects()}, got {_shown(value)}")

    def _within(self, number: float, given: Any) -> None:
        low, high = self.minimum, self.maximum
        if low is not None and (number < low or (self.exclusive_minimum and number == low)):
            raise self._refuse(given)
        if high is not None and number > high:
            raise self._refuse(given)

    def parse(self, value: Any) -> Any:
        """The typed value of ``value`` (a JSON value, or text from a command line); ``OptionError`` naming the
        option, what it must be and what was given when it does not fit. Idempotent: a parsed value parses to
        itself."""
        kind = self.kind
        if kind in ("duration", "float"):
            number: float
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise self._refuse(value)
            if isinstance(value, str):
                if not _NUMBER_TEXT.fullmatch(value.strip()):
                    raise self._refuse(value)
                number = float(value.strip())
            else:
                try:
                    number = float(value)
                except OverflowError:  # an int too large for a float
                    raise self._refuse(value) from None
            if not math.isfinite(number):
                raise self._refuse(value)
            self._within(number, value)
            return number
        if kind in ("int", "size"):
            integer: int
            if isinstance(value, bool):
                raise self._refuse(value)
            if isinstance(value, int):
                integer = value
            elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
                integer = int(value)
            elif isinstance(value, str) and kind == "int" and _INT_TEXT.fullmatch(value.strip()):
                integer = int(value.strip())
            elif isinstance(value, str) and kind == "size" and (match := _SIZE_TEXT.fullmatch(value.strip())):
                integer = int(match.group(1)) * _UNITS[match.group(2)[:1].lower()]
            else:
                raise self._refuse(value)
            self._within(integer, value)
            return integer
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in _TRUE:
                    return True
                if lowered in _FALSE:
                    return False
            raise self._refuse(value)
        if kind == "list":
            items: list[Any]
            if isinstance(value, str):
                items = value.split(",")
            elif isinstance(value, list | tuple):
                items = list(value)
            else:
                raise self._refuse(value)
            if not all(isinstance(item, str) and "\0" not in item and len(item) <= MAX_TEXT for item in items):
                raise self._refuse(value)
            return tuple(item for item in (part.strip() for part in items) if item)
        if kind == "path" and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or "\0" in value or len(value) > MAX_TEXT:
            raise self._refuse(value)
        if kind == "choice" and value not in self.choices:
            raise self._refuse(value)
        if kind == "path" and self.absolute and value and not value.startswith("/") and not _windows_absolute(value):
            raise self._refuse(value)
        return value

    def json_schema(self) -> dict[str, Any]:
        """This option as a JSON Schema property (what a generated manifest's ``options`` carries)."""
        schema: dict[str, Any] = {"description": self.help}
        if self.kind in ("duration", "float"):
            schema["type"] = "number"
        elif self.kind == "int":
            schema["type"] = "integer"
        elif self.kind == "size":
            schema["type"] = ["integer", "string"]
        elif self.kind == "bool":
            schema["type"] = "boolean"
        elif self.kind == "list":
            schema.update(type="array", items={"type": "string"})
        else:
            schema["type"] = "string"
        if self.kind == "choice":
            schema["enum"] = list(self.choices)
        if self.kind in NUMERIC_KINDS and self.minimum is not None:
            schema["exclusiveMinimum" if self.exclusive_minimum else "minimum"] = self.minimum
        if self.kind in NUMERIC_KINDS and self.maximum is not None:
            schema["maximum"] = self.maximum
        if not self.default_text:
            schema["default"] = list(self.default) if isinstance(self.default, tuple) else self.default
        schema["x-vz-kind"] = self.kind
        schema["x-vz-scope"] = self.scope
        return schema

    def problems(self) -> list[str]:
        """What is wrong with this declaration of an option ("field: problem"); empty when it is sound."""
        found: list[str] = []
        if self.kind not in KINDS:
            return [f"kind: {self.kind!r} is not one of {', '.join(KINDS)}"]
        if self.kind in NUMERIC_KINDS:
            for label, bound in (("minimum", self.minimum), ("maximum", self.maximum)):
                if isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound):
                    found.append(f"{label}: a {self.kind} option needs a finite {label} (bounds are explicit)")
            if not found and self.minimum is not None and self.maximum is not None and self.minimum >= self.maximum:
                found.append(f"minimum: {self.minimum} is not below the maximum {self.maximum}")
        elif self.minimum is not None or self.maximum is not None or self.exclusive_minimum:
            found.append(f"minimum/maximum: only a numeric option ({', '.join(sorted(NUMERIC_KINDS))}) has bounds")
        if self.kind == "choice" and not self.choices:
            found.append("choices: a choice option lists its choices")
        if self.kind != "choice" and self.choices:
            found.append("choices: only a 'choice' option has choices")
        if self.absolute and self.kind != "path":
            found.append("absolute: only a 'path' option can require an absolute path")
        if self.repeat and self.kind != "list":
            found.append("repeat: only a 'list' option can repeat its flag")
        if not found:
            try:
                parsed = self.parse(self.default)
            except OptionError as exc:
                found.append(f"default: {exc.problem}")
            else:
                if parsed != self.default and not isinstance(self.default, list):
                    found.append(f"default: {self.default!r} is not a {self.kind} value itself (write {parsed!r})")
        return found


def _windows_absolute(path: str) -> bool:
    return re.match(r"[A-Za-z]:[\\/]", path) is not None or path.startswith("\\\\")


class Options(Mapping[str, Any]):
    """The frozen, typed options of one driver: every declared option, given or defaulted.

    Read them as attributes (``options.stop_timeout``) or by key. ``given`` holds the names that were set
    explicitly (so a driver can tell "not set" from "set to the default" where that matters); ``raw()`` is the
    given values in JSON form, what a host passes on to a plugin.
    """

    __slots__ = ("_driver", "_given", "_values")
    _driver: str
    _given: frozenset[str]
    _values: dict[str, Any]

    def __init__(self, driver: str, values: Mapping[str, Any], given: frozenset[str]) -> None:
        object.__setattr__(self, "_driver", driver)
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_given", given)

    @property
    def driver(self) -> str:
        return self._driver

    @property
    def given(self) -> frozenset[str]:
        return self._given

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"driver {self._driver!r} declares no option {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"options are immutable (cannot set {name!r})")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Options):
            return NotImplemented
        return (self._driver, self._values, self._given) == (other._driver, other._values, other._given)

    def __hash__(self) -> int:
        return hash((self._driver, tuple(sorted(self._given))))

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"Options({self._driver}: {shown})"

    def raw(self) -> dict[str, Any]:
        """The explicitly given options in JSON form (lists for tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self._values.items() if k in self._given}


def parse_options(driver: str, declared: Mapping[str, Option], given: Mapping[str, Any]) -> Options:
    """``given`` checked against ``declared``: ``OptionError`` for the first value (in key order) an option does
    not accept; unknown keys are the caller's to refuse first (their message lists the valid ones)."""
    if isinstance(given, Options):
        if given.driver == driver and set(given) == set(declared):
            return given
        given = given.raw()
    values = {name: option.default for name, option in declared.items()}
    for key in sorted(given):
        option = declared.get(key)
        if option is not None:
            values[key] = option.parse(given[key])
    return Options(driver, values, frozenset(k for k in given if k in declared))


def timeout(name: str, help: str, default: float, *, scope: Scope = "project") -> Option:
    """A driver's timeout: a number of seconds in (0, 3600] (an hour bounds every wait a user can set)."""
    return Option(name, help, default, "duration", scope, minimum=0, exclusive_minimum=True, maximum=3600)
