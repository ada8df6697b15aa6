"""Driver declarations: the one description of a driver (``DriverDeclaration``: name, summary, factory, options,
targets, capability-matrix rows, conformance adapter), its checks, and the driver-name grammar. A leaf of
``vz_core``: it imports neither the registry (``vz_core._registry``), nor pluggy, nor the plugin SDK, nor any
driver code; ``vz_core.registry`` is its public face (see its docstring).
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from vz_core.errors import InvalidArgumentError, UserError
from vz_core.options import Option, OptionError, OptionKind, Options, Scope, parse_options
from vz_core.options import _frozen as _record
from vz_core.rules import DRIVER_NAME_PATTERN, is_driver_name

if TYPE_CHECKING:
    import argparse

    from vz_core._driver import Driver

__all__ = [
    "DRIVER_NAME_PATTERN",
    "ENTRY_POINT_GROUP",
    "HOST_OSES",
    "OPTIONS_ENV",
    "PROJECT",
    "BuiltinDriver",
    "DriverDeclaration",
    "MatrixRow",
    "Option",
    "OptionError",
    "OptionKind",
    "Options",
    "PluginHooks",
    "PluginStart",
    "RegistrationError",
    "Scope",
    "Status",
    "check_driver_name",
    "declaration_problems",
    "hookimpl",
    "is_driver_name",
    "load_reference",
]

PROJECT = "vz"
ENTRY_POINT_GROUP = "vz.drivers"
OPTIONS_ENV = "VZ_DRIVER_OPTIONS"
"""Environment variable carrying a built-in plugin's options (a JSON object) when the host launches it."""


Status = Literal["ACTIVE", "DEV", "PLANNED"]
HOST_OSES = ("linux", "darwin", "windows")
_T = TypeVar("_T")


class RegistrationError(UserError):
    """A driver package registered something invalid; the message names the plugin and the field."""


def check_driver_name(name: object, *, where: str = "driver") -> str:
    """Return ``name`` if it is a driver name, else raise ``UserError`` naming ``where`` and the grammar.

    A driver name is a name, never a path: 1 to 63 characters, a lowercase letter first, then lowercase
    letters, digits, ``_`` or ``-``.
    """
    if is_driver_name(name):
        assert isinstance(name, str)
        return name
    shown = repr(name)[:80] if isinstance(name, str) else f"a {type(name).__name__}"
    raise UserError(
        f"{where}: {shown} is not a driver name (1-63 characters: a lowercase letter, then lowercase letters, "
        "digits, '_' or '-'); see `vz driver list`"
    )


def load_reference(reference: str, *, what: str = "reference") -> Any:
    """Import and return ``module:attribute`` (the attribute may be dotted)."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"{what} {reference!r} must look like 'module:attribute'")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


# --- the declaration ---------------------------------------------------------------------------------------


@_record
class MatrixRow:
    """One row of the capability matrix for the declaring driver: host OS x target OS, status and a note."""

    host_os: str
    target_os: str
    status: Status
    note: str = ""


@_record
class PluginStart:
    """What a driver's ``PluginHooks.before_serve`` asks of the shared plugin main."""

    build_before_handshake: bool = False
    """Build the driver before serving (default: after the plugin cookie and versions were checked)."""
    on_serving: Callable[[], None] | None = None
    """Called once the handshake line is out (``vz_plugins.serve``'s ``on_serving``)."""


