"""The go-plugin compatible transport: handshake, AutoMTLS, TLS relays, supervision and the launcher.

Host side: ``PluginLauncher(prepare).launch()`` → ``PluginConnection`` (a healthy gRPC channel to a supervised
plugin process). Plugin side (used by the ``vz_plugins`` SDK): the handshake constants, ``generate_cert`` and
``ServerRelay``.

Names are imported on first use, so a plugin process that only needs the handshake constants does not pay
for the launcher, the TLS code or the manifest models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vz_core.transport._certs import CertKey, cert_curve, generate_cert, grpc_can_verify, load_cert
    from vz_core.transport._handshake import (
        APP_PROTOCOL_VERSION,
        COOKIE_KEY,
        COOKIE_VALUE,
        CORE_PROTOCOL_VERSION,
        ENV_CLIENT_CERT,
        ENV_MAX_PORT,
        ENV_MIN_PORT,
        ENV_PROTOCOL_VERSIONS,
        ENV_UNIX_SOCKET_DIR,
        Handshake,
        looks_like_handshake,
        parse_handshake,
    )
    from vz_core.transport._launcher import (
        LaunchSpec,
        PluginConnection,
        PluginLauncher,
        StderrTail,
        without_tracebacks,
    )
    from vz_core.transport._limits import CHANNEL_OPTIONS, MAX_MESSAGE, SERVER_OPTIONS
    from vz_core.transport._process import ExitStatus
    from vz_core.transport._relay import ClientRelay, ServerRelay, client_context, server_context

_WHERE = {
    "CertKey": "_certs",
    "cert_curve": "_certs",
    "generate_cert": "_certs",
    "grpc_can_verify": "_certs",
    "load_cert": "_certs",
    "APP_PROTOCOL_VERSION": "_handshake",
    "COOKIE_KEY": "_handshake",
    "COOKIE_VALUE": "_handshake",
    "CORE_PROTOCOL_VERSION": "_handshake",
    "ENV_CLIENT_CERT": "_handshake",
    "ENV_MAX_PORT": "_handshake",
    "ENV_MIN_PORT": "_handshake",
    "ENV_PROTOCOL_VERSIONS": "_handshake",
    "ENV_UNIX_SOCKET_DIR": "_handshake",
    "Handshake": "_handshake",
    "looks_like_handshake": "_handshake",
    "parse_handshake": "_handshake",
    "CHANNEL_OPTIONS": "_limits",
    "MAX_MESSAGE": "_limits",
    "SERVER_OPTIONS": "_limits",
    "LaunchSpec": "_launcher",
    "PluginConnection": "_launcher",
    "PluginLauncher": "_launcher",
    "StderrTail": "_launcher",
    "without_tracebacks": "_launcher",
    "ExitStatus": "_process",
    "ClientRelay": "_relay",
    "ServerRelay": "_relay",
    "client_context": "_relay",
    "server_context": "_relay",
}

__all__ = [
    "APP_PROTOCOL_VERSION",
    "CHANNEL_OPTIONS",
    "COOKIE_KEY",
    "COOKIE_VALUE",
    "CORE_PROTOCOL_VERSION",
    "ENV_CLIENT_CERT",
    "ENV_MAX_PORT",
    "ENV_MIN_PORT",
    "ENV_PROTOCOL_VERSIONS",
    "ENV_UNIX_SOCKET_DIR",
    "MAX_MESSAGE",
    "SERVER_OPTIONS",
    "CertKey",
    "ClientRelay",
    "ExitStatus",
    "Handshake",
    "LaunchSpec",
    "PluginConnection",
    "PluginLauncher",
    "ServerRelay",
    "StderrTail",
    "cert_curve",
    "client_context",
    "generate_cert",
    "grpc_can_verify",
    "load_cert",
    "looks_like_handshake",
    "parse_handshake",
    "server_context",
    "without_tracebacks",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
