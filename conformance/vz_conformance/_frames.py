"""Raw Runtime Protocol frames for the wire-level cases (what a ``Driver`` object cannot express).

Checks build ``ExecClientMessage`` sequences (a missing start, a second start, an empty data frame, an unset
payload, EOF before ``close_stdin``) and judge the status and the ``RuntimeError`` details that come back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from vz_conformance._expect import fail
from vz_core.rpc import StatusLog, is_made_up, runtime_errors_in
from vz_core.rpc.pb import runtime_pb2 as pb

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
_PEER_STATUS_WAIT = 2.0


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
        return (
            f"client frames {_runs(self.sent)}, server frames {_runs(kinds)}, status {self.code.name} {self.message!r}"
        )


def _runs(names: Sequence[str]) -> list[str]:
    """``names`` with repeats folded: ``['stdin(3 bytes) x64', 'half-close']``."""
    folded: list[str] = []
    for index, name in enumerate(names):
        if index and name == names[index - 1]:
            continue
        count = 1
        while index + count < len(names) and names[index + count] == name:
            count += 1
        folded.append(name if count == 1 else f"{name} x{count}")
    return folded


async def raw_exec(
    channel: grpc.aio.Channel,
    messages: Sequence[pb.ExecClientMessage],
    *,
    half_close: bool = False,
    within: float = 15.0,
) -> RawOutcome:
    """Send ``messages`` on a new Exec stream, optionally half-close, and read until the status arrives.

    The outcome is what the server sent, even when it ended the call before the client's last write: a write
    that fails then stops the sending, and grpcio's made-up status for that write (grpc/grpc#36066, see
    ``vz_core.rpc.StatusLog``) never replaces the server's.
    """
    method = channel.stream_stream(
        f"{SERVICE}/Exec",
        request_serializer=pb.ExecClientMessage.SerializeToString,
        response_deserializer=pb.ExecServerMessage.FromString,
    )
    outcome = RawOutcome(sent=[_frame_name(m) for m in messages] + (["half-close"] if half_close else []))
    call = method(timeout=within)  # type: ignore[call-arg]  # frames are written one by one below
    log = StatusLog(call)
    try:
        if await _send(call, messages) and half_close:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.done_writing()
        # The call's iterator, not read(): read() stops at a made-up status while the server's frames (and
        # its status) are still to come.
        frames = call.__aiter__()
        while True:
            try:
                frame = await frames.__anext__()
            except (StopAsyncIteration, grpc.aio.AioRpcError):
                break  # the status below says what happened
            assert isinstance(frame, pb.ExecServerMessage)
            outcome.frames.append(frame)
    except asyncio.CancelledError:
        call.cancel()
        raise
    status = await _server_status(call, log)
    outcome.code, outcome.message = status.code(), status.details() or ""
    outcome.runtime_errors = runtime_errors_in(status)
    return outcome


async def _send(call: Any, messages: Sequence[pb.ExecClientMessage]) -> bool:
    """Write ``messages`` until one cannot be written because the call ended; True when all were written."""
    for message in messages:
        if call.done():
            return False
        try:
            await call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return False
    return True


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


class _Status(grpc.RpcError):
    """A finished call's status, shaped like the errors ``is_made_up`` and ``runtime_errors_in`` read."""

    def __init__(self, code: grpc.StatusCode, details: str | None, trailing: Any) -> None:
        super().__init__(details)
        self._code, self._details, self._trailing = code, details or "", trailing

    @classmethod
    async def of(cls, call: Any) -> _Status:
        return cls(await call.code(), await call.details(), await call.trailing_metadata())

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailing


async def _server_status(call: Any, log: StatusLog) -> grpc.RpcError:
    """The status the server sent, once the call's frames are read.

    When the server's status came first, grpcio's made-up one replaced it on the call and ``log`` kept it; when
    the made-up one came first, the server's replaced it on the call as the remaining frames were read.
    """
    status = await _Status.of(call)
    if not is_made_up(status):
        return status
    return await log.peer_status(_PEER_STATUS_WAIT) or await _Status.of(call)


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
