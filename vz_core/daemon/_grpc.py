"""The daemon's gRPC front: vz.api.v1 served on the daemon's socket next to the local wire.

The listener (``vz_core.daemon._server``) sniffs the HTTP/2 client preface on each accepted connection and hands
such connections to ``GrpcFront.handle``, which proxies the bytes to a grpc.aio server listening on a private
Unix socket inside the 0700 daemon directory (``grpc.sock``, mode 0600; nobody else can reach it, and every
connection the listener hands over already passed its peer-uid check).

Every vz.api.v1 method has a generic handler that builds a ``GrpcCall`` (the interface of the local wire's
``vz_core.daemon.Call``: method, request dict, progress/event/write/receive, cancelled; no descriptors) and
awaits the same dispatcher the local wire uses. Requests become dicts with ``vz_core.api.pb.to_wire`` (the
local wire's JSON for them); results and streamed messages become messages with ``from_wire``, which refuses
unknown keys: a mismatch between the .proto and what the service returns fails loudly (as an INTERNAL error
naming the method), never silently drops data. A failed call ends with the gRPC status of its error code and
``grpc-status-details-bin`` holding a ``devsy.runtime.v1.RuntimeError`` and a ``vz.api.v1.ErrorInfo`` (the
local wire's error object).

Exec streams: half-closing the client side (Go's ``CloseSend()``, a finite request iterator) is the end of the
command's input, exactly a ``stdin_close`` message: the command keeps running and its output and result are
still delivered. The RPC's own cancel (or deadline) is a hangup (``receive`` returns None, ``cancelled`` is
set) and kills the command; so does an explicit ``cancel`` message.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message as ProtoMessage

from vz_core.api import pb
from vz_core.daemon._errors import cancelled_message
from vz_core.wire import DaemonError

__all__ = ["GRPC_SOCKET", "Dispatch", "GrpcCall", "GrpcFront"]

log = logging.getLogger("vz.daemon.grpc")

GRPC_SOCKET = "grpc.sock"
"""The private socket's name inside the daemon directory."""
Dispatch = Callable[[Any], Awaitable[dict[str, Any]]]
"""The dispatcher both fronts call: ``await dispatch(call) -> result dict`` (raises on failure)."""
_MAX_MESSAGE = 16 * 1024 * 1024
_CHUNK = 256 * 1024
_SUN_PATH_MAX = 104  # the shortest sun_path among the platforms vz runs on (macOS), minus its NUL
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # the end of a client stream (not in the stubs)


def _encode(exc: BaseException) -> dict[str, Any]:
    """The local wire's error object of ``exc`` (the daemon's one encoder, as the local front uses it)."""
    if isinstance(exc, DaemonError):
        return exc.to_wire()
    from vz_core.daemon._errors import encode_error

    try:
        return encode_error(exc)
    except Exception:  # a broken encoder must not lose the error
        log.exception("encoding an error failed")
        return {
            "code": "UNKNOWN",
            "message": f"internal error in the vz daemon: {type(exc).__name__} (see `vz daemon logs`)",
            "kind": "backend_failure",
            "exit_code": 1,
            "details": None,
        }


