"""The daemon's listener: a Unix socket server speaking the local wire, one call per connection.

Per connection, in order: ``SO_PEERCRED`` must name our uid (before a byte is read; anyone else is closed
and logged); a connection whose first bytes are the HTTP/2 client preface goes to the ``http2`` hook (the
gRPC front); otherwise the client's ``hello`` is answered with ours (``busy`` = operations in flight), then
at most one ``call`` runs: ``Daemon.dispatch(call)`` counts it, handles ``System.Shutdown`` and
``Drivers.Connect`` (a warm plugin's gRPC for a client, ``_sessions.serve_driver_connect``) itself and
awaits the handler (``async (Call) -> dict``); the result is sent as ``{"result": ...}`` or the exception as
``{"error": E}`` (``vz_core.daemon._errors.encode_error``) and the connection is closed. A client's
``{"cancel": {}}`` or hangup sets ``call.cancelled`` and cancels the handler's task.

Lifetime: the daemon exits after ``idle_timeout`` seconds with no operation in flight and no connection
(``VZ_DAEMON_IDLE_TIMEOUT``, default 900, 0 = never), on SIGTERM/SIGINT/SIGHUP, on ``System.Shutdown``, or
when its socket file is removed or replaced (checked every few seconds: nobody could reach it any more). Shutdown
stops accepting, cancels Watch-class calls, gives operations ``shutdown_grace`` seconds to finish (then
cancels them), runs the ``on_shutdown`` hooks and removes its socket and pid file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from vz_core.platform.files import NOFOLLOW, socket_path_in
from vz_core.platform.locks import lock_file
from vz_core.wire import (
    PROTOCOL,
    AsyncChannel,
    DaemonError,
    DaemonPaths,
    Message,
    WireError,
    close_fds,
    daemon_paths,
    ensure_private_dir,
    fingerprint,
    proc_start_ticks,
    read_pid_file,
    secure_state_home,
    version,
    write_pid_file,
)

if sys.platform != "win32":
    from vz_core.platform.peer import peer_credentials
    from vz_core.platform.sockets import unix_socket

__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "HTTP2_PREFACE",
    "Call",
    "Daemon",
    "Handler",
    "Http2Hook",
    "idle_timeout_from_env",
    "run_daemon",
]

log = logging.getLogger("vz.daemon")

DEFAULT_IDLE_TIMEOUT = 900.0
IDLE_ENV = "VZ_DAEMON_IDLE_TIMEOUT"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SHUTDOWN_METHOD = "System.Shutdown"
DRIVER_CONNECT_METHOD = "Drivers.Connect"
"""A client's gRPC session with a warm plugin of the daemon (``vz_core.daemon._sessions.serve_driver_connect``):
answered here, next to the service; it counts as an operation while the client holds it open."""
HELLO_TIMEOUT = 10.0
"""A connection that has not said hello by then is closed."""
REPLY_TIMEOUT = 5.0
"""Seconds the error answering malformed input may wait for a client that reads nothing."""
SOCKET_CHECK_INTERVAL = 5.0
"""How often the daemon checks that its socket file is still the one it bound (else nobody can reach it)."""
CALL_TIMEOUT = 60.0
"""A connection that said hello but sent no call by then is closed (it would keep the daemon from idling)."""
WATCH_END_SECONDS = 2.0
"""At shutdown, how long Watch-class calls may take to send their result before they are cancelled."""
if sys.platform == "win32":  # no SIGHUP; a detached daemon has no console to get the others from either
    _SIGNALS: tuple[int, ...] = ()
else:
    _SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_RECEIVE_BUFFER = 4 * 1024 * 1024  # client bytes queued for a handler that is not reading; then reading pauses

Handler = Callable[["Call"], Awaitable[dict[str, Any]]]
"""A call's handler: returns the result object or raises (the error is encoded for the client)."""
Http2Hook = Callable[[socket.socket, bytes], Awaitable[None]]
"""Takes an accepted HTTP/2 connection (``prefix`` = bytes already read from it: none, the preface was
peeked) and serves it until either side closes; it owns the socket."""


def _is_operation(method: str) -> bool:
    """Whether calls of ``method`` count as Machine operations (the idle timer, ``busy``, shutdown's wait): every
    method but the passive ones of the method table (``vz_core.wire.METHODS``; an unknown method counts)."""
    from vz_core.wire import METHODS

    known = METHODS.get(method)
    return known is None or not known.passive


