"""The suite's own raw Exec calls report the server's real outcome, even when the server ends the call early.

grpcio's asyncio client replaces the server's status with a made-up INTERNAL "Internal error from Core" when
one of its writes fails because the server already ended the call (grpc/grpc#36066). Servers that refuse a
frame without waiting for the client to stop writing (go-plugin plugins do) trigger it; the wire-level cases
must still judge the status and the RuntimeError the server sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from vz_conformance import _frames

from vz_core.errors import InvalidArgumentError, NotFoundError
from vz_core.rpc import error_to_status
from vz_core.rpc.pb import runtime_pb2 as pb
from vz_core.rpc.pb import runtime_pb2_grpc as pb_grpc

FRAMES = 64  # 2 MiB of stdin: far more than the transport buffers once the server stops reading


class _EagerServicer(pb_grpc.RuntimeDriverServicer):
    """Ends Exec after the first frame without reading the rest: a refusal, or output and an exit."""

    async def Exec(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        first = await context.read()
        if first.WhichOneof("payload") != "start":
            status = error_to_status(InvalidArgumentError("the first frame must be a start"))
            await context.abort(status.code, status.details, status.trailing_metadata)
        if first.start.workspace_id == "missing":
            status = error_to_status(NotFoundError("no Machine 'missing'"))
            await context.abort(status.code, status.details, status.trailing_metadata)
        await context.write(pb.ExecServerMessage(stdout=pb.OutputChunk(data=b"bye")))
        await context.write(pb.ExecServerMessage(exit=pb.ExecExit(exit_code=3)))


@pytest.fixture
async def eager(tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server()
    pb_grpc.add_RuntimeDriverServicer_to_server(_EagerServicer(), server)  # type: ignore[no-untyped-call]
    address = f"unix:{tmp_path / 'eager.sock'}"
    server.add_insecure_port(address)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            yield channel
    finally:
        await server.stop(None)


def _stdin_frames() -> list[pb.ExecClientMessage]:
    return [_frames.stdin(b"i" * 32768) for _ in range(FRAMES)]


async def test_a_refusal_before_the_last_write_keeps_the_servers_status(eager: grpc.aio.Channel) -> None:
    for attempt in range(20):
        outcome = await _frames.raw_exec(eager, [_frames.start("missing", ("x",)), *_stdin_frames()], half_close=True)
        assert outcome.code == grpc.StatusCode.NOT_FOUND, f"attempt {attempt}: {outcome.where()}"
        _frames.require_one_runtime_error("Exec", outcome, grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
        assert outcome.message == "no Machine 'missing'"


async def test_a_refused_first_frame_keeps_the_servers_status(eager: grpc.aio.Channel) -> None:
    for attempt in range(20):
        outcome = await _frames.raw_exec(eager, _stdin_frames(), half_close=True)
        assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT, f"attempt {attempt}: {outcome.where()}"
        _frames.require_one_runtime_error("Exec", outcome, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")


async def test_frames_and_ok_status_of_an_early_end_are_kept(eager: grpc.aio.Channel) -> None:
    for attempt in range(20):
        outcome = await _frames.raw_exec(eager, [_frames.start("w", ("x",)), *_stdin_frames()], half_close=True)
        kinds = [frame.WhichOneof("payload") for frame in outcome.frames]
        assert (outcome.code, kinds) == (grpc.StatusCode.OK, ["stdout", "exit"]), f"attempt {attempt}"
        assert outcome.frames[0].stdout.data == b"bye" and outcome.frames[1].exit.exit_code == 3