class GrpcCall:
    """One gRPC call as the dispatcher sees it: the interface of ``vz_core.daemon.Call`` without descriptors."""

    def __init__(self, spec: pb.MethodSpec, request: dict[str, Any], context: grpc.aio.ServicerContext[Any, Any]):
        self.method = spec.name
        self.request = request
        self.fds: list[int] = []
        self.peer_pid: int | None = None
        self.cancelled = asyncio.Event()
        self.cancel_reason: str | None = None
        """Why ``cancelled`` was set by this front (an Exec ``cancel`` message), or None for a hangup."""
        self.started = time.time()
        self._spec = spec
        self._context = context
        self._inbox: asyncio.Queue[dict[str, Any] | tuple[int, bytes] | None] = asyncio.Queue(maxsize=64)
        self._closed = False
        self._write_lock = asyncio.Lock()  # grpc allows one write in flight per call; senders run concurrently
        fields = spec.response.DESCRIPTOR.fields_by_name
        self._streams = {name for name in ("progress", "event", "output") if name in fields and spec.server_streaming}

    @property
    def is_operation(self) -> bool:
        """Whether this call counts as a Machine operation for the idle timer and ``busy``."""
        return not self._spec.passive

    async def _write(self, field: str, value: Any) -> None:
        if field not in self._streams:
            raise TypeError(f"{self.method} does not stream {field} messages (see protocol/vz/api/v1/api.proto)")
        message = self._spec.response()
        if field == "output":
            stream, data = value
            getattr(message, field).stream = stream
            getattr(message, field).data = data
        else:
            try:
                getattr(message, field).CopyFrom(pb.from_wire(value, type(getattr(message, field))))
            except Exception as exc:
                raise TypeError(f"{self.method}: a {field} message does not fit vz.api.v1: {exc}") from exc
        async with self._write_lock:
            await self._context.write(message)

    async def progress(self, progress: dict[str, Any]) -> None:
        """Send one progress message."""
        await self._write("progress", progress)

    async def event(self, event: dict[str, Any]) -> None:
        """Send one event."""
        await self._write("event", event)

    async def write(self, stream: int, data: bytes) -> None:
        """Send output bytes of ``stream`` (split into messages of at most 256 KiB)."""
        view = memoryview(data)
        for start in range(0, max(len(view), 1), _CHUNK):
            await self._write("output", (stream, bytes(view[start : start + _CHUNK])))

    async def receive(self) -> dict[str, Any] | tuple[int, bytes] | None:
        """The client's next message (``(stream, data)`` or a dict like ``{"stdin_close": {}}``); None once closed."""
        if self._closed:
            return None
        message = await self._inbox.get()
        if message is None:
            self._closed = True
        return message

    def close_fds(self) -> None:
        """Nothing to close: descriptors never travel over gRPC."""


def _client_message(message: ProtoMessage) -> dict[str, Any] | tuple[int, bytes] | str | None:
    """An Exec client message in the local wire's terms; "cancel" for a cancel, None for an unexpected start."""
    which = message.WhichOneof("message")
    if which == "input":
        chunk = message.input  # type: ignore[attr-defined]
        return (int(chunk.stream), bytes(chunk.data))
    if which == "cancel":
        return "cancel"
    if which in ("stdin_close", "resize", "signal"):
        return {which: pb.to_wire(getattr(message, which))}
    return None