def idle_timeout_from_env(environ: dict[str, str] | None = None) -> float:
    """``VZ_DAEMON_IDLE_TIMEOUT`` in seconds (default 900; 0 = never); ``DaemonError`` if it is not a number."""
    raw = (os.environ if environ is None else environ).get(IDLE_ENV, "").strip()
    if not raw:
        return DEFAULT_IDLE_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also catches nan
        raise DaemonError(
            f"{IDLE_ENV}={raw!r} is not a number of seconds >= 0 (0 = never exit when idle)",
            code="INVALID_ARGUMENT",
            kind="user_error",
            exit_code=2,
        )
    return value


class Call:
    """One call from a client, as a handler sees it (the gRPC front builds an equivalent one, without fds).

    ``fds`` belong to the call: the server closes them after the handler returns (``os.dup`` to keep one).
    ``progress``/``event``/``write`` send to the client and await the socket (backpressure); ``receive``
    returns the client's next message (a dict such as ``{"stdin_close": {}}``, ``{"resize": ...}``,
    ``{"signal": ...}``, or ``(stream, data)`` for ``B`` input), None once the client closed.
    ``cancelled`` is set when the client sent ``{"cancel": {}}`` or hung up.
    """

    def __init__(
        self,
        method: str,
        request: dict[str, Any],
        *,
        fds: Sequence[int] = (),
        peer_pid: int | None = None,
        channel: AsyncChannel | None = None,
    ) -> None:
        self.method = method
        self.request = request
        self.fds: list[int] = list(fds)
        self.peer_pid = peer_pid
        self.cancelled = asyncio.Event()
        self.cancel_reason: str | None = None
        """Why ``cancelled`` was set by the listener (a ``cancel`` message), or None for a hangup."""
        self.started = time.time()
        self.wire_error: WireError | None = None
        """Malformed input from the client during the call: the call is cancelled and this is its answer."""
        self._channel = channel
        self._inbox: asyncio.Queue[Message | None] = asyncio.Queue()
        self._queued = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._closed = False

    @property
    def is_operation(self) -> bool:
        """Whether this call counts as a Machine operation for the idle timer and ``busy``."""
        return _is_operation(self.method)

    async def _send(self, message: Message) -> None:
        if self._channel is None:
            raise ConnectionError(f"{self.method}: this call has no client connection to send to")
        await self._channel.send(message)

    async def progress(self, progress: dict[str, Any]) -> None:
        """Send ``{"progress": progress}``."""
        await self._send({"progress": progress})

    async def event(self, event: dict[str, Any]) -> None:
        """Send ``{"event": event}``."""
        await self._send({"event": event})

    async def write(self, stream: int, data: bytes) -> None:
        """Send ``data`` on ``stream`` (1 stdout, 2 stderr, 3 terminal) as ``B`` messages."""
        if self._channel is None:
            raise ConnectionError(f"{self.method}: this call has no client connection to send to")
        await self._channel.write(stream, data)

    async def receive(self) -> dict[str, Any] | tuple[int, bytes] | None:
        """The client's next message; None when the client closed (and on every call after that)."""
        if self._closed:
            return None
        message = await self._inbox.get()
        if message is None:
            self._closed = True
            return None
        if isinstance(message, tuple):
            self._queued -= len(message[1])
            if self._queued <= _RECEIVE_BUFFER:
                self._drained.set()
        return message

    async def _deliver(self, message: Message | None) -> None:
        if isinstance(message, tuple):
            self._queued += len(message[1])
            self._inbox.put_nowait(message)
            if self._queued > _RECEIVE_BUFFER:
                self._drained.clear()
                await self._drained.wait()
            return
        self._inbox.put_nowait(message)

    def close_fds(self) -> None:
        """Close the call's descriptors (the server does this after the handler returns)."""
        fds, self.fds = self.fds, []
        close_fds(fds)


def _fallback_encode_error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, DaemonError):
        return exc.to_wire()
    if isinstance(exc, asyncio.CancelledError):
        return {"code": "CANCELLED", "message": "cancelled", "kind": "interrupted", "exit_code": 130, "details": None}
    return {
        "code": "UNKNOWN",
        "message": f"internal error in the vz daemon: {type(exc).__name__} (see `vz daemon logs`)",
        "kind": "backend_failure",
        "exit_code": 1,
        "details": None,
    }


