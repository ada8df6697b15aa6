"""The vz daemon: one per user and state home, owning drivers, state and events; CLI and API are its clients.

Client side (cheap to import, standard library only): ``connect(home=None, environ=None, autostart=None)
-> Connection`` reaches (or starts) the daemon and does the hello; ``Connection.call`` / ``receive`` /
``result`` / ``request`` run the one call of that connection over the local wire (``docs/daemon.md``).
``DaemonError`` is every failure (``.code``, ``.kind``, ``.exit_code``, ``.details``: the wire's error).

Server side (asyncio; imported only when used): ``Daemon`` (listener, accounting, idle exit, shutdown),
``Call`` (what a handler gets), ``run_daemon`` (a whole daemon process).

Names are resolved lazily (PEP 562), so ``import vz_core.daemon`` costs nothing until one is used.
"""

from __future__ import annotations

from vz_core._lazy import lazy_names

TYPE_CHECKING = False  # `typing` itself costs milliseconds on the CLI's hot path
if TYPE_CHECKING:
    from vz_core.daemon._connect import AUTOSTART_ENV, Connection, autostart_enabled, connect, stop_daemon
    from vz_core.daemon._errors import CallFailed, classify_error, encode_error
    from vz_core.daemon._identity import PROTOCOL, fingerprint, version
    from vz_core.daemon._paths import DaemonPaths, daemon_paths, live_daemon, read_pid_file, state_home_problem
    from vz_core.daemon._server import Call, Daemon, Handler, Http2Hook, run_daemon
    from vz_core.daemon._wire import (
        MAX_FDS,
        MAX_MESSAGE,
        STDERR,
        STDIN,
        STDOUT,
        TERMINAL,
        AsyncChannel,
        Channel,
        DaemonError,
        ErrorObject,
        Message,
        WireError,
        error_fields,
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
    "AUTOSTART_ENV": "_connect",
    "Connection": "_connect",
    "autostart_enabled": "_connect",
    "connect": "_connect",
    "stop_daemon": "_connect",
    "CallFailed": "_errors",
    "classify_error": "_errors",
    "encode_error": "_errors",
    "PROTOCOL": "_identity",
    "fingerprint": "_identity",
    "version": "_identity",
    "DaemonPaths": "_paths",
    "daemon_paths": "_paths",
    "live_daemon": "_paths",
    "read_pid_file": "_paths",
    "state_home_problem": "_paths",
    "Call": "_server",
    "Daemon": "_server",
    "Handler": "_server",
    "Http2Hook": "_server",
    "run_daemon": "_server",
    "MAX_FDS": "_wire",
    "MAX_MESSAGE": "_wire",
    "STDERR": "_wire",
    "STDIN": "_wire",
    "STDOUT": "_wire",
    "TERMINAL": "_wire",
    "AsyncChannel": "_wire",
    "Channel": "_wire",
    "DaemonError": "_wire",
    "ErrorObject": "_wire",
    "Message": "_wire",
    "WireError": "_wire",
    "error_fields": "_wire",
}


__getattr__ = lazy_names(__name__, _WHERE)


def __dir__() -> list[str]:
    return sorted(__all__)
