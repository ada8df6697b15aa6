"""The Runtime Protocol, both halves side by side (go-plugin's ``grpc_client.go`` / ``grpc_server.go``).

* client: ``RemoteDriver`` (a Driver served by a plugin, over gRPC) and its lifecycle ``Mode``;
* server: ``RuntimeServicer`` / ``ExtensionsServicer`` (translate a request, call a Driver, translate the
  answer) and ``add_servicers``; the plugin SDK (``vz_plugins``) serves them in a plugin process;
* what both share: conversion between plain contract values and protobuf messages (``*_to_pb`` /
  ``*_from_pb``), DriverError ↔ gRPC status (``error_to_status``, ``error_from_rpc``, ``runtime_errors_in``),
  the exec and terminal frame rules and message limits (``start_problem``, ``stdin_problem``,
  ``terminal_start_problem``, ``resize_problem``, ``STOP_INPUT_KEY``,
  ``MAX_MESSAGE``, ``CHANNEL_OPTIONS``, ``SERVER_OPTIONS``), and the generated stubs (``vz_core.rpc.pb``);
* local exec (``LocalExecServer`` in a plugin, ``local_exec`` on the host): a command's stdio as descriptors
  passed over a Unix socket (``vz_core.rpc._local``), with the fd-passing message helpers it is built on
  (``send_message``, ``send_json``, ``recv_message``, ``peer_credentials``: the daemon's local-wire framing);
* for tests: ``connect_in_process(driver)`` (a ``RemoteDriver`` over a real grpc.aio server on a private Unix
  socket) and ``serve_in_process(driver)`` (the same server, yielding a plain channel).

Names are imported on first use, so a plugin process does not pay for the client, and a host for the server.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vz_core.rpc import pb
    from vz_core.rpc._client import (
        DEFAULT_OPERATION_TIMEOUT,
        DEFAULT_TIMEOUT,
        ENV_OPERATION_TIMEOUT,
        ENV_TIMEOUT,
        Mode,
        RemoteDriver,
        StatusLog,
        is_made_up,
    )
    from vz_core.rpc._convert import (
        capabilities_from_pb,
        capabilities_to_pb,
        details_from_pb,
        details_to_pb,
        exec_event_from_pb,
        exec_event_to_pb,
        exec_spec_from_pb,
        exec_spec_to_pb,
        extensions_from_pb,
        extensions_to_pb,
        info_from_pb,
        info_to_pb,
        mount_from_pb,
        mount_to_pb,
        run_image_from_pb,
        run_image_to_pb,
        terminal_event_from_pb,
        terminal_event_to_pb,
        terminal_input_from_pb,
        terminal_input_to_pb,
        terminal_spec_from_pb,
        terminal_spec_to_pb,
    )
    from vz_core.rpc._fdpass import KIND_BYTES, KIND_JSON, MAX_FDS, MAX_FRAME, FramingError

    if sys.platform != "win32":
        from vz_core.rpc._fdpass import peer_credentials, recv_message, send_json, send_message
        from vz_core.rpc._local import LocalExecServer, local_exec
    from vz_core.rpc._frames import (
        CHANNEL_OPTIONS,
        MAX_EXEC_START,
        MAX_INFO,
        MAX_MESSAGE,
        MAX_WIDE_CHUNK,
        SERVER_OPTIONS,
        STOP_INPUT_KEY,
        WIDE_CHUNK_KEY,
        exec_output_limit,
        resize_problem,
        start_problem,
        stdin_problem,
        terminal_start_problem,
    )
    from vz_core.rpc._local import LOCAL_EXEC_SOCKET
    from vz_core.rpc._pair import connect_in_process, serve_in_process
    from vz_core.rpc._server import ExtensionsServicer, RuntimeServicer, add_servicers, stop_server
    from vz_core.rpc._server_exec import DRAIN_TIMEOUT
    from vz_core.rpc._wire import (
        DETAILS_TRAILER,
        RUNTIME_ERROR_TYPE_URL,
        error_from_rpc,
        error_to_runtime_error,
        error_to_status,
        runtime_errors_in,
    )
    from vz_core.rpc.pb import extensions_pb2, extensions_pb2_grpc, runtime_pb2, runtime_pb2_grpc

_WHERE = {
    "pb": "",
    "DEFAULT_OPERATION_TIMEOUT": "_client",
    "DEFAULT_TIMEOUT": "_client",
    "ENV_OPERATION_TIMEOUT": "_client",
    "ENV_TIMEOUT": "_client",
    "Mode": "_client",
    "RemoteDriver": "_client",
    "StatusLog": "_client",
    "is_made_up": "_client",
    **dict.fromkeys(
        [
            "capabilities_from_pb",
            "capabilities_to_pb",
            "details_from_pb",
            "details_to_pb",
            "exec_event_from_pb",
            "exec_event_to_pb",
            "exec_spec_from_pb",
            "exec_spec_to_pb",
            "extensions_from_pb",
            "extensions_to_pb",
            "info_from_pb",
            "info_to_pb",
            "mount_from_pb",
            "mount_to_pb",
            "run_image_from_pb",
            "run_image_to_pb",
            "terminal_event_from_pb",
            "terminal_event_to_pb",
            "terminal_input_from_pb",
            "terminal_input_to_pb",
            "terminal_spec_from_pb",
            "terminal_spec_to_pb",
        ],
        "_convert",
    ),
    **dict.fromkeys(
        [
            "CHANNEL_OPTIONS",
            "MAX_EXEC_START",
            "MAX_INFO",
            "MAX_MESSAGE",
            "MAX_WIDE_CHUNK",
            "SERVER_OPTIONS",
            "STOP_INPUT_KEY",
            "WIDE_CHUNK_KEY",
            "exec_output_limit",
            "resize_problem",
            "start_problem",
            "stdin_problem",
            "terminal_start_problem",
            "wide_chunk",
        ],
        "_frames",
    ),
    **dict.fromkeys(
        [
            "KIND_BYTES",
            "KIND_JSON",
            "MAX_FDS",
            "MAX_FRAME",
            "FramingError",
            "peer_credentials",
            "recv_message",
            "send_json",
            "send_message",
        ],
        "_fdpass",
    ),
    **dict.fromkeys(["LOCAL_EXEC_SOCKET", "LocalExecServer", "local_exec"], "_local"),
    "connect_in_process": "_pair",
    "serve_in_process": "_pair",
    "ExtensionsServicer": "_server",
    "RuntimeServicer": "_server",
    "add_servicers": "_server",
    "stop_server": "_server",
    "DRAIN_TIMEOUT": "_server_exec",
    **dict.fromkeys(
        [
            "DETAILS_TRAILER",
            "RUNTIME_ERROR_TYPE_URL",
            "error_from_rpc",
            "error_to_runtime_error",
            "error_to_status",
            "runtime_errors_in",
        ],
        "_wire",
    ),
    **dict.fromkeys(["extensions_pb2", "extensions_pb2_grpc", "runtime_pb2", "runtime_pb2_grpc"], "pb"),
}

__all__ = [
    "CHANNEL_OPTIONS",
    "DEFAULT_OPERATION_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "DETAILS_TRAILER",
    "DRAIN_TIMEOUT",
    "ENV_OPERATION_TIMEOUT",
    "ENV_TIMEOUT",
    "KIND_BYTES",
    "KIND_JSON",
    "LOCAL_EXEC_SOCKET",
    "MAX_EXEC_START",
    "MAX_FDS",
    "MAX_FRAME",
    "MAX_INFO",
    "MAX_MESSAGE",
    "MAX_WIDE_CHUNK",
    "RUNTIME_ERROR_TYPE_URL",
    "SERVER_OPTIONS",
    "STOP_INPUT_KEY",
    "WIDE_CHUNK_KEY",
    "ExtensionsServicer",
    "FramingError",
    "LocalExecServer",
    "Mode",
    "RemoteDriver",
    "RuntimeServicer",
    "StatusLog",
    "add_servicers",
    "capabilities_from_pb",
    "capabilities_to_pb",
    "connect_in_process",
    "details_from_pb",
    "details_to_pb",
    "error_from_rpc",
    "error_to_runtime_error",
    "error_to_status",
    "exec_event_from_pb",
    "exec_event_to_pb",
    "exec_output_limit",
    "exec_spec_from_pb",
    "exec_spec_to_pb",
    "extensions_from_pb",
    "extensions_pb2",
    "extensions_pb2_grpc",
    "extensions_to_pb",
    "info_from_pb",
    "info_to_pb",
    "is_made_up",
    "local_exec",
    "mount_from_pb",
    "mount_to_pb",
    "pb",
    "peer_credentials",
    "recv_message",
    "resize_problem",
    "run_image_from_pb",
    "run_image_to_pb",
    "runtime_errors_in",
    "runtime_pb2",
    "runtime_pb2_grpc",
    "send_json",
    "send_message",
    "serve_in_process",
    "start_problem",
    "stdin_problem",
    "stop_server",
    "terminal_event_from_pb",
    "terminal_event_to_pb",
    "terminal_input_from_pb",
    "terminal_input_to_pb",
    "terminal_spec_from_pb",
    "terminal_spec_to_pb",
    "terminal_start_problem",
    "wide_chunk",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module == "":
        value: Any = importlib.import_module(f"{__name__}.{name}")
    else:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