def _encode_error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, DaemonError):
        return exc.to_wire()
    try:
        from vz_core.daemon._errors import encode_error
    except ImportError:
        return _fallback_encode_error(exc)
    try:
        return encode_error(exc)
    except Exception:  # a broken encoder must not lose the error: the client gets the generic one
        log.exception("encoding an error failed")
        return _fallback_encode_error(exc)


if sys.platform != "win32":

    def _peer(sock: socket.socket) -> tuple[int, int, int]:
        return peer_credentials(sock)


class Daemon:
    """One vz daemon: the listener, its connections, operation accounting, idle exit and shutdown.

    ``handler`` serves every call the server does not handle itself (``System.Shutdown``). ``on_shutdown``
    hooks run once, after the running calls ended, before the socket and pid file are removed. The identity
    (``version``/``fingerprint``) defaults to this installation's. ``handle_signals``: SIGTERM, SIGINT and
    SIGHUP shut it down (needs the main thread).
    """

    def __init__(
        self,
        paths: DaemonPaths,
        handler: Handler,
        *,
        idle_timeout: float | None = None,
        shutdown_grace: float = 10.0,
        on_shutdown: Iterable[Callable[[], Awaitable[None]]] = (),
        http2: Http2Hook | None = None,
        daemon_version: str | None = None,
        daemon_fingerprint: str | None = None,
        handle_signals: bool = True,
    ) -> None:
        self.paths = paths
        self.handle_signals = handle_signals
        self.handler = handler
        self.idle_timeout = idle_timeout_from_env() if idle_timeout is None else idle_timeout
        self.shutdown_grace = shutdown_grace
        self.on_shutdown: list[Callable[[], Awaitable[None]]] = list(on_shutdown)
        self.on_stopping: list[Callable[[], object]] = []
        """Called first when the daemon stops, before any call is cancelled (the service ends its watches)."""
        self.http2 = http2
        self.version = daemon_version or version()
        self.fingerprint = daemon_fingerprint or fingerprint(of_version=self.version)
        self.pid = os.getpid()
        self.started = datetime.now(UTC)
        self._started_monotonic = time.monotonic()
        self._listener: socket.socket | None = None
        self._socket_id: tuple[int, int] | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._calls: set[Call] = set()
        self._call_tasks: dict[Call, asyncio.Task[dict[str, Any]]] = {}
        self._idle_handle: asyncio.TimerHandle | None = None
        self._stop: asyncio.Event | None = None
        self._stop_reason = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.redactor: Callable[[], Any] | None = None
        """Gives the ``vz_core.redact.Redactor`` holding every secret the service learned (for the log)."""

    # ---- accounting ---------------------------------------------------------------------------------------

    @property
    def operations(self) -> list[Call]:
        """The Machine operations in flight."""
        return [c for c in self._calls if c.is_operation]

    @property
    def busy(self) -> bool:
        """Whether a Machine operation is in flight."""
        return any(c.is_operation for c in self._calls)

    def status(self) -> dict[str, Any]:
        """The daemon's own part of ``System.Status`` (the service adds its plugins)."""
        return {
            "pid": self.pid,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "socket": self.paths.socket,
            "home": self.paths.home,
            "started": self.started.isoformat(timespec="seconds"),
            "uptime_seconds": round(time.monotonic() - self._started_monotonic, 3),
            "busy": self.busy,
            "connections": len(self._connections),
            "idle_timeout": self.idle_timeout,
            "operations": [
                {
                    "method": c.method,
                    "started": datetime.fromtimestamp(c.started, UTC).isoformat(timespec="seconds"),
                    "peer_pid": c.peer_pid,
                    "environment": c.request.get("environment"),
                }
                for c in sorted(self.operations, key=lambda c: c.started)
            ],
        }

    def _activity_changed(self) -> None:
        if self._loop is None or self._stop is None or self._stop.is_set():
            return
        idle = not self._connections and not self._calls
        if not idle or not self.idle_timeout:
            if self._idle_handle is not None:
                self._idle_handle.cancel()
                self._idle_handle = None
            return
        if self._idle_handle is None:
            self._idle_handle = self._loop.call_later(self.idle_timeout, self._idle_expired)

    def _idle_expired(self) -> None:
        self._idle_handle = None
        if not self._connections and not self._calls:
            self.request_shutdown(f"idle for {self.idle_timeout:g} s with no operation in flight")

    def request_shutdown(self, reason: str) -> None:
        """Begin a graceful shutdown (idempotent; ``serve`` returns when it is done)."""
        if self._stop is not None and not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()

    # ---- calls --------------------------------------------------------------------------------------------

    async def dispatch(self, call: Call) -> dict[str, Any]:
        """Run ``call``: counted while it runs; ``System.Shutdown`` is answered here; else the handler's result."""
        self._calls.add(call)
        self._activity_changed()
        try:
            if call.method == SHUTDOWN_METHOD:
                self.request_shutdown(f"System.Shutdown from pid {call.peer_pid}")
                operations = len(self.operations)
                return {"pid": self.pid, "operations": operations, "stopping": True, "busy": operations > 0}
            if call.method == DRIVER_CONNECT_METHOD:
                from vz_core.daemon._sessions import serve_driver_connect

                return await serve_driver_connect(call)
            return await self.handler(call)
        finally:
            self._calls.discard(call)
            self._activity_changed()

    async def _read_client(self, channel: AsyncChannel, call: Call, task: asyncio.Task[dict[str, Any]]) -> None:
        """Feed the call's inbox; a cancel message or the client's hangup cancels the call."""
        try:
            while True:
                got = await channel.receive()
                if got is None:
                    break
                message, fds = got
                if fds:
                    close_fds(fds)
                    raise WireError("descriptors may only come with the call message")
                if isinstance(message, dict) and "cancel" in message:
                    call.cancel_reason = "cancelled by the client"
                    call.cancelled.set()
                    task.cancel()
                    continue
                await call._deliver(message)
        except WireError as exc:
            log.warning("%s from pid %s: %s", call.method, call.peer_pid, exc)
            call.wire_error = exc
        except OSError as exc:
            log.warning("%s from pid %s: %s", call.method, call.peer_pid, exc)
        call.cancelled.set()
        await call._deliver(None)
        task.cancel()

    async def _run_call(self, channel: AsyncChannel, call: Call) -> None:
        task = asyncio.ensure_future(self.dispatch(call))
        self._call_tasks[call] = task
        reader = asyncio.ensure_future(self._read_client(channel, call, task))
        try:
            try:
                result = await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():  # the connection's task was cancelled (shutdown): cancel the call
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                    raise
                reply: dict[str, Any] = {"error": _encode_error(asyncio.CancelledError())}
                from vz_core.daemon._errors import cancelled_message

                reply["error"]["message"] = cancelled_message(call.method, call.cancel_reason)
            except Exception as exc:
                reply = {"error": _encode_error(exc)}
                if isinstance(exc, DaemonError) or _is_vz_error(exc) or isinstance(getattr(exc, "error", None), dict):
                    # an understood failure (the service's CallFailed carries its encoded error): one line
                    log.info("%s from pid %s failed: %s", call.method, call.peer_pid, reply["error"].get("message"))
                else:  # a bug: the traceback stays here, the client gets one line
                    log.error("%s from pid %s failed", call.method, call.peer_pid, exc_info=exc)
            else:
                if not isinstance(result, dict):
                    log.error("%s: the handler returned %s, not a dict", call.method, type(result).__name__)
                    reply = {"error": _encode_error(TypeError("the handler returned no result object"))}
                else:
                    reply = {"result": result}
            if call.wire_error is not None:  # the client broke the wire: that is what it is told
                reply = {"error": call.wire_error.to_wire()}
            with contextlib.suppress(OSError, WireError):  # a client that hung up gets nothing
                await channel.send(reply)
        finally:
            self._call_tasks.pop(call, None)
            call.close_fds()
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader

    if sys.platform != "win32":

        async def _serve_connection(self, sock: socket.socket) -> None:
            handed = False
            try:
                pid, uid, _ = _peer(sock)
                if uid != os.geteuid():
                    log.warning(
                        "refused a connection from uid %d (pid %d): only uid %d may use it", uid, pid, os.geteuid()
                    )
                    return
                channel = AsyncChannel(sock)
                async with asyncio.timeout(HELLO_TIMEOUT):  # not wait_for: no task per step (B7)
                    first = await channel.peek(4)
                if first == HTTP2_PREFACE[:4]:
                    if self.http2 is None:
                        log.warning("an HTTP/2 (gRPC) connection from pid %d: no gRPC front runs; closed", pid)
                        return
                    handed = True  # the hook owns the socket from here
                    await self.http2(sock, b"")
                    return
                await self._local(channel, pid)
            except WireError as exc:
                # Malformed input (docs/daemon.md): the client is told what was wrong, then the connection ends.
                log.warning("connection dropped: %s", exc)
                with contextlib.suppress(OSError, WireError, TimeoutError):
                    async with asyncio.timeout(REPLY_TIMEOUT):
                        await AsyncChannel(sock).send({"error": exc.to_wire()})
            except (OSError, TimeoutError) as exc:
                log.warning("connection dropped: %s", exc)
            finally:
                if not handed:
                    sock.close()

    if sys.platform == "win32":

        async def _serve_pipe(self, pipe: Any, own_sid: str) -> None:
            """Windows: one connected instance of the daemon's pipe (the client's SID checked before any read)."""
            from vz_core.daemon._pipe import AsyncPipeChannel, admit

            channel = AsyncPipeChannel(pipe)
            try:
                pid, refusal = admit(pipe, own_sid)
                if refusal is not None:
                    log.warning(
                        "refused a connection on %s: %s; only %s may use it", self.paths.socket, refusal, own_sid
                    )
                    return
                await self._local(channel, pid)
            except WireError as exc:
                log.warning("connection dropped: %s", exc)
                with contextlib.suppress(OSError, WireError, TimeoutError):
                    async with asyncio.timeout(REPLY_TIMEOUT):
                        await channel.send({"error": exc.to_wire()})
            except (OSError, TimeoutError) as exc:
                log.warning("connection dropped: %s", exc)
            finally:
                channel.close()

    async def _local(self, channel: AsyncChannel, pid: int) -> None:
        async with asyncio.timeout(HELLO_TIMEOUT):
            got = await channel.receive()
        if got is None:
            return
        message, fds = got
        close_fds(fds)
        hello = message.get("hello") if isinstance(message, dict) else None
        if not isinstance(hello, dict):
            await channel.send({"error": WireError('the first message must be {"hello": {...}}').to_wire()})
            return
        if hello.get("protocol") != PROTOCOL:
            error = DaemonError(
                f"this vz daemon speaks local protocol {PROTOCOL}, the client {hello.get('protocol')!r}; "
                "use the vz that started it or stop it with `vz daemon stop`",
                code="FAILED_PRECONDITION",
                kind="user_error",
                exit_code=2,
            )
            await channel.send({"error": error.to_wire()})
            return
        await channel.send(
            {
                "hello": {
                    "protocol": PROTOCOL,
                    "version": self.version,
                    "fingerprint": self.fingerprint,
                    "pid": self.pid,
                    "busy": self.busy,
                }
            }
        )
        async with asyncio.timeout(CALL_TIMEOUT):
            got = await channel.receive()
        if got is None:
            return
        message, fds = got
        spec = message.get("call") if isinstance(message, dict) else None
        method = spec.get("method") if isinstance(spec, dict) else None
        request = spec.get("request", {}) if isinstance(spec, dict) else None
        if not isinstance(method, str) or not method or not isinstance(request, dict):
            close_fds(fds)
            error = WireError('expected {"call": {"method": "<Service.Method>", "request": {...}}}')
            await channel.send({"error": error.to_wire()})
            return
        if self._stop is not None and self._stop.is_set() and method != SHUTDOWN_METHOD:
            close_fds(fds)
            error = DaemonError("the vz daemon is shutting down; run the command again (a new one starts)")
            await channel.send({"error": error.to_wire()})
            return
        call = Call(method, request, fds=fds, peer_pid=pid, channel=channel)
        await self._run_call(channel, call)

    # ---- listening ----------------------------------------------------------------------------------------

    if sys.platform != "win32":

        def _bind(self) -> socket.socket:
            ensure_private_dir(self.paths.directory)
            if self.paths.socket_dir != self.paths.directory:
                ensure_private_dir(self.paths.socket_dir)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.paths.socket)  # stale: the caller holds daemon.lock, no other daemon lives
            sock = unix_socket()
            try:
                dir_fd = os.open(self.paths.socket_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    # Linux: through the checked directory's descriptor (no path race, no 108-byte sun_path limit).
                    sock.bind(socket_path_in(dir_fd, self.paths.socket))
                finally:
                    os.close(dir_fd)
                os.chmod(self.paths.socket, 0o600)
                st = os.stat(self.paths.socket)
                self._socket_id = (st.st_dev, st.st_ino)
                sock.listen(128)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
            return sock

    def _unlink_own(self, path: str, ident: tuple[int, int] | None) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        if ident is None or (st.st_dev, st.st_ino) == ident:
            with contextlib.suppress(OSError):
                os.unlink(path)

    if sys.platform != "win32":

        async def _accept_loop(self, listener: socket.socket) -> None:
            loop = asyncio.get_running_loop()
            while True:
                conn, _ = await loop.sock_accept(listener)
                conn.set_inheritable(False)
                task = asyncio.ensure_future(self._serve_connection(conn))
                self._connections.add(task)
                self._activity_changed()
                task.add_done_callback(self._connection_done)

    if sys.platform == "win32":

        async def _accept_pipe_loop(self, listener: Any) -> None:
            """Windows: accept clients of the daemon's named pipe (``vz_core.daemon._pipe.PipeListener``)."""
            while True:
                pipe = await listener.accept()
                task = asyncio.ensure_future(self._serve_pipe(pipe, listener.own_sid))
                self._connections.add(task)
                self._activity_changed()
                task.add_done_callback(self._connection_done)

    async def _watch_socket(self) -> None:
        """Shut down once the socket file is gone or replaced (its directory deleted, say): unreachable."""
        while True:
            await asyncio.sleep(SOCKET_CHECK_INTERVAL)
            try:
                st = os.stat(self.paths.socket)
                ours = (st.st_dev, st.st_ino) == self._socket_id
            except OSError:
                ours = False
            if not ours:
                self.request_shutdown(f"its socket {self.paths.socket} was removed or replaced")
                return

    def _connection_done(self, task: asyncio.Task[None]) -> None:
        self._connections.discard(task)
        self._activity_changed()

    async def serve(self, ready: Callable[[], None] | None = None) -> str:
        """Listen and serve until shutdown; ``ready`` is called once the socket accepts. Returns the reason."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if sys.platform == "win32":
            return await self._serve_pipe_endpoint(ready)
        listener = self._bind()
        self._listener = listener
        try:
            write_pid_file(
                self.paths,
                {
                    "pid": self.pid,
                    "version": self.version,
                    "fingerprint": self.fingerprint,
                    "socket": self.paths.socket,
                    "started": self.started.isoformat(timespec="seconds"),
                    "proc_start": proc_start_ticks(self.pid),
                },
            )
            for sig in _SIGNALS if self.handle_signals else ():
                self._loop.add_signal_handler(sig, self.request_shutdown, f"signal {signal.Signals(sig).name}")
            accept = asyncio.ensure_future(self._accept_loop(listener))
            watch = asyncio.ensure_future(self._watch_socket())
            log.info(
                "vz daemon %s (pid %d) listening on %s; idle timeout %s",
                self.version,
                self.pid,
                self.paths.socket,
                f"{self.idle_timeout:g} s" if self.idle_timeout else "never",
            )
            self._activity_changed()
            if ready is not None:
                ready()
            await self._stop.wait()
            log.info("shutting down: %s", self._stop_reason)
            accept.cancel()
            watch.cancel()
            with contextlib.suppress(BaseException):
                await accept
            with contextlib.suppress(BaseException):
                await watch
            listener.close()
            self._unlink_own(self.paths.socket, self._socket_id)
            await self._drain()
            for hook in self.on_shutdown:
                try:
                    await hook()
                except Exception:
                    log.exception("a shutdown hook failed")
        finally:
            for sig in _SIGNALS if self.handle_signals else ():
                with contextlib.suppress(Exception):
                    self._loop.remove_signal_handler(sig)
            if self._idle_handle is not None:
                self._idle_handle.cancel()
            listener.close()
            self._unlink_own(self.paths.socket, self._socket_id)
            self._remove_pid_file()
        log.info("stopped")
        return self._stop_reason

    def _pid_record(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "socket": self.paths.socket,
            "started": self.started.isoformat(timespec="seconds"),
            "proc_start": proc_start_ticks(self.pid),
        }

    if sys.platform == "win32":

        async def _serve_pipe_endpoint(self, ready: Callable[[], None] | None) -> str:
            """Windows: ``serve`` on the daemon's named pipe (no socket file to watch: the name lives as long as
            one of its instances, all of them ours)."""
            from vz_core.daemon._pipe import PipeListener

            assert self._stop is not None
            ensure_private_dir(self.paths.directory)
            listener = PipeListener(self.paths.socket)
            try:
                write_pid_file(self.paths, self._pid_record())
                accept = asyncio.ensure_future(self._accept_pipe_loop(listener))
                log.info(
                    "vz daemon %s (pid %d) listening on %s; idle timeout %s",
                    self.version,
                    self.pid,
                    self.paths.socket,
                    f"{self.idle_timeout:g} s" if self.idle_timeout else "never",
                )
                self._activity_changed()
                if ready is not None:
                    ready()
                await self._stop.wait()
                log.info("shutting down: %s", self._stop_reason)
                accept.cancel()
                with contextlib.suppress(BaseException):
                    await accept
                listener.close()
                await self._drain()
                for hook in self.on_shutdown:
                    try:
                        await hook()
                    except Exception:
                        log.exception("a shutdown hook failed")
            finally:
                if self._idle_handle is not None:
                    self._idle_handle.cancel()
                listener.close()
                self._remove_pid_file()
            log.info("stopped")
            return self._stop_reason

    async def _drain(self) -> None:
        """End Watch-class calls now (the ``on_stopping`` hooks let them send their result; those still running
        after a moment are cancelled), let operations finish within the grace period, then cancel the rest."""
        for stopping in self.on_stopping:
            try:
                stopping()
            except Exception:
                log.exception("a stopping hook failed")
        watches = [t for c, t in self._call_tasks.items() if not c.is_operation]
        if watches and self.on_stopping:
            await asyncio.wait(watches, timeout=WATCH_END_SECONDS)
        for call, task in list(self._call_tasks.items()):
            if not call.is_operation and not task.done():
                call.cancel_reason = "the daemon is stopping"
                call.cancelled.set()
                task.cancel()
        if self.operations:
            log.info("waiting up to %g s for %d operation(s) in flight", self.shutdown_grace, len(self.operations))
        pending = [t for c, t in self._call_tasks.items() if c.is_operation]
        if pending:
            _, still = await asyncio.wait(pending, timeout=self.shutdown_grace)
            for task in still:
                task.cancel()
        if self._connections:
            _, still_conns = await asyncio.wait(list(self._connections), timeout=2.0)
            for conn_task in still_conns:
                conn_task.cancel()
            if still_conns:
                await asyncio.wait(still_conns, timeout=2.0)

    def _remove_pid_file(self) -> None:
        try:
            record = read_pid_file(self.paths)
            if record is not None and record.get("pid") == self.pid:
                os.unlink(self.paths.pid_file)
        except OSError:
            pass


def _is_vz_error(exc: BaseException) -> bool:
    try:
        from vz_core.errors import VzError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, VzError)


# ---- the daemon process ---------------------------------------------------------------------------------------

LOCK_WAIT = 15.0
"""How long a starting daemon waits for the previous one (still shutting down) to release ``daemon.lock``."""


def _take_lifetime_lock(paths: DaemonPaths) -> int:
    fd = os.open(paths.lock_file, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        if lock_file(fd, blocking=False):
            return fd
        else:
            if time.monotonic() > deadline:
                os.close(fd)
                raise DaemonError(
                    f"another vz daemon for {paths.home} still holds {paths.lock_file} after {LOCK_WAIT:g} s; "
                    "stop it with `vz daemon stop`",
                    code="FAILED_PRECONDITION",
                    kind="conflict",
                    exit_code=4,
                ) from None
            time.sleep(0.02)


async def _fallback_handler(daemon: Daemon, call: Call) -> dict[str, Any]:
    if call.method == "System.Status":
        return daemon.status()
    raise DaemonError(
        f"this vz daemon serves no {call.method}: its service is not installed (see `vz daemon logs`)",
        code="UNSUPPORTED",
        kind="backend_failure",
        exit_code=1,
    )


def _optional_module(name: str) -> Any:
    """The module ``name``, or None when it does not exist (yet): the service and gRPC front are optional."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise  # the module exists but one of its own imports is missing: a real error
        log.warning("%s is not installed: serving without it", name)
        return None


