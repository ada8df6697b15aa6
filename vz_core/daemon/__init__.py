"""The vz daemon: one per user and state home, owning drivers, state and events; CLI and API are its clients.

Client side: the names of ``vz_core.wire`` (the package below both the clients and the daemon), re-exported:
``connect(home=None, environ=None, autostart=None) -> Connection`` reaches (or starts) the daemon and does the
hello; ``Connection.call`` / ``receive`` / ``result`` / ``request`` run the one call of that connection over
the local wire (``docs/daemon.md``). ``DaemonError`` is every failure (``.code``, ``.kind``, ``.exit_code``,
``.details``: the wire's error). Clients import ``vz_core.wire`` itself.

Server side (asyncio; imported only when used): ``Daemon`` (listener, accounting, idle exit, shutdown),
``Call`` (what a handler gets), ``run_daemon`` (a whole daemon process).

Names are resolved lazily (PEP 562), so ``import vz_core.daemon`` costs nothing until one is used.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` itself costs milliseconds on the CLI's hot path
if TYPE_CHECKING:
    from typing import Any

    from vz_core.daemon._errors import CallFailed, classify_error, encode_error
    from vz_core.daemon._server import Call, Daemon, Handler, Http2Hook, run_daemon
    from vz_core.wire import (
        AUTOSTART_ENV,
        MAX_FDS,
        MAX_MESSAGE,
        PROTOCOL,
        STDERR,
        STDIN,
        STDOUT,
        TERMINAL,
        AsyncChannel,
        Channel,
        Connection,
        DaemonError,
        DaemonPaths,
        ErrorObject,
        Message,
        WireError,
        autostart_enabled,
        connect,
        daemon_paths,
        error_fields,
        fingerprint,
        live_daemon,
        read_pid_file,
        state_home_problem,
        stop_daemon,
        version,
    )

__all__ = [
    "AUTOSTART_ENV",
    "MAX_FDS",
    "MAX_MESSAGE",
    "PROTOCOL",
    "STDERR",
    "STDIN",
    "STDOUT",
    "TERMINAL",
    "AsyncChannel",
    "Call",
    "CallFailed",
    "Channel",
    "Connection",
    "Daemon",
    "DaemonError",
    "DaemonPaths",
    "ErrorObject",
    "Handler",
    "Http2Hook",
    "Message",
    "WireError",
    "autostart_enabled",
    "classify_error",
    "connect",
    "daemon_paths",
    "encode_error",
    "error_fields",
    "fingerprint",
    "live_daemon",
    "read_pid_file",
    "run_daemon",
    "state_home_problem",
    "stop_daemon",
    "version",
]

_WHERE = {
    "AUTOSTART_ENV": "vz_core.wire",
    "Connection": "vz_core.wire",
    "autostart_enabled": "vz_core.wire",
    "connect": "vz_core.wire",
    "stop_daemon": "vz_core.wire",
    "CallFailed": "_errors",
    "classify_error": "_errors",
    "encode_error": "_errors",
    "PROTOCOL": "vz_core.wire",
    "fingerprint": "vz_core.wire",
    "version": "vz_core.wire",
    "DaemonPaths": "vz_core.wire",
    "daemon_paths": "vz_core.wire",
    "live_daemon": "vz_core.wire",
    "read_pid_file": "vz_core.wire",
    "state_home_problem": "vz_core.wire",
    "Call": "_server",
    "Daemon": "_server",
    "Handler": "_server",
    "Http2Hook": "_server",
    "run_daemon": "_server",
    "MAX_FDS": "vz_core.wire",
    "MAX_MESSAGE": "vz_core.wire",
    "STDERR": "vz_core.wire",
    "STDIN": "vz_core.wire",
    "STDOUT": "vz_core.wire",
    "TERMINAL": "vz_core.wire",
    "AsyncChannel": "vz_core.wire",
    "Channel": "vz_core.wire",
    "DaemonError": "vz_core.wire",
    "ErrorObject": "vz_core.wire",
    "Message": "vz_core.wire",
    "WireError": "vz_core.wire",
    "error_fields": "vz_core.wire",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'vz_core.daemon' has no attribute {name!r}")
    path = module if module.startswith("vz_core.") else f"vz_core.daemon.{module}"
    value = getattr(__import__(path, fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
