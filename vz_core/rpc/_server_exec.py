"""One Exec (or ExecPty terminal) stream on the plugin side, after its start frame (PROTOCOL.md §4).

A terminal session (``vz.machine.v1.MachineExtensions/ExecPty``) is run by the same machinery with its own
frames: ``TerminalClientInput`` instead of ``ClientInput`` and one output stream.

Three rules keep the call healthy with grpcio's asyncio stack:

* **One reader.** ``ClientInput`` is the only code that calls ``context.read()``. It reads ahead a few frames,
  checks the client's frame rules, hands stdin to the driver and, once the exec is over, *drains*: it keeps
  reading and discarding until the client half-closes. A read is never cancelled while the call may still
  be read from: Core keeps a cancelled read pending, and the next read would then fail (and look like EOF).
* **One writer, never cancelled inside a write.** ``ExecStream`` forwards the driver's events 1:1. To stop it
  early it raises a flag; the writer is cancelled only while it waits for the driver. A write cancelled half
  way leaves Core's send pending, and the abort that follows fails (the client then waits for its deadline).
* **No status while the client may still write.** After the exit event, or after an error that is not the
  client's fault (NOT_FOUND, UNSUPPORTED tty, a driver failure), the call ends only once the client
  half-closed, or ``DRAIN_TIMEOUT`` seconds later. grpcio's asyncio client replaces the server's status with
  ``INTERNAL: Internal error from Core`` when one of its writes fails because the call already ended
  (grpc/grpc#36066); a client that is done writing cannot hit that. For errors found before any output the
  response headers carry ``STOP_INPUT_KEY`` so that a client that knows it stops sending at once. A client that
  breaks the frame rules is refused at once (INVALID_ARGUMENT), without draining.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from vz_core._proto.devsy.runtime.v1 import runtime_pb2 as pb
from vz_core._proto.vz.machine.v1 import extensions_pb2 as ext_pb
from vz_core._types import (
    MAX_CHUNK,
    ExecEvent,
    ExecExit,
    ExecOutput,
    TerminalData,
    TerminalEof,
    TerminalEvent,
    TerminalInput,
    TerminalOutput,
    TerminalResize,
)
from vz_core.errors import DriverError, InvalidArgumentError
from vz_core.rpc import _convert
from vz_core.rpc._codec import encode_output
from vz_core.rpc._frames import STOP_INPUT_KEY, WIDE_CHUNK_KEY, exec_output_limit, resize_problem, stdin_problem
from vz_core.rpc._heap import keep_freed_heap

__all__ = ["DRAIN_TIMEOUT", "ClientInput", "ExecStream", "TerminalClientInput"]

T = TypeVar("T")

_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # end-of-stream marker of context.read()
DRAIN_TIMEOUT = 5.0
"""Seconds the server waits, once the exec is over, for the client to half-close."""
_READ_AHEAD = 4


class _Input(Generic[T]):
    """The client's frames after the start frame: the input the driver reads, and the rule checks.

    Iterating it yields input items; it raises the ``InvalidArgumentError`` when the client broke a frame
    rule. ``violated`` resolves with that error. ``drain()`` switches to reading and discarding until the
    client half-closes (then a missing ``close_stdin`` is no longer an error); ``task`` ends when the client
    half-closed, broke a rule or the call failed. Subclasses accept their own frames (``_accept``).
    """

    _what = "exec"
    _ends_at_close = True

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        loop = asyncio.get_running_loop()
        self._context = context
        self._buffer: collections.deque[T] = collections.deque()
        self._stdin_closed = False
        self._finished = False
        self._draining = False
        self._data_waiter: asyncio.Future[None] | None = None
        self._space_waiter: asyncio.Future[None] | None = None
        self.violation: DriverError | None = None
        self.violated: asyncio.Future[None] = loop.create_future()
        self.on_violation: Callable[[], None] | None = None
        self.task: asyncio.Task[None] = loop.create_task(self._run())

    # The reader ------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._read_frames()
        except Exception:  # the call failed (cancelled, server stopping): nothing more to read
            pass
        finally:
            self._finished = True
            self._wake_consumer()

    async def _read_frames(self) -> None:
        read = self._context.read
        buffer = self._buffer
        while True:
            msg = await read()
            if self._draining:
                if msg is _EOF:
                    return
                continue
            if msg is _EOF:
                if not self._stdin_closed:
                    self._violate(f"the {self._what} stream ended before close_stdin")
                return
            problem = self._accept(msg)
            if problem is not None:
                self._violate(f"{self._what} protocol violation: {problem}")
                return
            while len(buffer) >= _READ_AHEAD and not self._draining:
                self._space_waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._space_waiter
                finally:
                    self._space_waiter = None

    def _push(self, item: T) -> None:
        self._buffer.append(item)
        self._wake_consumer()

    def _accept(self, msg: Any) -> str | None:
        """Take one frame (buffer its input, note a close_stdin); what is wrong with it, or None."""
        raise NotImplementedError

    def _violate(self, message: str) -> None:
        self.violation = InvalidArgumentError(message)
        if not self.violated.done():
            self.violated.set_result(None)
        if self.on_violation is not None:
            self.on_violation()

    def _wake_consumer(self) -> None:
        waiter = self._data_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # What the driver reads -------------------------------------------------------------------------------

    def __aiter__(self) -> _Input[T]:
        return self

    async def __anext__(self) -> T:
        buffer = self._buffer
        while True:
            if buffer:
                data = buffer.popleft()
                waiter = self._space_waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                return data
            if self.violation is not None:
                raise self.violation
            if (self._stdin_closed and self._ends_at_close) or self._finished or self._draining:
                raise StopAsyncIteration
            self._data_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._data_waiter
            finally:
                self._data_waiter = None

    # Ending ----------------------------------------------------------------------------------------------

    def drain(self) -> None:
        """Discard everything from now on (buffered stdin included) and read until the client half-closes."""
        self._draining = True
        self._buffer.clear()
        waiter = self._space_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._wake_consumer()

    async def wait_closed(self, seconds: float) -> bool:
        """Drain, and wait up to ``seconds`` for the client's half-close; True if it came."""
        self.drain()
        if not self.task.done():
            await asyncio.wait((self.task,), timeout=seconds)
        return self.task.done()

    async def close(self) -> None:
        """Stop reading. Only when the call is ending: a read cancelled here can never be followed by another."""
        if not self.task.done():
            self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class ClientInput(_Input[bytes]):
    """Exec input: stdin chunks; iteration ends at ``close_stdin``."""

    limit = MAX_CHUNK
    """The largest stdin frame accepted (wider once agreed with the host: ``WIDE_CHUNK_KEY``)."""

    def _accept(self, msg: Any) -> str | None:
        kind = "malformed" if msg is _convert.MALFORMED else msg.WhichOneof("payload")
        if kind == "stdin":
            data: bytes = msg.stdin
            problem = stdin_problem(data, self._stdin_closed, self.limit)
            if problem is None:
                self._push(data)
            return problem
        if kind == "close_stdin":
            if self._stdin_closed:
                return "a close_stdin frame after close_stdin"
            self._stdin_closed = True
            self._wake_consumer()
            return None
        if kind == "start":
            return "a second start frame"
        if kind == "malformed":
            return "a frame that is not a valid ExecClientMessage"
        return "a frame with no payload"