async def _install_service(daemon: Daemon) -> None:
    """Give ``daemon`` the service's handler and the gRPC front, when those modules exist."""
    service_module = _optional_module("vz_core.daemon._service")
    if service_module is not None:
        service = service_module.Service(
            on_shutdown=lambda: daemon.request_shutdown("System.Shutdown"),
            version=daemon.version,
            fingerprint=daemon.fingerprint,
            daemon_status=daemon.status,
        )
        await service.start()
        daemon.handler = service.dispatch
        daemon.redactor = lambda: getattr(service, "redactor", None)
        daemon.on_shutdown.append(service.close)
        daemon.on_stopping.append(service.stopping)
    front = _LazyGrpcFront(daemon)
    daemon.http2 = front.handle
    daemon.on_shutdown.insert(0, front.close)


class _LazyGrpcFront:
    """The gRPC front, imported and started on the first HTTP/2 connection (grpc and the vz.api.v1 stubs
    cost a few hundred ms: a daemon that only the CLI uses never pays for them)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.front: Any = None
        self.missing = False
        self._lock = asyncio.Lock()

    async def handle(self, sock: socket.socket, prefix: bytes) -> None:
        async with self._lock:
            if self.front is None and not self.missing:
                module = _optional_module("vz_core.daemon._grpc")
                if module is None:
                    self.missing = True
                else:
                    front = module.GrpcFront(dispatch=self.daemon.dispatch, directory=self.daemon.paths.directory)
                    await front.start()
                    self.front = front
                    log.info("gRPC front started")
        if self.front is None:
            sock.close()
            log.warning("an HTTP/2 (gRPC) connection: this installation has no gRPC front; closed")
            return
        await self.front.handle(sock, prefix)

    async def close(self) -> None:
        if self.front is not None:
            await self.front.close()


def run_daemon(
    paths: DaemonPaths | None = None,
    handler: Handler | None = None,
    *,
    ready_fd: int | None = None,
    stdio_to_log: bool = False,
    echo: bool = False,
    idle_timeout: float | None = None,
    daemon_version: str | None = None,
    daemon_fingerprint: str | None = None,
) -> int:
    """Run a daemon in this process until it shuts down; the exit status (0, or 1/2/4 when it cannot start).

    ``paths`` default to the state home's (``VZ_HOME``). ``handler`` None = the daemon service
    (``vz_core.daemon._service.create_service``) when installed. ``ready_fd``: a pipe that gets one line,
    ``ready <pid>`` once the socket accepts or ``error <message>``, then is closed. ``stdio_to_log``: fds 1
    and 2 are moved to the log (a detached daemon). ``echo``: the log also goes to stderr (the foreground).
    """
    from vz_core.daemon._log import setup_logging
    from vz_core.wire import open_socket as _open_socket

    def tell(line: str) -> None:
        nonlocal ready_fd
        if ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(ready_fd, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
                os.close(ready_fd)
            ready_fd = None

    running: list[Daemon] = []

    def log_redactor() -> Any:
        source = running[0].redactor if running else None
        return source() if source is not None else None

    lock_fd = -1
    try:
        paths = paths if paths is not None else daemon_paths()
        ensure_private_dir(paths.directory)
        secure_state_home(paths.home)
        setup_logging(paths.log_file, stdio=stdio_to_log, echo=echo, redactor=log_redactor)
        sock = _open_socket(paths)
        if sock is not None:
            sock.close()
            raise DaemonError(
                f"a vz daemon already runs for {paths.home} (socket {paths.socket}); `vz daemon status` shows it",
                code="ALREADY_EXISTS",
                kind="conflict",
                exit_code=4,
            )
        lock_fd = _take_lifetime_lock(paths)
        idle = idle_timeout_from_env() if idle_timeout is None else idle_timeout
    except DaemonError as exc:
        tell(f"error {exc}")
        _stderr(f"vz daemon: error: {exc}")
        return exc.exit_code if exc.exit_code != 69 else 1

    async def main() -> str:
        daemon = Daemon(
            paths,
            handler or (lambda call: _fallback_handler(daemon, call)),
            idle_timeout=idle,
            daemon_version=daemon_version,
            daemon_fingerprint=daemon_fingerprint,
        )
        running.append(daemon)
        if handler is None:
            await _install_service(daemon)
        return await daemon.serve(ready=lambda: tell(f"ready {os.getpid()}"))

    try:
        asyncio.run(main())
    except DaemonError as exc:
        tell(f"error {exc}")
        log.error("%s", exc)
        return exc.exit_code if exc.exit_code != 69 else 1
    except Exception as exc:
        tell(f"error {type(exc).__name__}: {exc}")
        log.exception("the daemon failed")
        return 1
    finally:
        os.close(lock_fd)
    return 0


def _stderr(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode("utf-8", "replace"))
