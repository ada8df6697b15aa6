"""Raw Runtime Protocol frames for the wire-level cases (what a ``Driver`` object cannot express).

Checks build ``ExecClientMessage`` sequences (a missing start, a second start, an empty data frame, an unset
payload, EOF before ``close_stdin``) and judge the status and the ``RuntimeError`` details that come back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from vz_conformance._expect import fail
from vz_core._proto.devsy.runtime.v1 import runtime_pb2 as pb
from vz_core._wire import runtime_errors_in

__all__ = [
    "RawOutcome",
    "close_stdin",
    "raw_exec",
    "raw_start_missing",
    "require_one_runtime_error",
    "start",
    "stdin",
    "unset",
]

SERVICE = "/devsy.runtime.v1.RuntimeDriver"
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # end-of-stream marker of call.read()


def start(workspace_id: str, argv: Sequence[str], *, tty: bool = False) -> pb.ExecClientMessage:
    return pb.ExecClientMessage(start=pb.ExecStart(workspace_id=workspace_id, argv=list(argv), tty=tty))


def stdin(data: bytes) -> pb.ExecClientMessage:
    return pb.ExecClientMessage(stdin=data)


def close_stdin() -> pb.ExecClientMessage:
    return pb.ExecClientMessage(close_stdin=pb.CloseStdin())


def unset() -> pb.ExecClientMessage:
    """A frame whose ``payload`` oneof is not set."""
    return pb.ExecClientMessage()


def _frame_name(msg: pb.ExecClientMessage) -> str:
    which = msg.WhichOneof("payload")
    if which == "stdin":
        return f"stdin({len(msg.stdin)} bytes)"
    return which or "unset"


@dataclass
class RawOutcome:
    """What a raw call returned: the frames, the final status and its RuntimeError details."""

    sent: list[str]
    frames: list[pb.ExecServerMessage] = field(default_factory=list)
    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""
    runtime_errors: list[pb.RuntimeError] = field(default_factory=list)

    def where(self) -> str:
        kinds = [f.WhichOneof("payload") or "unset" for f in self.frames]
        return f"client frames {self.sent}, server frames {kinds}, status {self.code.name} {self.message!r}"


async def raw_exec(
    channel: grpc.aio.Channel,
    messages: Sequence[pb.ExecClientMessage],
    *,
    half_close: bool = False,
    within: float = 15.0,
) -> RawOutcome:
    """Send ``messages`` on a new Exec stream, optionally half-close, and read until the status arrives.

    Send nothing after the frame the server must refuse: grpcio's asyncio client replaces the server's status
    with ``INTERNAL: Internal error from Core`` when a write fails because the server already ended the call
    (grpc/grpc#36066), so a probe that kept writing would sometimes report a status the server never sent.
    """
    method = channel.stream_stream(
        f"{SERVICE}/Exec",
        request_serializer=pb.ExecClientMessage.SerializeToString,
        response_deserializer=pb.ExecServerMessage.FromString,
    )
    outcome = RawOutcome(sent=[_frame_name(m) for m in messages] + (["half-close"] if half_close else []))
    call = method(timeout=within)  # type: ignore[call-arg]  # frames are written one by one below
    try:
        for message in messages:
            await call.write(message)
        if half_close:
            await call.done_writing()
        while True:
            frame = await call.read()
            if frame is _EOF:
                break
            assert isinstance(frame, pb.ExecServerMessage)
            outcome.frames.append(frame)
    except grpc.aio.AioRpcError:
        pass  # the status below says what happened
    except asyncio.CancelledError:
        call.cancel()
        raise
    outcome.code = await call.code()
    outcome.message = await call.details() or ""
    trailing = await call.trailing_metadata()
    outcome.runtime_errors = runtime_errors_in(_Trailers(trailing))
    return outcome


async def raw_start_missing(channel: grpc.aio.Channel, workspace_id: str) -> RawOutcome:
    """Call Start for a workspace that does not exist and keep the raw status."""
    method = channel.unary_unary(
        f"{SERVICE}/Start",
        request_serializer=pb.StartRequest.SerializeToString,
        response_deserializer=pb.StartResponse.FromString,
    )
    outcome = RawOutcome(sent=[f"StartRequest(workspace_id={workspace_id!r})"])
    try:
        await method(pb.StartRequest(workspace_id=workspace_id), timeout=15.0)
    except grpc.aio.AioRpcError as err:
        outcome.code = err.code()
        outcome.message = err.details() or ""
        outcome.runtime_errors = runtime_errors_in(err)
    return outcome


class _Trailers:
    """Adapts aio trailing metadata to what ``runtime_errors_in`` reads."""

    def __init__(self, metadata: object) -> None:
        self._metadata = metadata

    def trailing_metadata(self) -> object:
        return self._metadata


def require_one_runtime_error(rpc: str, outcome: RawOutcome, code: grpc.StatusCode, category: str) -> None:
    """The status is ``code`` and carries exactly one RuntimeError of ``category`` with a non-empty message."""
    if outcome.code != code:
        fail(rpc, f"status {code.name}", f"status {outcome.code.name}", note=outcome.where())
    if len(outcome.runtime_errors) != 1:
        fail(
            rpc,
            "exactly one devsy.runtime.v1.RuntimeError in google.rpc.Status.details",
            f"{len(outcome.runtime_errors)} RuntimeError details",
            note=outcome.where(),
        )
    error = outcome.runtime_errors[0]
    name = pb.RuntimeErrorCode.Name(error.code) if error.code in pb.RuntimeErrorCode.values() else str(error.code)
    if name != f"RUNTIME_ERROR_CODE_{category}":
        fail(rpc, f"RuntimeError.code RUNTIME_ERROR_CODE_{category}", name, note=outcome.where())
    if not error.message.strip():
        fail(rpc, "a non-empty RuntimeError.message", repr(error.message), note=outcome.where())
