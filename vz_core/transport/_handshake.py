"""The go-plugin handshake: magic cookie, environment, and the one line a plugin prints on stdout.

``CORE|APP|NETWORK|ADDRESS|PROTOCOL|SERVER_CERT``, e.g. ``1|1|unix|/tmp/x/plugin.sock|grpc|MIIB...``:
core protocol 1, application protocol 1, a Unix socket (or loopback TCP) address, ``grpc``, and with AutoMTLS
the plugin's DER certificate in standard base64 without padding (empty otherwise).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from dataclasses import dataclass
from typing import Literal

from vz_core.errors import PluginError

__all__ = [
    "APP_PROTOCOL_VERSION",
    "COOKIE_KEY",
    "COOKIE_VALUE",
    "CORE_PROTOCOL_VERSION",
    "ENV_CLIENT_CERT",
    "ENV_MAX_PORT",
    "ENV_MIN_PORT",
    "ENV_PROTOCOL_VERSIONS",
    "ENV_UNIX_SOCKET_DIR",
    "Handshake",
    "looks_like_handshake",
    "parse_handshake",
]

COOKIE_KEY = "DEVSY_RUNTIME_PLUGIN"
COOKIE_VALUE = "devsy-runtime-v1"
CORE_PROTOCOL_VERSION = 1
APP_PROTOCOL_VERSION = 1

ENV_PROTOCOL_VERSIONS = "PLUGIN_PROTOCOL_VERSIONS"
ENV_MIN_PORT = "PLUGIN_MIN_PORT"
ENV_MAX_PORT = "PLUGIN_MAX_PORT"
ENV_UNIX_SOCKET_DIR = "PLUGIN_UNIX_SOCKET_DIR"
ENV_CLIENT_CERT = "PLUGIN_CLIENT_CERT"

Network = Literal["unix", "tcp"]


@dataclass(frozen=True)
class Handshake:
    """A parsed handshake line."""

    core_version: int
    app_version: int
    network: Network
    address: str
    protocol: str
    server_cert_der: bytes | None = None

    @property
    def target(self) -> str:
        """The gRPC target for this address ("unix:/path" or "host:port")."""
        return f"unix:{self.address}" if self.network == "unix" else self.address

    def line(self) -> str:
        """The handshake line (without newline), as a plugin prints it."""
        cert = base64.b64encode(self.server_cert_der).decode().rstrip("=") if self.server_cert_der else ""
        return f"{self.core_version}|{self.app_version}|{self.network}|{self.address}|{self.protocol}|{cert}"


def looks_like_handshake(line: str) -> bool:
    """True for a line a host must treat as the handshake (at least four ``|``-separated fields)."""
    return line.count("|") >= 3


def _int_field(value: str, what: str, line: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise PluginError(f"handshake line has a non-numeric {what} {value!r}: {line!r}") from None


def _check_tcp(address: str, line: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise PluginError(f"handshake line has a malformed TCP address {address!r} (want host:port): {line!r}")
    host = host.strip("[]")
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise PluginError(
            f"plugin announced TCP address {address!r}, which is not a loopback address; "
            "plugins must listen on 127.0.0.1 (or a Unix socket)"
        )


def parse_handshake(line: str, *, app_versions: tuple[int, ...] = (APP_PROTOCOL_VERSION,)) -> Handshake:
    """Parse and check a handshake line; ``PluginError`` names what is wrong and what was expected."""
    text = line.strip()
    parts = text.split("|", 5)
    if len(parts) < 4:
        raise PluginError(
            f"unrecognized plugin handshake {text[:200]!r}: expected "
            "'CORE|APP|NETWORK|ADDRESS|PROTOCOL|CERT' (is this a Runtime Protocol plugin?)"
        )
    core = _int_field(parts[0], "core protocol version", text)
    if core != CORE_PROTOCOL_VERSION:
        raise PluginError(
            f"plugin speaks go-plugin core protocol {core}, this host speaks {CORE_PROTOCOL_VERSION}; "
            "rebuild the plugin against a compatible plugin SDK"
        )
    app = _int_field(parts[1], "application protocol version", text)
    if app not in app_versions:
        offered = ",".join(str(v) for v in app_versions)
        raise PluginError(
            f"plugin answered application protocol {app}, but this host offered {offered}; "
            "use a plugin release that speaks the Runtime Protocol v1"
        )
    network = parts[2]
    address = parts[3]
    if network == "unix":
        if not address.startswith("/"):
            raise PluginError(f"plugin announced a Unix socket with a non-absolute path {address!r}")
    elif network == "tcp":
        _check_tcp(address, text)
    else:
        raise PluginError(f"plugin announced unknown network {network!r}; supported: unix, tcp")
    if len(parts) < 5 or not parts[4]:
        raise PluginError("plugin did not announce a protocol (net/rpc plugin?); vz plugins must speak grpc")
    protocol = parts[4]
    if protocol != "grpc":
        raise PluginError(f"plugin announced protocol {protocol!r}; only 'grpc' is supported")
    cert: bytes | None = None
    if len(parts) == 6 and parts[5]:
        encoded = parts[5]
        try:
            cert = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise PluginError("plugin's server certificate (6th handshake field) is not valid base64") from None
    return Handshake(core, app, network, address, protocol, cert)  # type: ignore[arg-type]
