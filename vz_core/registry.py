"""Driver declarations and the built-in driver registry: stable names, lazily loaded, through pluggy.

A driver is declared **once**, in a ``DriverDeclaration``: its name, summary, factory, options (each described
once, ``vz_core.options.Option``: help, kind, typed default, bounds, scope), targets, capability-matrix rows and
conformance adapter (``vz_core._declaration``). Everything else is generated from it: the plugin's command
line and ``--help`` (``plugin_parser``, served by the SDK's ``vz_plugins.serve_declaration``), the checks of
option keys and values (the host's, before anything launches, and the plugin's, with the same code), the
frozen ``Options`` object the factory receives, the option tables in the docs and the capability matrix
(``vz_core.capability_matrix``).

Every built-in driver package registers through the same hook a third-party Python package would use: an
entry point in the ``vz.drivers`` group naming a module with a ``vz_builtin_drivers`` hook implementation::

    from vz_core.registry import DriverDeclaration, MatrixRow, Option, hookimpl

    DECLARATION = DriverDeclaration(
        name="acme",
        summary="Machines as acme sandboxes",
        factory="acme_driver:AcmeDriver",
        plugin_command=("vz-driver-acme",),
        options=(
            Option("state_dir", "where Machines are recorded", kind="path", scope="host",
                   default_text="<vz state>/drivers/acme"),
            Option("stop_timeout", "seconds between SIGTERM and SIGKILL", 10.0, "duration",
                   minimum=0, exclusive_minimum=True, maximum=3600),
        ),
        matrix=(MatrixRow("linux", "linux", "DEV", "acme sandboxes"),),
        adapter="acme_conformance:ADAPTER",
    )

    @hookimpl
    def vz_builtin_drivers() -> list[DriverDeclaration]:
        return [DECLARATION]

and the console script ``vz-driver-acme = "acme_driver.plugin:main"``, whose ``main`` calls
``vz_plugins.serve_declaration(DECLARATION)`` (the plugin SDK's main for a declaration).
``AcmeDriver(options)`` receives one frozen ``vz_core.options.Options`` and reads ``options.stop_timeout`` (a
float, already checked): a driver never parses option text.

Scopes: a ``"project"`` option may come from a checked-in ``vz.json`` (``driver_options``); a ``"host"`` option
(one choosing a binary, a host path or a host network) only from the user's host configuration
(``vz driver configure``, see ``vz_core.drivers``), never from a project file.

Registration validates every hook implementation (pluggy's spec check and ``check_pending``; a registered
module that implements no hook at all is refused too) and every declaration it returns; a problem raises
``RegistrationError`` naming the plugin (entry point and module) and the field.

Registration modules must be cheap to import: this module imports neither pluggy nor any driver code at
import time; the driver code is only imported when ``load()`` runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vz_core._declaration import (
    DRIVER_NAME_PATTERN,
    ENTRY_POINT_GROUP,
    HOST_OSES,
    OPTIONS_ENV,
    PROJECT,
    BuiltinDriver,
    DriverDeclaration,
    MatrixRow,
    Option,
    OptionError,
    OptionKind,
    Options,
    PluginHooks,
    PluginStart,
    RegistrationError,
    Scope,
    Status,
    check_driver_name,
    hookimpl,
    is_driver_name,
    load_reference,
)

if TYPE_CHECKING:
    from vz_core._registry import DriverRegistry

__all__ = [
    "DRIVER_NAME_PATTERN",
    "ENTRY_POINT_GROUP",
    "HOST_OSES",
    "OPTIONS_ENV",
    "PROJECT",
    "BuiltinDriver",
    "DriverDeclaration",
    "DriverRegistry",
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
    "hookimpl",
    "is_driver_name",
    "load_reference",
]


def __getattr__(name: str) -> Any:
    # The registry proper (pluggy, entry points, validation) lives in vz_core._registry, imported on first use:
    # a plugin process serving one declaration never needs it before its handshake.
    if name == "DriverRegistry":
        from vz_core import _registry

        return _registry.DriverRegistry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
