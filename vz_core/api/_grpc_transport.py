"""The gRPC transport of the client: vz.api.v1 over ``grpc.insecure_channel("unix:" + socket)``.

Requests are the same dicts the local wire sends, converted with ``vz_core.api.pb.from_wire``; every answer is
converted back with ``to_wire``, so a caller sees the same objects on both transports. A failed call's
``grpc-status-details-bin`` gives the daemon's error object (``vz.api.v1.ErrorInfo``) and so the same
``ApiError``. Descriptors cannot travel over gRPC: Exec streams every byte as messages.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc

from vz_core.api import pb
from vz_core.api._errors import ApiError

__all__ = ["GrpcCall", "GrpcTransport"]

_DETAILS = "grpc-status-details-bin"
_MAX_MESSAGE = 16 * 1024 * 1024
_CHUNK = 256 * 1024


def _api_error(err: grpc.RpcError) -> ApiError:
    """The one mapping of a failed gRPC call to ApiError (through the daemon's error object)."""
    raw: bytes | None = None
    for key, value in getattr(err, "trailing_metadata", lambda: ())() or ():
        if key == _DETAILS:
            raw = value if isinstance(value, bytes) else value.encode()
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    text = err.details() if hasattr(err, "details") else str(err)
    error = pb.error_from_status_details(raw, code.name if code is not None else "UNKNOWN", text or "")
    if raw is None and code == grpc.StatusCode.UNAVAILABLE:
        error["message"] = f"cannot reach the vz daemon over gRPC ({text}); see `vz daemon status`"
    return ApiError.from_wire(error)


class GrpcCall:
    """One gRPC call as a ``CallStream``."""

    def __init__(self, spec: pb.MethodSpec, responses: Any, single: Any = None) -> None:
        self.spec = spec
        self._responses = responses
        self._single = single
        self._requests: queue.Queue[Any] | None = None
        self._done = False

    def receive(self) -> tuple[Any, ...]:
        if self._done:
            raise ApiError("FAILED_PRECONDITION", "this call already ended", "backend_failure", 1)
        if self._responses is None:  # unary: the answer is the result
            self._done = True
            return ("result", pb.to_wire(self._single))
        try:
            message = next(self._responses)
        except StopIteration:
            self._done = True
            raise ApiError(
                "UNAVAILABLE", f"{self.spec.name}: the stream ended without a result", "backend_failure", 1
            ) from None
        except grpc.RpcError as err:
            self._done = True
            raise _api_error(err) from None
        which = message.WhichOneof("message")
        if which == "output":
            return ("output", int(message.output.stream), bytes(message.output.data))
        if which == "result":
            self._done = True
        if which is None:
            raise ApiError("UNKNOWN", f"{self.spec.name}: an empty stream message", "backend_failure", 1)
        return (which, pb.to_wire(getattr(message, which)))

    def _put(self, **fields: Any) -> None:
        if self._requests is None:
            raise ApiError("FAILED_PRECONDITION", f"{self.spec.name} takes no input", "user_error", 2)
        self._requests.put(pb.api_pb2.ExecClientMessage(**fields))

    def send(self, stream: int, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), _CHUNK):
            self._put(input=pb.api_pb2.Chunk(stream=stream, data=bytes(view[start : start + _CHUNK])))

    def close_stdin(self) -> None:
        self._put(stdin_close=pb.api_pb2.Empty())

    def resize(self, rows: int, cols: int) -> None:
        self._put(resize=pb.api_pb2.Resize(rows=rows, cols=cols))

    def signal(self, name: str) -> None:
        self._put(signal=pb.api_pb2.Signal(name=name))

    def cancel(self) -> None:
        if self._requests is not None:
            self._put(cancel=pb.api_pb2.Empty())
        elif self._responses is not None:
            self._responses.cancel()

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("a gRPC call has no descriptor to poll; use the local transport")

    def close(self) -> None:
        self._done = True
        if self._responses is not None:
            self._responses.cancel()
        if self._requests is not None:
            self._requests.put(None)


def _request_iterator(first: Any, requests: queue.Queue[Any]) -> Iterator[Any]:
    yield first
    while True:
        item = requests.get()
        if item is None:  # closed (close() cancels the RPC itself; the end of this stream alone is stdin EOF)
            return
        yield item


WINDOWS_UNSUPPORTED = (
    "the typed API (vz.api.v1 over gRPC) is not served on Windows hosts: grpcio has no named-pipe transport "
    'and the daemon opens no TCP port; use the local transport (transport="local", what the vz CLI uses)'
)


class GrpcTransport:
    """vz.api.v1 over gRPC on the daemon's socket (the daemon is started first, as for the local wire)."""

    name = "grpc"

    def __init__(self, home: str | None = None, socket: str | None = None, autostart: bool | None = None) -> None:
        from vz_core.wire import daemon_paths

        self.given_socket = socket
        self.socket = socket or daemon_paths(home).socket
        self.home = home
        self.autostart = autostart
        self._channel: grpc.Channel | None = None
        self._lock = threading.Lock()
        if sys.platform == "win32":
            raise ApiError("UNSUPPORTED", WINDOWS_UNSUPPORTED, "user_error", 2)

    def _ensure(self) -> grpc.Channel:
        with self._lock:
            if self._channel is None:
                # The local wire's connect finds or starts the daemon and checks its version; then gRPC.
                from vz_core.api._transport import LocalTransport

                LocalTransport(self.home, self.given_socket, self.autostart).connect().close()
                self._channel = grpc.insecure_channel(
                    "unix:" + self.socket,
                    options=[
                        ("grpc.max_receive_message_length", _MAX_MESSAGE),
                        ("grpc.max_send_message_length", _MAX_MESSAGE),
                    ],
                )
            return self._channel

    def start(self, method: str, request: Mapping[str, Any], fds: Sequence[int] = ()) -> GrpcCall:
        if fds:
            raise ApiError(
                "INVALID_ARGUMENT",
                "file descriptors cannot travel over gRPC: use the local transport, or pass the bytes",
                "user_error",
                2,
            )
        spec = pb.method(method)
        channel = self._ensure()
        kwargs: dict[str, Any] = {
            "request_serializer": spec.request.SerializeToString,
            "response_deserializer": spec.response.FromString,
        }
        try:
            if spec.client_streaming:
                start = pb.api_pb2.ExecClientMessage(start=pb.from_wire(request, pb.api_pb2.ExecRequest))
                requests: queue.Queue[Any] = queue.Queue()
                stub = channel.stream_stream(spec.path, **kwargs)
                call = GrpcCall(spec, stub(_request_iterator(start, requests)))
                call._requests = requests
                return call
            message = pb.from_wire(request, spec.request)
            if spec.server_streaming:
                return GrpcCall(spec, channel.unary_stream(spec.path, **kwargs)(message))
            return GrpcCall(spec, None, channel.unary_unary(spec.path, **kwargs)(message))
        except grpc.RpcError as err:
            raise _api_error(err) from None

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
