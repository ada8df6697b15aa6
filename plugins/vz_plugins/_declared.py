"""The plugin main of a driver declaration: ``serve_declaration(DECLARATION)`` parses the command line generated
from the declared options (or takes them from ``$VZ_DRIVER_OPTIONS``), then serves the driver through ``serve``;
``plugin_main`` is the one main of every built-in (``--module REGISTRATION NAME``), what the host launches."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from vz_core.errors import InvalidArgumentError, NotFoundError, UserError, VzError
from vz_core.registry import (
    DriverDeclaration,
    PluginHooks,
    PluginStart,
    RegistrationError,
    check_driver_name,
    load_reference,
)
from vz_plugins._serve import serve

if TYPE_CHECKING:
    from vz_core import Driver

__all__ = ["plugin_main", "serve_declaration"]


def serve_declaration(declaration: DriverDeclaration, argv: Sequence[str] | None = None) -> NoReturn:
    """The plugin main of a declared driver: parse the command line generated from its options, then serve.

    Only the declaration, argparse (when there is a command line) and the plugin SDK are imported before the
    handshake; the driver's code is imported after the plugin cookie and versions were checked (unless its
    hooks ask otherwise).
    """
    given = list(sys.argv[1:] if argv is None else argv)
    if not given and not declaration.plugin_hooks:
        # How the host launches a built-in: options only in the environment. No command line to parse, so
        # argparse is not even imported before the handshake.
        try:
            options = declaration.environment_options()
            if declaration.options is not None:
                options = declaration.options_of(options).raw()
        except (UserError, InvalidArgumentError) as exc:
            program = declaration.plugin_command[0] if declaration.plugin_command else declaration.name
            sys.stderr.write(f"{program}: error: {exc}\n")
            sys.exit(2)
        _serve(declaration, options, PluginStart())
    parser = declaration.plugin_parser()
    hooks: PluginHooks | None = None
    if declaration.plugin_hooks:
        hooks = load_reference(declaration.plugin_hooks, what=f"driver {declaration.name!r}: plugin_hooks")
        if not isinstance(hooks, PluginHooks):
            raise RegistrationError(
                f"driver {declaration.name!r}: plugin_hooks {declaration.plugin_hooks!r} is a {type(hooks).__name__}, "
                "not a vz_core.registry.PluginHooks"
            )
        hooks.add_arguments(parser)
    args = parser.parse_args(given)
    options = declaration.plugin_options(parser, args)
    _serve(declaration, options, hooks.before_serve(parser, args, options) if hooks is not None else PluginStart())


def _serve(declaration: DriverDeclaration, options: dict[str, Any], start: PluginStart) -> NoReturn:
    if start.build_before_handshake:
        serve(declaration.create(**options), on_serving=start.on_serving)

    def build() -> Driver:
        return declaration.create(**options)

    serve(build, on_serving=start.on_serving)


def _declared_in(module_name: str, name: str) -> DriverDeclaration:
    """Driver ``name`` as declared by registration module ``module_name`` (its hook called directly)."""
    module = importlib.import_module(module_name)
    for attr in dir(module):
        function = getattr(module, attr)
        if callable(function) and getattr(function, "_vz_hookimpl", False) is True:
            for declaration in function():
                if isinstance(declaration, DriverDeclaration) and declaration.name == name:
                    return declaration
    raise NotFoundError(f"registration module {module_name} declares no driver {name!r}")


def plugin_main(argv: Sequence[str] | None = None) -> NoReturn:
    """``plugin_main([--module REGISTRATION_MODULE] NAME [FLAGS])``: serve built-in driver NAME as a plugin. This
    is how the host launches a built-in (its console script calls ``serve_declaration`` with the same declaration
    directly). With ``--module`` (what the host passes) only that module is imported: no entry-point scan before
    the handshake."""
    args = list(sys.argv[1:] if argv is None else argv)
    module_name = ""
    if len(args) >= 2 and args[0] == "--module":
        module_name, args = args[1], args[2:]
    if not args or args[0].startswith("-"):
        sys.stderr.write("usage: vz_plugins.plugin_main [--module REGISTRATION_MODULE] DRIVER [driver flags]\n")
        sys.exit(2)
    from vz_core.registry import DriverRegistry

    try:
        name = check_driver_name(args[0])
        declaration = _declared_in(module_name, name) if module_name else DriverRegistry().get(name)
    except (VzError, ImportError) as exc:
        sys.stderr.write(f"{exc}\n")
        sys.exit(2)
    serve_declaration(declaration, args[1:])