class PluginHooks:
    """Optional plugin-process behaviour of a driver (declared by reference in ``plugin_hooks``).

    The defaults do nothing; a driver overrides what it needs (the fake driver's plugin-level fault modes).
    """

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add command-line flags that are not driver options (e.g. an informational ``--list-x``)."""

    def before_serve(
        self, parser: argparse.ArgumentParser, args: argparse.Namespace, options: dict[str, Any]
    ) -> PluginStart:
        """Run after parsing, before serving; may change ``options``, exit, or refuse with ``parser.error``."""
        del parser, args, options
        return PluginStart()


@_record
class DriverDeclaration:
    """A driver shipped as Python code, declared once (see the module docstring).

    ``factory`` is "module:attribute", a callable taking keyword options and returning a ``Driver``.
    ``plugin_command`` is the console script (plus arguments) that serves the same driver as a plugin.
    ``options`` lists its options; ``None`` means "not described" (passed through unchecked, project scope:
    only for drivers that predate declarations). ``matrix`` holds its capability-matrix rows. ``adapter`` is its
    conformance adapter, "module:attribute", imported only by the suite. ``plugin_hooks`` optionally names a
    ``PluginHooks`` instance used by the plugin main (``vz_plugins.serve_declaration``).
    """

    name: str
    summary: str
    factory: str
    plugin_command: tuple[str, ...] = ()
    targets: tuple[str, ...] = ("linux",)
    options: Mapping[str, Option] | Sequence[Option] | None = None
    matrix: tuple[MatrixRow, ...] = ()
    adapter: str = ""
    plugin_hooks: str = ""

    def __post_init__(self) -> None:
        raw: Any = self.options
        if raw is None:
            return
        items = list(raw.values()) if isinstance(raw, Mapping) else list(raw)
        if not all(isinstance(o, Option) for o in items):
            bad = next(o for o in items if not isinstance(o, Option))
            raise RegistrationError(
                f"driver {self.name!r}: options must be vz_core.registry.Option values, not {type(bad).__name__}"
            )
        names = [o.name for o in items]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise RegistrationError(f"driver {self.name!r}: option(s) declared twice: {', '.join(duplicates)}")
        object.__setattr__(self, "options", MappingProxyType({o.name: o for o in items}))

    # The driver ----------------------------------------------------------------------------------------

    def load(self) -> Callable[..., Driver]:
        """Import and return the factory (the only place driver code gets imported)."""
        factory: Callable[..., Driver] = load_reference(self.factory, what=f"driver {self.name!r}: factory")
        return factory

    def create(self, **options: Any) -> Driver:
        """Build the driver in-process: the options checked (``options_of``), then the factory called with the
        frozen ``Options`` (a declaration whose options are undescribed passes the keywords on unchecked)."""
        if self.options is None:
            return self.load()(**options)
        return self.load()(self.options_of(options))

    # Options -------------------------------------------------------------------------------------------

    @property
    def declared_options(self) -> Mapping[str, Option]:
        """The options by name (``__post_init__`` turned any sequence into this mapping)."""
        if self.options is None:
            return MappingProxyType({})
        assert isinstance(self.options, Mapping)
        return self.options

    def option_names(self, scope: Scope | None = None) -> list[str]:
        return sorted(n for n, o in self.declared_options.items() if scope is None or o.scope == scope)

    def unknown_keys_message(self, unknown: Iterable[str], *, where: str = "") -> str:
        """The one unknown-key message: what was given, and every valid key with its scope."""
        valid = ", ".join(self.option_names()) or "none"
        prefix = f"{where}: " if where else ""
        return f"{prefix}unknown {self.name} option(s): {', '.join(sorted(unknown))}; valid options: {valid}"

    def check_option_keys(self, options: Mapping[str, Any], *, where: str = "") -> None:
        """``UserError`` for keys this driver does not declare (nothing to check when options are undescribed)."""
        if self.options is None:
            return
        unknown = [k for k in options if k not in self.declared_options]
        if unknown:
            raise UserError(self.unknown_keys_message(unknown, where=where))

    def check_options(self, options: Mapping[str, Any], *, where: str = "", fix: str = "") -> Options:
        """Keys and values of ``options`` checked (the host's check, before anything launches): ``UserError``
        naming ``where.key``, what the value must be, what was given and ``fix`` (what to do). Returns the typed
        options."""
        self.check_option_keys(options, where=where)
        try:
            return parse_options(self.name, self.declared_options, options)
        except OptionError as exc:
            option = self.declared_options[exc.option]
            prefix = f"{where}.{exc.option}" if where else exc.option
            hint = f"; {fix.format(key=exc.option, default=option.shown_default())}" if fix else ""
            raise UserError(f"{prefix}: {exc.problem}{hint}") from None

    def options_of(self, options: Mapping[str, Any] | None = None, raw: Mapping[str, Any] | None = None) -> Options:
        """The frozen, typed options a driver is built with, from ``options`` (an ``Options`` is returned as it
        is) and/or keyword values ``raw``; ``InvalidArgumentError`` naming the option for an unknown key or a value
        the declaration refuses (the plugin's check: the same code as ``check_options``)."""
        given: dict[str, Any] = dict(options.raw() if isinstance(options, Options) else options or {})
        if raw:
            given.update(raw)
        elif isinstance(options, Options) and options.driver == self.name:
            return options
        unknown = sorted(k for k in given if k not in self.declared_options)
        if unknown:
            raise InvalidArgumentError(self.unknown_keys_message(unknown), details={"option": unknown[0]})
        try:
            return parse_options(self.name, self.declared_options, given)
        except OptionError as exc:
            raise InvalidArgumentError(f"option {exc}", details={"option": exc.option}) from None

    def options_schema(self) -> dict[str, Any]:
        """The options as a JSON Schema object (a generated manifest's ``options``)."""
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {name: option.json_schema() for name, option in self.declared_options.items()},
        }

    # Validation ----------------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Everything wrong with this declaration, one "field: problem" each (empty when it is valid)."""
        return declaration_problems(self)

    # The plugin ----------------------------------------------------------------------------------------

    def plugin_parser(self) -> argparse.ArgumentParser:
        """The plugin's command line, generated from the options: one flag per option, plus ``--option K=V``."""
        import argparse

        prog = self.plugin_command[0] if self.plugin_command else f"vz-driver-{self.name}"
        parser = argparse.ArgumentParser(
            prog=prog,
            description=f"The vz {self.name} driver as a Runtime Protocol plugin (started by a host, not by hand): "
            f"{self.summary}.",
            epilog=f"Options may also come as a JSON object in ${OPTIONS_ENV} (flags win). Stdout belongs to the "
            "handshake line; diagnostics go to stderr.",
        )
        for option in self.declared_options.values():
            scope = "" if option.scope == "project" else " [host configuration only]"
            text = f"{option.help}: {option.expects()} (default: {option.shown_default()}){scope}"
            parser.add_argument(
                option.cli_flag,
                dest=f"opt_{option.name}",
                metavar=option.metavar,
                action="append" if option.repeat else "store",
                default=None,
                help=(text + ("; repeatable" if option.repeat else "")).replace("%", "%%"),
            )
        valid = ", ".join(self.option_names()) or "any key the driver accepts"
        parser.add_argument(
            "--option",
            dest="generic_options",
            metavar="KEY=VALUE",
            action="append",
            default=[],
            help=f"a driver option by name ({valid}); repeatable",
        )
        return parser

    def environment_options(self) -> dict[str, Any]:
        """The options the host passed in ``$VZ_DRIVER_OPTIONS`` (a JSON object); ``UserError`` when malformed."""
        raw = os.environ.get(OPTIONS_ENV)
        if not raw:
            return {}
        try:
            loaded = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise UserError(f"${OPTIONS_ENV} is not JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise UserError(f"${OPTIONS_ENV} must be a JSON object")
        return loaded

    def plugin_options(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
        """The options of a plugin process: ``$VZ_DRIVER_OPTIONS`` (JSON), then flags; bad input exits 2."""
        try:
            options = self.environment_options()
        except UserError as exc:
            parser.error(str(exc))
        declared = self.declared_options
        for item in args.generic_options:
            key, sep, value = item.partition("=")
            key = key.replace("-", "_")
            if not sep or not key:
                parser.error(f"--option {item!r} must look like KEY=VALUE")
            option = declared.get(key)
            if option is None and self.options is not None:
                parser.error(self.unknown_keys_message([key]))
            try:
                options[key] = option.parse(value) if option is not None else value
            except ValueError as exc:
                parser.error(str(exc))
        for option in declared.values():
            given = getattr(args, f"opt_{option.name}", None)
            if given is None:
                continue
            try:
                if option.repeat:
                    options[option.name] = [item for value in given for item in option.parse(value)]
                else:
                    options[option.name] = option.parse(given)
            except ValueError as exc:
                parser.error(str(exc))
        if self.options is not None:
            try:
                return dict(self.options_of(options).raw())
            except InvalidArgumentError as exc:
                parser.error(exc.message)
        return options


BuiltinDriver = DriverDeclaration
"""The declaration's former name (kept for existing registration modules)."""


# --- the registry ------------------------------------------------------------------------------------------


def hookimpl(function: _T) -> _T:
    """Mark ``vz_builtin_drivers`` in a registration module (pluggy is only imported by ``DriverRegistry``)."""
    function._vz_hookimpl = True  # type: ignore[attr-defined]
    return function


# --- the checks of a declaration ------------------------------------------------------------------------

_SCOPES: tuple[str, ...] = get_args(Scope)
_STATUSES: tuple[str, ...] = get_args(Status)
_REFERENCE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_]\w*)*")
_OPTION_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")


def declaration_problems(self: DriverDeclaration) -> list[str]:
    """Everything wrong with this declaration, one "field: problem" each (empty when it is valid)."""
    found: list[str] = []
    if not is_driver_name(self.name):
        found.append(f"name: {self.name!r} does not match {DRIVER_NAME_PATTERN}")
    if not isinstance(self.summary, str) or not self.summary.strip():
        found.append("summary: must be a non-empty sentence")
    for label, ref, required in (
        ("factory", self.factory, True),
        ("adapter", self.adapter, False),
        ("plugin_hooks", self.plugin_hooks, False),
    ):
        if (required or ref) and not (isinstance(ref, str) and _REFERENCE.fullmatch(ref)):
            found.append(f"{label}: {ref!r} must look like 'module:attribute'")
    if not isinstance(self.plugin_command, tuple) or not all(isinstance(a, str) for a in self.plugin_command):
        found.append("plugin_command: must be a tuple of strings")
    if not self.targets or not all(t in HOST_OSES for t in self.targets):
        found.append(f"targets: {self.targets!r}: each must be one of {', '.join(HOST_OSES)}")
    for option in self.declared_options.values():
        where = f"options.{option.name}"
        if not _OPTION_NAME.fullmatch(option.name):
            found.append(f"{where}: the name must be lowercase letters, digits and '_'")
        if not option.help.strip():
            found.append(f"{where}.help: must describe the option")
        if option.scope not in _SCOPES:
            found.append(f"{where}.scope: {option.scope!r} is not one of {', '.join(_SCOPES)}")
        found += [f"{where}.{problem}" for problem in option.problems()]
        if option.flag and not re.fullmatch(r"--[a-z][a-z0-9-]*", option.flag):
            found.append(f"{where}.flag: {option.flag!r} must look like --some-flag")
    seen: set[tuple[str, str]] = set()
    for i, row in enumerate(self.matrix):
        where = f"matrix[{i}]"
        if not isinstance(row, MatrixRow):
            found.append(f"{where}: must be a vz_core.registry.MatrixRow, not {type(row).__name__}")
            continue
        if row.host_os not in HOST_OSES:
            found.append(f"{where}.host_os: {row.host_os!r} is not one of {', '.join(HOST_OSES)}")
        if row.target_os not in self.targets:
            found.append(f"{where}.target_os: {row.target_os!r} is not among the targets {self.targets!r}")
        if row.status not in _STATUSES:
            found.append(f"{where}.status: {row.status!r} is not one of {', '.join(_STATUSES)}")
        if (row.host_os, row.target_os) in seen:
            found.append(f"{where}: host {row.host_os} / target {row.target_os} is listed twice")
        seen.add((row.host_os, row.target_os))
    return found
