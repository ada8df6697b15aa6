"""An in-process client/server pair over a real ``grpc.aio`` server, for tests (go-plugin's ``testing.go``).

The server is the same one a plugin process runs (``RuntimeServicer`` + ``ExtensionsServicer`` with the same
message limits), listening on a Unix socket in a private 0700 directory that is removed afterwards; the client
is a ``RemoteDriver`` on a channel to it, so every call crosses the real wire (protobuf encoding, statuses,
trailers, flow control) without a plugin process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import grpc.aio

from vz_core._driver import Driver
from vz_core.redact import Redactor
from vz_core.rpc._client import RemoteDriver
from vz_core.rpc._frames import CHANNEL_OPTIONS, SERVER_OPTIONS

if sys.platform != "win32":
    from vz_core.rpc._local import LocalExecServer
from vz_core.rpc._server import add_servicers, stop_server

__all__ = ["connect_in_process", "serve_in_process"]


@contextlib.asynccontextmanager
async def serve_in_process(
    driver: Driver,
    *,
    redactor: Redactor | None = None,
    grace: float = 0.5,
    channel_options: Sequence[tuple[str, int | str]] | None = None,
    local_exec: bool = True,
) -> AsyncIterator[grpc.aio.Channel]:
    """Serve ``driver`` on a private Unix socket and yield a plain channel to it (closed and removed after).

    ``grace``: seconds in-flight calls get when the server stops at the end. ``channel_options``: the
    channel's gRPC options (default: a vz host's, ``CHANNEL_OPTIONS``), e.g. to act as a foreign host.
    ``local_exec``: also serve the local exec socket (``ExtensionsResponse.local_exec_socket``), as a plugin does.
    """
    directory = tempfile.mkdtemp(prefix="vz-rpc-")
    os.chmod(directory, 0o700)
    address = f"unix:{directory}/driver.sock"
    server = grpc.aio.server(options=SERVER_OPTIONS)
    redactor = redactor if redactor is not None else Redactor()
    local: Any = None
    if sys.platform != "win32" and local_exec:  # Windows: no descriptor passing, no local exec socket
        local = LocalExecServer(driver, redactor, parent=directory)
    try:
        path = await local.start() if local is not None else ""
        add_servicers(server, driver, redactor, local_exec_socket=path)
        server.add_insecure_port(address)
        await server.start()
        options = CHANNEL_OPTIONS if channel_options is None else list(channel_options)
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            yield channel
    finally:
        await stop_server(server, grace)
        if local is not None:
            await local.close()
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.asynccontextmanager
async def connect_in_process(driver: Driver, *, local_exec: bool = True, **remote: Any) -> AsyncIterator[RemoteDriver]:
    """``async with connect_in_process(driver) as remote:`` a ``RemoteDriver`` served by ``driver`` in-process.

    Keyword arguments go to ``RemoteDriver`` (``name``, ``redactor``, ``timeout``). ``local_exec``: serve the
    local exec socket too (as a plugin does). The remote is closed, then the server stopped, on exit; ``driver``
    itself is not closed (the caller owns it).
    """
    async with serve_in_process(driver, local_exec=local_exec) as channel:
        remote_driver = RemoteDriver(channel=channel, **remote)
        try:
            yield remote_driver
        finally:
            await remote_driver.close()