if sys.platform != "win32":  # the front sits behind the Unix socket; Windows serves no typed API (docs/daemon.md)

    class GrpcFront:
        """The gRPC server of one daemon (see the module docstring).

        ``dispatch`` is the daemon's dispatcher (``Daemon.dispatch``: it counts calls and answers System.Shutdown);
        ``directory`` is the private daemon directory the socket goes in.
        """

        def __init__(self, dispatch: Dispatch, directory: str | Path) -> None:
            self.dispatch = dispatch
            self.directory = Path(directory)
            self.socket_path = str(self.directory / GRPC_SOCKET)
            self._own_dir: str | None = None
            self._server: grpc.aio.Server | None = None
            self._proxies: set[asyncio.Task[None]] = set()
            self._peers: dict[str, int] = {}  # upstream socket name -> the client's pid
            self._numbers = itertools.count(1)
            self.active = 0
            """Connections being proxied now."""

        # --- lifetime -------------------------------------------------------------------------------------------

        async def start(self) -> None:
            """Serve on the private socket (a stale one of an earlier daemon is replaced)."""
            if len(self.socket_path.encode()) > _SUN_PATH_MAX:
                # Too long for a Unix socket address: a private 0700 directory of our own under the temp dir.
                self._own_dir = tempfile.mkdtemp(prefix="vz-grpc-")
                self.socket_path = os.path.join(self._own_dir, GRPC_SOCKET)
            directory = os.path.dirname(self.socket_path)
            os.makedirs(directory, mode=0o700, exist_ok=True)
            info = os.lstat(directory)
            if info.st_uid != os.geteuid() or info.st_mode & 0o077 or not stat.S_ISDIR(info.st_mode):
                raise DaemonError(
                    f"refusing to serve gRPC in {directory}: it must be a directory of uid {os.geteuid()} with mode "
                    f"0700 (it is uid {info.st_uid}, mode {info.st_mode & 0o777:o})",
                    code="PERMISSION_DENIED",
                    kind="user_error",
                    exit_code=2,
                )
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            server = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", _MAX_MESSAGE),
                    ("grpc.max_send_message_length", _MAX_MESSAGE),
                    ("grpc.so_reuseport", 0),
                ]
            )
            for handler in self._handlers():
                server.add_generic_rpc_handlers((handler,))
            old = os.umask(0o177)
            try:
                try:
                    bound = server.add_insecure_port("unix:" + self.socket_path)
                except RuntimeError:
                    bound = 0
                if bound == 0:
                    raise DaemonError(f"cannot listen for gRPC on {self.socket_path}; see `vz daemon logs`")
                await server.start()
            finally:
                os.umask(old)
            os.chmod(self.socket_path, 0o600)
            self._server = server

        async def close(self, grace: float = 1.0) -> None:
            """Stop serving: running calls are cancelled after ``grace`` seconds (a watch ended by the service's
            ``stopping`` delivers its result first); the socket is removed."""
            if self._server is not None:
                await self._server.stop(grace)
                self._server = None
            for task in list(self._proxies):
                task.cancel()
            if self._proxies:
                await asyncio.wait(list(self._proxies), timeout=2.0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            if self._own_dir is not None:
                shutil.rmtree(self._own_dir, ignore_errors=True)
                self._own_dir = None

        # --- the listener's hook --------------------------------------------------------------------------------

        async def handle(self, sock: Any, prefix: bytes = b"") -> None:
            """Serve one HTTP/2 connection the listener accepted (``prefix``: bytes it already read). Owns ``sock``."""
            task = asyncio.current_task()
            if task is not None:
                self._proxies.add(task)
            self.active += 1
            client_writer: asyncio.StreamWriter | None = None
            server_writer: asyncio.StreamWriter | None = None
            peer_name: str | None = None
            try:
                sock.setblocking(False)
                peer_pid = _peer_pid(sock)
                client_reader, client_writer = await asyncio.open_unix_connection(sock=sock)
                upstream, peer_name = await self._connect_as(peer_pid)
                server_reader, server_writer = await asyncio.open_unix_connection(sock=upstream)
                if prefix:
                    server_writer.write(prefix)
                await asyncio.gather(
                    _pump(client_reader, server_writer),
                    _pump(server_reader, client_writer),
                )
            except (OSError, asyncio.IncompleteReadError) as exc:
                log.info("gRPC connection ended: %s", exc)
            finally:
                self.active -= 1
                for writer in (client_writer, server_writer):
                    if writer is not None:
                        writer.close()
                if client_writer is None:
                    sock.close()
                if task is not None:
                    self._proxies.discard(task)
                if peer_name is not None:
                    self._peers.pop(peer_name, None)

        async def _connect_as(self, peer_pid: int | None) -> tuple[socket.socket, str | None]:
            """A connection to the gRPC server bound to a name of its own, so calls on it know the client's pid
            (``context.peer()`` is ``unix:<that name>``; the name is unlinked at once, the socket keeps it)."""
            name = os.path.join(os.path.dirname(self.socket_path), f"p{os.getpid()}-{next(self._numbers)}")
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            named = peer_pid is not None and len(name.encode()) <= _SUN_PATH_MAX
            try:
                upstream.setblocking(False)
                if named:
                    assert peer_pid is not None
                    upstream.bind(name)
                    try:
                        self._peers[name] = peer_pid
                        await asyncio.get_running_loop().sock_connect(upstream, self.socket_path)
                    finally:
                        os.unlink(name)
                else:
                    await asyncio.get_running_loop().sock_connect(upstream, self.socket_path)
            except BaseException:
                self._peers.pop(name, None)
                upstream.close()
                raise
            return upstream, name if named else None

        def peer_pid(self, context: grpc.aio.ServicerContext[Any, Any]) -> int | None:
            """The pid of the client of a call (None when it is unknown)."""
            peer = context.peer() or ""
            return self._peers.get(peer[len("unix:") :]) if peer.startswith("unix:") else None

        # --- handlers -------------------------------------------------------------------------------------------

        def _handlers(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
            by_service: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}
            for spec in pb.METHODS.values():
                service_path, rpc = spec.path[1:].split("/")
                kwargs: dict[str, Any] = {
                    "request_deserializer": spec.request.FromString,
                    "response_serializer": spec.response.SerializeToString,
                }
                handler: grpc.RpcMethodHandler[Any, Any]
                if spec.client_streaming:
                    handler = grpc.stream_stream_rpc_method_handler(self._bidi(spec), **kwargs)
                elif spec.server_streaming:
                    handler = grpc.unary_stream_rpc_method_handler(self._server_stream(spec), **kwargs)
                else:
                    handler = grpc.unary_unary_rpc_method_handler(self._unary(spec), **kwargs)
                by_service.setdefault(service_path, {})[rpc] = handler
            return [grpc.method_handlers_generic_handler(name, rpcs) for name, rpcs in by_service.items()]

        async def _fail(self, context: grpc.aio.ServicerContext[Any, Any], error: dict[str, Any]) -> None:
            try:
                code, message, details = pb.error_to_status(error)
            except Exception as exc:  # an error object that does not fit ErrorInfo: say so, keep the message
                log.error("an error object does not fit vz.api.v1.ErrorInfo: %s", exc)
                code, message, details = pb.error_to_status(
                    {
                        "code": "UNKNOWN",
                        "message": str(error.get("message", "")),
                        "kind": "backend_failure",
                        "exit_code": 1,
                        "details": None,
                    }
                )
            await context.abort(_status_code(code), message, trailing_metadata=(("grpc-status-details-bin", details),))

        async def _run(
            self,
            call: GrpcCall,
            context: grpc.aio.ServicerContext[Any, Any],
            task_hook: Callable[[asyncio.Task[Any]], None],
        ) -> ProtoMessage:
            """Dispatch ``call``; its result as the rpc's result message, or abort with its error."""
            task: asyncio.Task[dict[str, Any]] = asyncio.ensure_future(self.dispatch(call))
            task_hook(task)
            context.add_done_callback(lambda _: _hang_up(call, task))  # type: ignore[arg-type]
            try:
                result = await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():  # the RPC itself was cancelled: cancel the call and wait for it to unwind
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                    raise
                error = _encode(asyncio.CancelledError())
                error["message"] = cancelled_message(call.method, call.cancel_reason)
            except Exception as exc:
                if not isinstance(exc, DaemonError):
                    log.info("%s failed: %s", call.method, exc)
                error = _encode(exc)
            else:
                if not isinstance(result, dict):
                    error = _encode(TypeError(f"{call.method}: the handler returned no result object"))
                else:
                    try:
                        return self._result(call._spec, result)
                    except Exception as exc:
                        log.error("%s: the result does not fit vz.api.v1: %s", call.method, exc)
                        error = {
                            "code": "RUNTIME_FAILURE",
                            "message": f"{call.method}: the daemon's result does not fit vz.api.v1 ({exc}); this is a "
                            "bug in vz (the local wire answers the same call)",
                            "kind": "backend_failure",
                            "exit_code": 1,
                            "details": None,
                        }
            await self._fail(context, error)
            raise AssertionError("unreachable: abort raises")  # pragma: no cover

        @staticmethod
        def _result(spec: pb.MethodSpec, result: dict[str, Any]) -> ProtoMessage:
            if not spec.server_streaming:
                return pb.from_wire(result, spec.response)
            message: Any = spec.response()
            slot = message.result
            slot.CopyFrom(pb.from_wire(result, type(slot)))
            return message  # type: ignore[no-any-return]

        def _unary(self, spec: pb.MethodSpec) -> Callable[..., Awaitable[ProtoMessage]]:
            async def handler(request: ProtoMessage, context: grpc.aio.ServicerContext[Any, Any]) -> ProtoMessage:
                call = GrpcCall(spec, pb.to_wire(request), context)
                call.peer_pid = self.peer_pid(context)
                return await self._run(call, context, lambda _: None)

            return handler

        def _server_stream(self, spec: pb.MethodSpec) -> Callable[..., Awaitable[None]]:
            async def handler(request: ProtoMessage, context: grpc.aio.ServicerContext[Any, Any]) -> None:
                call = GrpcCall(spec, pb.to_wire(request), context)
                call.peer_pid = self.peer_pid(context)
                last = await self._run(call, context, lambda _: None)
                async with call._write_lock:
                    await context.write(last)

            return handler

        def _bidi(self, spec: pb.MethodSpec) -> Callable[..., Awaitable[None]]:
            async def handler(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
                first = await context.read()
                if first is _EOF or first.WhichOneof("message") != "start":
                    await self._fail(context, _invalid(f"{spec.name}: the first message must be start"))
                    return
                request = pb.to_wire(first.start)
                if not request.get("stdio"):
                    request["stdio"] = [False, False, False]
                if any(request["stdio"]):
                    await self._fail(
                        context,
                        _invalid(
                            f"{spec.name}: file descriptors cannot travel over gRPC: send "
                            "stdio [false, false, false] and stream the bytes as messages"
                        ),
                    )
                    return
                call = GrpcCall(spec, request, context)
                call.peer_pid = self.peer_pid(context)
                reader: asyncio.Task[None] | None = None

                def start_reader(task: asyncio.Task[Any]) -> None:
                    nonlocal reader
                    reader = asyncio.ensure_future(_read_client(call, context, task))

                try:
                    last = await self._run(call, context, start_reader)
                    async with call._write_lock:
                        await context.write(last)
                finally:
                    if reader is not None:
                        reader.cancel()
                        with contextlib.suppress(BaseException):
                            await reader

            return handler

    def _peer_pid(sock: socket.socket) -> int | None:
        """The process id of the connection's peer (``vz_core.platform.peer``), or None where it cannot be read."""
        from vz_core.platform.peer import peer_credentials

        try:
            pid = peer_credentials(sock)[0]
        except OSError:
            return None
        return pid or None


def _invalid(message: str) -> dict[str, Any]:
    return {"code": "INVALID_ARGUMENT", "message": message, "kind": "user_error", "exit_code": 2, "details": None}


def _status_code(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN


def _hang_up(call: GrpcCall, task: asyncio.Task[Any]) -> None:
    """The RPC ended (done, cancelled by the client, deadline): the call sees a hangup."""
    call.cancelled.set()
    with contextlib.suppress(asyncio.QueueFull):
        call._inbox.put_nowait(None)
    if not task.done():
        task.cancel()


async def _read_client(call: GrpcCall, context: grpc.aio.ServicerContext[Any, Any], task: asyncio.Task[Any]) -> None:
    """Feed an Exec call's inbox until the client half-closes its side.

    A half-close (Go's ``CloseSend()``, the end of a Python request iterator) is the end of the command's input:
    the command reads end of file on its stdin (as a ``stdin_close`` message would do) and keeps running; its
    output and result still arrive. Only the RPC's own cancel (or deadline), or a ``cancel`` message, cancels the
    call (``_hang_up`` sees the RPC end).
    """
    stdin_closed = False
    try:
        while True:
            message = await context.read()
            if message is _EOF:
                if not stdin_closed:
                    await call._inbox.put({"stdin_close": {}})
                return
            converted = _client_message(message)
            if converted == "cancel":  # the command is killed; the call ends CANCELLED
                call.cancel_reason = "cancelled by the client"
                call.cancelled.set()
                task.cancel()
                return
            if converted is None:
                log.info("%s: a second start message was ignored", call.method)
                continue
            if isinstance(converted, dict) and "stdin_close" in converted:
                if stdin_closed:
                    continue
                stdin_closed = True
            await call._inbox.put(converted)  # type: ignore[arg-type]
    except (grpc.RpcError, asyncio.InvalidStateError, OSError) as exc:
        log.info("%s: the client stream ended: %s", call.method, exc)
        call.cancelled.set()
        await call._inbox.put(None)
        task.cancel()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close the other side."""
    try:
        while True:
            data = await reader.read(256 * 1024)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
