"""The vz plugin SDK: serve any Driver as a Runtime Protocol plugin.

A driver package ships a console script whose ``main`` calls ``serve``::

    from vz_plugins import serve

    def main() -> None:
        serve(MyDriver)          # a Driver, or a callable that builds one (deferred until the host is checked)

The process then behaves exactly like a go-plugin gRPC plugin (handshake, AutoMTLS, health, controller), so
both vz and any Runtime Protocol host built on go-plugin can drive it. ``python -m vz_plugins MODULE:FACTORY``
serves any importable driver factory the same way. A driver declared with ``vz_core.registry.DriverDeclaration``
serves it with ``serve_declaration(DECLARATION)`` (its generated command line and ``--help``); ``plugin_main``
is the one main the host launches built-ins with.
"""

from __future__ import annotations

from vz_plugins._declared import plugin_main, serve_declaration
from vz_plugins._serve import ENV_LOCAL_EXEC, NOT_A_COMMAND, serve

__all__ = ["ENV_LOCAL_EXEC", "NOT_A_COMMAND", "plugin_main", "serve", "serve_declaration"]
