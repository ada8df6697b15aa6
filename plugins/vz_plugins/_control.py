"""go-plugin's own services, served beside RuntimeDriver: controller, stdio and broker (package ``plugin``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import grpc.aio
from google.protobuf import empty_pb2

from vz_core.rpc.pb import (
    grpc_broker_pb2_grpc,
    grpc_controller_pb2,
    grpc_controller_pb2_grpc,
    grpc_stdio_pb2,
    grpc_stdio_pb2_grpc,
)

__all__ = ["BrokerServicer", "ControllerServicer", "StdioServicer"]

_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # end-of-stream marker of context.read()


class ControllerServicer(grpc_controller_pb2_grpc.GRPCControllerServicer):
    """``plugin.GRPCController``: Shutdown answers, then the plugin stops serving and exits."""

    def __init__(self, stopping: asyncio.Event) -> None:
        self._stopping = stopping

    async def Shutdown(
        self, request: grpc_controller_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> grpc_controller_pb2.Empty:
        # The reply goes out first; the serve loop stops the server as soon as the event is set.
        asyncio.get_running_loop().call_soon(self._stopping.set)
        return grpc_controller_pb2.Empty()


class StdioServicer(grpc_stdio_pb2_grpc.GRPCStdioServicer):
    """``plugin.GRPCStdio``: a vz plugin writes its logs to stderr directly, so the stream stays silent.

    It stays open until the plugin stops, like go-plugin's, so hosts that mirror it see a clean end.
    """

    def __init__(self, stopping: asyncio.Event) -> None:
        self._stopping = stopping

    async def StreamStdio(
        self, request: empty_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:  # an async generator of StdioData that never yields
        await self._stopping.wait()
        return
        yield grpc_stdio_pb2.StdioData()  # pragma: no cover (makes this an async generator)


class BrokerServicer(grpc_broker_pb2_grpc.GRPCBrokerServicer):
    """``plugin.GRPCBroker``: accepts the stream and idles; vz plugins broker no connections."""

    def __init__(self, stopping: asyncio.Event) -> None:
        self._stopping = stopping

    async def StartStream(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        async def consume() -> None:
            while True:
                msg = await context.read()
                if msg is _EOF:
                    return
                del msg  # connection offers are ignored: we dial nothing

        reader = asyncio.ensure_future(consume())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, stopping):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(reader, stopping, return_exceptions=True)
