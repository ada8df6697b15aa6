"""The local wire and what every client of the vz daemon shares with it, below both the clients
(``vz_core.api``, the CLI) and the daemon (``vz_core.daemon``).

* the framing of the local wire (``Channel``, ``AsyncChannel``, ``DaemonError``, ``ErrorObject``: docs/api.md,
  the local wire) and the daemon's paths in a state home (``DaemonPaths``, ``daemon_paths``, the pid file);
* finding, starting, replacing and stopping the daemon from a client (``connect``, ``stop_daemon``), and the
  identity both sides compare in hello (``PROTOCOL``, ``version``, ``fingerprint``);
* the one table of exit codes and kinds (``OK`` ... ``INTERRUPTED``, ``KINDS``);
* the one table of vz.api.v1 methods (``METHODS``: name, shape and flags of every rpc, generated from the
  .proto by scripts/gen_protos.py).

Standard library only, and names resolve lazily (PEP 562): ``import vz_core.wire`` costs nothing until a name
is used. Nothing here imports the daemon, the API client, asyncio (except ``AsyncChannel`` when built), grpc or
protobuf.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` itself costs milliseconds on the CLI's hot path
if TYPE_CHECKING:
    from typing import Any

    from vz_core.wire._connect import (
        AUTOSTART_ENV,
        START_TIMEOUT,
        STOP_TIMEOUT,
        Connection,
        autostart_enabled,
        connect,
        open_socket,
        stop_daemon,
    )
    from vz_core.wire._exits import (
        BACKEND,
        CONFLICT,
        INTERRUPTED,
        KINDS,
        NOT_FOUND,
        OK,
        UNAVAILABLE,
        USAGE,
        classify_core,
        kind_of,
    )
    from vz_core.wire._frames import (
        BINARY_CHUNK,
        KIND_BINARY,
        KIND_JSON,
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
        close_fds,
        decode,
        encode,
        encode_binary,
        encode_json,
        error_fields,
    )
    from vz_core.wire._identity import (
        DAEMON_ENV,
        PROTOCOL,
        compare_versions,
        fingerprint,
        version,
    )
    from vz_core.wire._methods import (
        METHODS,
        Method,
    )
    from vz_core.wire._paths import (
        DaemonPaths,
        check_private_dir,
        daemon_paths,
        ensure_private_dir,
        live_daemon,
        proc_start_ticks,
        read_pid_file,
        secure_state_home,
        state_home_problem,
        write_pid_file,
    )
__all__ = [
    "AUTOSTART_ENV",
    "BACKEND",
    "BINARY_CHUNK",
    "CONFLICT",
    "DAEMON_ENV",
    "INTERRUPTED",
    "KINDS",
    "KIND_BINARY",
    "KIND_JSON",
    "MAX_FDS",
    "MAX_MESSAGE",
    "METHODS",
    "NOT_FOUND",
    "OK",
    "PROTOCOL",
    "START_TIMEOUT",
    "STDERR",
    "STDIN",
    "STDOUT",
    "STOP_TIMEOUT",
    "TERMINAL",
    "UNAVAILABLE",
    "USAGE",
    "AsyncChannel",
    "Channel",
    "Connection",
    "DaemonError",
    "DaemonPaths",
    "ErrorObject",
    "Message",
    "Method",
    "WireError",
    "autostart_enabled",
    "check_private_dir",
    "classify_core",
    "close_fds",
    "compare_versions",
    "connect",
    "daemon_paths",
    "decode",
    "encode",
    "encode_binary",
    "encode_json",
    "ensure_private_dir",
    "error_fields",
    "fingerprint",
    "kind_of",
    "live_daemon",
    "open_socket",
    "proc_start_ticks",
    "read_pid_file",
    "secure_state_home",
    "state_home_problem",
    "stop_daemon",
    "version",
    "write_pid_file",
]

_WHERE = {
    "AUTOSTART_ENV": "_connect",
    "AsyncChannel": "_frames",
    "BACKEND": "_exits",
    "BINARY_CHUNK": "_frames",
    "CONFLICT": "_exits",
    "Channel": "_frames",
    "Connection": "_connect",
    "DAEMON_ENV": "_identity",
    "DaemonError": "_frames",
    "DaemonPaths": "_paths",
    "ErrorObject": "_frames",
    "INTERRUPTED": "_exits",
    "KINDS": "_exits",
    "KIND_BINARY": "_frames",
    "KIND_JSON": "_frames",
    "MAX_FDS": "_frames",
    "MAX_MESSAGE": "_frames",
    "METHODS": "_methods",
    "Message": "_frames",
    "Method": "_methods",
    "NOT_FOUND": "_exits",
    "OK": "_exits",
    "PROTOCOL": "_identity",
    "START_TIMEOUT": "_connect",
    "STDERR": "_frames",
    "STDIN": "_frames",
    "STDOUT": "_frames",
    "STOP_TIMEOUT": "_connect",
    "TERMINAL": "_frames",
    "UNAVAILABLE": "_exits",
    "USAGE": "_exits",
    "WireError": "_frames",
    "autostart_enabled": "_connect",
    "check_private_dir": "_paths",
    "classify_core": "_exits",
    "close_fds": "_frames",
    "compare_versions": "_identity",
    "connect": "_connect",
    "daemon_paths": "_paths",
    "decode": "_frames",
    "encode": "_frames",
    "encode_binary": "_frames",
    "encode_json": "_frames",
    "ensure_private_dir": "_paths",
    "error_fields": "_frames",
    "fingerprint": "_identity",
    "kind_of": "_exits",
    "live_daemon": "_paths",
    "open_socket": "_connect",
    "proc_start_ticks": "_paths",
    "read_pid_file": "_paths",
    "secure_state_home": "_paths",
    "state_home_problem": "_paths",
    "stop_daemon": "_connect",
    "version": "_identity",
    "write_pid_file": "_paths",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'vz_core.wire' has no attribute {name!r}")
    value = getattr(__import__(f"vz_core.wire.{module}", fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