class TerminalClientInput(_Input[TerminalInput]):
    """Terminal input: ``TerminalData``, ``TerminalResize`` and one ``TerminalEof``; iteration goes on after the
    eof (resizes still come) and ends when the client half-closes."""

    _what = "terminal"
    _ends_at_close = False

    def _accept(self, msg: Any) -> str | None:
        kind = "malformed" if msg is _convert.MALFORMED else msg.WhichOneof("payload")
        if kind == "stdin":
            data: bytes = msg.stdin
            problem = stdin_problem(data, self._stdin_closed)
            if problem is None:
                self._push(TerminalData(data))
            return problem
        if kind == "resize":
            problem = resize_problem(msg.resize.rows, msg.resize.cols)
            if problem is None:
                self._push(TerminalResize(msg.resize.rows, msg.resize.cols))
            return problem
        if kind == "close_stdin":
            if self._stdin_closed:
                return "a close_stdin frame after close_stdin"
            self._stdin_closed = True
            self._push(TerminalEof())
            return None
        if kind == "start":
            return "a second start frame"
        if kind == "malformed":
            return "a frame that is not a valid PtyClientMessage"
        return "a frame with no payload"


class ExecStream:
    """Runs one exec: the driver's events out, the client's stdin in, the end of the call done safely.

    ``run()`` returns the error to abort with (or None for OK). The caller must ``close()`` it in all cases.
    """

    def __init__(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        drain_timeout: float = DRAIN_TIMEOUT,
        *,
        terminal: bool = False,
        chunk: int = MAX_CHUNK,
    ) -> None:
        self._context = context
        self._chunk = MAX_CHUNK if terminal else chunk
        self._drain_timeout = drain_timeout
        self._to_pb: Callable[[Any], Any] = _terminal_frame if terminal else _frame
        self.input: _Input[Any] = TerminalClientInput(context) if terminal else ClientInput(context)
        self.input.on_violation = self._on_violation
        if isinstance(self.input, ClientInput):
            self.input.limit = self._chunk
        if self._chunk > MAX_CHUNK:
            keep_freed_heap()  # wide frames: their ~1 MiB buffers reused, not faulted in again each frame
        self._stop = False
        self._pulling = False
        self._wrote = False

    def _on_violation(self) -> None:
        # Stop forwarding output before anything else is written (the writer checks this between writes).
        self._stop = True

    async def _forward(self, events: AsyncIterator[Any]) -> None:
        if self._chunk > MAX_CHUNK:
            await self._forward_wide(events)
            return
        write = self._context.write
        to_pb = self._to_pb
        iterator = events.__aiter__()
        while not self._stop:
            self._pulling = True
            try:
                event = await iterator.__anext__()
            except StopAsyncIteration:
                return
            finally:
                self._pulling = False
            if self._stop:
                return
            if isinstance(event, ExecExit):
                # From here on the client may half-close without close_stdin, and its stdin is of no use.
                self.input.drain()
            await write(to_pb(event))
            self._wrote = True

    async def _forward_wide(self, events: AsyncIterator[Any]) -> None:
        """``_forward`` for a host that agreed on wide frames: output chunks the driver already has ready (of
        the same stream) are joined into frames of up to ``_chunk`` bytes. A chunk the driver should not have
        sent (empty, or over ``_chunk``) is never joined: it goes in a frame of its own, so the host sees it as
        it came. One event may be fetched ahead (a task); it is awaited, or cancelled with the forwarder, never
        left behind."""
        write = self._context.write
        iterator = events.__aiter__()
        ahead: asyncio.Task[Any] | None = None
        loop = asyncio.get_running_loop()
        try:
            while not self._stop:
                if ahead is None:
                    ahead = loop.create_task(iterator.__anext__())  # type: ignore[arg-type]
                self._pulling = True
                try:
                    event = await ahead
                except StopAsyncIteration:
                    return
                finally:
                    self._pulling = False
                    if ahead.done():
                        ahead = None
                if self._stop:
                    return
                if type(event) is ExecOutput:
                    parts, size = [event.data], len(event.data)
                    while 0 < size < self._chunk and not self._stop:  # an empty chunk goes alone, as it came
                        ahead = loop.create_task(iterator.__anext__())  # type: ignore[arg-type]
                        self._pulling = True  # the driver may be running: a violation cancels, never acloses
                        try:
                            await asyncio.sleep(0)  # one step: done now if the driver had the next one ready
                        finally:
                            self._pulling = False
                        if not ahead.done() or ahead.cancelled() or ahead.exception() is not None:
                            break  # not ready (or the end, or a failure): awaited at the top of the loop
                        following = ahead.result()
                        if (
                            type(following) is not ExecOutput
                            or following.stream != event.stream
                            or not following.data
                            or size + len(following.data) > self._chunk
                        ):
                            break
                        ahead = None
                        parts.append(following.data)
                        size += len(following.data)
                    if len(parts) > 1:
                        event = ExecOutput(event.stream, b"".join(parts))
                    # A fetched event that was not joined stays in ``ahead``: the top of the loop awaits it.
                elif isinstance(event, ExecExit):
                    self.input.drain()
                if self._stop:
                    return
                if not self._wrote:
                    with contextlib.suppress(Exception):
                        await self._context.send_initial_metadata(((WIDE_CHUNK_KEY, str(self._chunk)),))
                await write(_frame(event))
                self._wrote = True
        finally:
            if ahead is not None and not ahead.done():
                ahead.cancel()
                await asyncio.gather(ahead, return_exceptions=True)

    async def refuse(self, error: DriverError) -> DriverError:
        """An error that is not the client's fault, found before any output: drain first, then report it."""
        self.input.drain()
        if not self._wrote:
            # Tell a client that understands it to stop sending now; others are drained (bounded).
            with contextlib.suppress(Exception):
                await self._context.send_initial_metadata(((STOP_INPUT_KEY, "1"),))
        await self.input.wait_closed(self._drain_timeout)
        return error

    async def run(
        self,
        start: Callable[[Any], AsyncIterator[Any]],
        translate: Callable[[BaseException], DriverError],
    ) -> DriverError | None:
        """Start the driver's exec on the client's stdin and forward its events until the end of the exec."""
        try:
            events = start(self.input)
        except Exception as exc:
            return await self.refuse(translate(exc))
        context = contextvars.copy_context()
        if self._chunk > MAX_CHUNK:
            # The host agreed on wide frames: the driver may yield output chunks that wide (exec_output_limit).
            context.run(exec_output_limit.set, self._chunk)
        forwarder = asyncio.get_running_loop().create_task(self._forward(events), context=context)
        try:
            await asyncio.wait((forwarder, self.input.violated), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # The call was cancelled (client cancel, deadline, shutdown): no write can complete any more, so
            # cancelling one is harmless now. Closing the driver's generator kills the command.
            self._stop = True
            forwarder.cancel()
            await asyncio.gather(forwarder, return_exceptions=True)
            await _aclose(events)
            raise
        if self.input.violation is not None:
            # The client broke the rules: stop the writer between two writes, kill the command, refuse.
            self._stop = True
            if not forwarder.done():
                if self._pulling:
                    forwarder.cancel()  # it waits for the driver, not inside context.write
                else:
                    await _aclose(events)  # the generator is suspended at a yield: this kills the command now
            await asyncio.gather(forwarder, return_exceptions=True)
            await _aclose(events)
            return self.input.violation
        await _aclose(events)
        if forwarder.cancelled():
            return await self.refuse(translate(asyncio.CancelledError("the driver's exec was cancelled")))
        failure = forwarder.exception()
        if failure is not None:
            return await self.refuse(translate(failure))
        await self.input.wait_closed(self._drain_timeout)
        return None

    async def close(self) -> None:
        await self.input.close()


def _frame(event: ExecEvent) -> bytes | pb.ExecServerMessage:
    """The wire frame of an event: output encoded directly (``vz_core.rpc._codec``, the bytes protobuf would
    give), anything else as ``_convert.exec_event_to_pb``."""
    if type(event) is ExecOutput:
        return encode_output(event.stream, event.data)
    return _convert.exec_event_to_pb(event)


def _terminal_frame(event: TerminalEvent) -> ext_pb.PtyServerMessage:
    if type(event) is TerminalOutput:
        return ext_pb.PtyServerMessage(output=event.data)
    return _convert.terminal_event_to_pb(event)


async def _aclose(stream: object) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
