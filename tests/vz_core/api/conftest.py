"""Shared by the API tests."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from vz_core.api import pb
from vz_core.daemon._grpc import GrpcFront


@pytest.fixture(scope="session", autouse=True)
def _grpc_core_started(tmp_path_factory: pytest.TempPathFactory) -> None:
    """grpc's core opens two process-wide sockets at its first HTTP/2 connection and keeps them for the life of
    the process: open them once here, before the per-test leak guard takes its inventory."""
    directory = tmp_path_factory.mktemp("grpc-core")

    async def dispatch(call: Any) -> dict[str, Any]:
        return {"drivers": []}

    async def main() -> None:
        front = GrpcFront(dispatch, directory)
        await front.start()
        try:

            def call() -> None:
                with grpc.insecure_channel("unix:" + front.socket_path) as channel:
                    spec = pb.method("System.Capabilities")
                    stub = channel.unary_unary(
                        spec.path,
                        request_serializer=spec.request.SerializeToString,
                        response_deserializer=spec.response.FromString,
                    )
                    stub(spec.request(), timeout=30)

            await asyncio.to_thread(call)
        finally:
            await front.close()

    asyncio.run(main())
