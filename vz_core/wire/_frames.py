"""The local wire between vz clients (the CLI, ``vz_core.api``) and the daemon: one call per Unix connection.

A message is a 4-byte big-endian length ``N`` (``1 <= N <= MAX_MESSAGE``), one kind byte and ``N - 1``
payload bytes:

- kind ``J`` (0x4A): the payload is one UTF-8 JSON object;
- kind ``B`` (0x42): the payload is one stream byte (``STDIN`` 0, ``STDOUT`` 1, ``STDERR`` 2, ``TERMINAL`` 3)
  followed by raw data.

File descriptors ride as ``SCM_RIGHTS`` on the ``sendmsg`` that carries a message's first header byte and
belong to that message (at most ``MAX_FDS``). The receiver reads each header and payload with exact-size
reads, so descriptors can never be attributed to the wrong message; received descriptors are close-on-exec
and owned by whoever received them. Anything malformed raises ``WireError`` naming what was wrong.

Two front ends over the same framing: ``Channel`` (a blocking socket; the CLI's side, standard library only:
this module must not import asyncio, grpc, pydantic or rich) and ``AsyncChannel`` (a non-blocking socket on
the running asyncio loop; the daemon's side, asyncio imported only when it is constructed).

JSON goes through the C accelerator the ``json`` module itself uses (``_json``), with the same settings as
``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)`` and ``json.loads``: importing ``json`` pulls in
``re`` and costs the CLI milliseconds. Anything the accelerator does not take as it is (an error to report, an
interpreter without it) goes to the ``json`` module, so results and error messages are exactly ``json``'s.
"""

from __future__ import annotations

import _socket  # not `socket`: its enums (and `selectors`) cost milliseconds `vz exec` does not have
import os
import sys

from vz_core.platform.fdpass import FD_PASSING, RECVMSG_FLAGS, own_received
from vz_core.wire._exits import BACKEND, KINDS, UNAVAILABLE

TYPE_CHECKING = False  # `typing` itself costs milliseconds on the CLI's hot path
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, Protocol, TypeAlias

    Message: TypeAlias = dict[str, Any] | tuple[int, bytes]
    """A decoded message: a JSON object (kind ``J``) or ``(stream, data)`` (kind ``B``)."""

    class ByteStream(Protocol):
        """What ``Channel`` reads and writes: a connected Unix socket, or a pipe's client end on Windows."""

        def recv(self, n: int, /) -> bytes: ...
        def recv_into(self, buffer: memoryview, /) -> int: ...
        def sendall(self, data: bytes | memoryview, /) -> None: ...
        def fileno(self) -> int: ...
        def close(self) -> None: ...

    if sys.platform == "win32":
        Stream: TypeAlias = ByteStream
    else:
        Stream: TypeAlias = _socket.socket
else:
    Message = dict | tuple

__all__ = [
    "BINARY_CHUNK",
    "KIND_BINARY",
    "KIND_JSON",
    "MAX_FDS",
    "MAX_MESSAGE",
    "STDERR",
    "STDIN",
    "STDOUT",
    "TERMINAL",
    "AsyncChannel",
    "Channel",
    "DaemonError",
    "ErrorObject",
    "Message",
    "WireError",
    "close_fds",
    "decode",
    "encode",
    "encode_binary",
    "encode_json",
    "error_fields",
]

MAX_MESSAGE = 16 * 1024 * 1024
"""Largest ``N`` (kind byte + payload) a message may declare."""
MAX_FDS = 3
"""Most descriptors one message may carry."""
BINARY_CHUNK = 256 * 1024
"""``write`` helpers split data into ``B`` messages of at most this many data bytes."""
KIND_JSON = 0x4A
KIND_BINARY = 0x42
STDIN, STDOUT, STDERR, TERMINAL = 0, 1, 2, 3
_STREAMS = frozenset((STDIN, STDOUT, STDERR, TERMINAL))
_HEADER = 5  # length + kind
_INT = 4  # sizeof(int): one descriptor in SCM_RIGHTS
_PEEK_SIZE = 4


def _json_default(obj: object) -> Any:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


class _ScanContext:
    """What ``_json.make_scanner`` reads of a decoder: ``json.loads``'s defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


def _accelerated() -> tuple[Callable[[Any, int], Any], Callable[[str, int], tuple[Any, int]]] | None:
    """The C encoder and scanner of ``json`` with our settings, or None when this interpreter has no usable one."""
    try:
        import _json

        encoder = _json.make_encoder(None, _json_default, _json.encode_basestring, None, ":", ",", False, False, True)
        scanner = _json.make_scanner(_ScanContext())  # type: ignore[arg-type]
        sample = {"k": ["\u00e9\n", -1, 1.5, None, True, {}]}
        text = '{"k":["\u00e9\\n",-1,1.5,null,true,{}]}'
        if "".join(encoder(sample, 0)) != text or scanner(text, 0) != (sample, len(text)):
            return None
    except Exception:
        return None
    return encoder, scanner


_FAST_JSON = _accelerated()


def _dumps(obj: Mapping[str, Any]) -> str:
    if _FAST_JSON is not None:
        try:
            return "".join(_FAST_JSON[0](obj, 0))
        except Exception:  # json explains it (a circular reference, an object it cannot encode)
            pass
    import json

    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _loads(text: str) -> Any:
    if _FAST_JSON is not None:
        try:
            obj, end = _FAST_JSON[1](text, 0)
        except Exception:  # StopIteration or a parse error: json explains it
            pass
        else:
            if end == len(text):
                return obj
    import json

    return json.loads(text)


def error_fields(error: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a daemon's error object ``E`` (``{"error": E}``), missing or malformed ones given safe defaults.

    The keys are ``code``, ``message``, ``kind``, ``exit_code`` and ``details``: the keyword arguments of
    ``DaemonError`` and ``vz_core.api.ApiError``.
    """
    exit_code = error.get("exit_code")
    details = error.get("details")
    return {
        "code": str(error.get("code") or "UNKNOWN"),
        "message": str(error.get("message") or "the vz daemon reported an error without a message"),
        "kind": str(error.get("kind") or "backend_failure"),
        "exit_code": exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else 1,
        "details": details if isinstance(details, dict) else None,
    }


class ErrorObject:
    """The five fields of the wire's error object ``E`` on an error class, and ``to_wire`` of them."""

    code: str
    message: str
    kind: str
    exit_code: int
    details: dict[str, Any] | None

    def to_wire(self) -> dict[str, Any]:
        """The wire's error object E of this error."""
        return {
            "code": self.code,
            "message": self.message,
            "kind": self.kind,
            "exit_code": self.exit_code,
            "details": self.details,
        }


class DaemonError(ErrorObject, Exception):
    """Talking to the vz daemon failed; carries the wire's error object fields.

    ``code`` is a Runtime Protocol error code name (``UNAVAILABLE``, ``FAILED_PRECONDITION``, ...),
    ``kind``/``exit_code`` what the CLI prints and exits with, ``details`` the RuntimeError mapping or None.
    ``str()`` is the one actionable line. A daemon's ``{"error": E}`` becomes one with ``from_wire``.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "UNAVAILABLE",
        kind: str = KINDS[UNAVAILABLE],
        exit_code: int = UNAVAILABLE,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.kind = kind
        self.exit_code = exit_code
        self.details = details

    @classmethod
    def from_wire(cls, error: Mapping[str, Any]) -> DaemonError:
        """The error a daemon sent as ``{"error": E}`` (missing fields get safe defaults: ``error_fields``)."""
        return cls(**error_fields(error))


class WireError(DaemonError):
    """The peer broke the local wire (bad length, kind, JSON, stream byte or descriptors; early close)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="INTERNAL", kind=KINDS[BACKEND], exit_code=BACKEND)


def close_fds(fds: Sequence[int]) -> None:
    """Close every descriptor in ``fds``, ignoring ones already closed."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def encode_json(obj: Mapping[str, Any]) -> bytes:
    """One ``J`` message (header included) holding ``obj``; ``WireError`` if it is too large."""
    payload = _dumps(obj).encode("utf-8", "surrogateescape")
    n = len(payload) + 1
    if n > MAX_MESSAGE:
        raise WireError(f"a JSON message of {n} bytes is larger than the local wire's limit of {MAX_MESSAGE}")
    return n.to_bytes(4, "big") + b"J" + payload


def encode_binary(stream: int, data: bytes) -> bytes:
    """One ``B`` message (header included) with ``data`` for ``stream``; ``WireError`` if it is too large."""
    if stream not in _STREAMS:
        raise WireError(f"stream {stream!r} is not one of 0 (stdin), 1 (stdout), 2 (stderr), 3 (terminal)")
    n = len(data) + 2
    if n > MAX_MESSAGE:
        raise WireError(f"a binary message of {n} bytes is larger than the local wire's limit of {MAX_MESSAGE}")
    return n.to_bytes(4, "big") + b"B" + bytes((stream,)) + data


def encode(message: Message) -> bytes:
    """The bytes of a ``Message`` (a dict becomes ``J``, ``(stream, data)`` becomes ``B``)."""
    if isinstance(message, dict):
        return encode_json(message)
    stream, data = message
    return encode_binary(stream, data)


def _length(header: bytes) -> int:
    """The ``N`` of a complete header; ``WireError`` when it is out of range."""
    n = int.from_bytes(header[:4], "big")
    if n < 1 or n > MAX_MESSAGE:
        raise WireError(f"a message declared length {n}; the local wire allows 1 to {MAX_MESSAGE} bytes")
    return n


def decode(kind: int, payload: bytes) -> Message:
    """The ``Message`` of one kind byte and its payload; ``WireError`` when either is malformed."""
    if kind == KIND_JSON:
        try:
            obj = _loads(payload.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise WireError(f"a JSON message is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        except ValueError as exc:
            raise WireError(f"a JSON message does not parse: {exc}") from None
        except RecursionError:
            raise WireError("a JSON message nests arrays or objects too deeply to be read") from None
        if not isinstance(obj, dict):
            raise WireError(f"a JSON message must be one object, got {type(obj).__name__}")
        return obj
    if kind == KIND_BINARY:
        if not payload:
            raise WireError("a binary message has no stream byte")
        stream = payload[0]
        if stream not in _STREAMS:
            raise WireError(f"a binary message names stream {stream}; only 0 to 3 exist")
        return (stream, payload[1:])
    shown = chr(kind) if 0x20 < kind < 0x7F else f"0x{kind:02x}"
    raise WireError(f"unknown message kind {shown!r}: only 'J' (JSON) and 'B' (binary) exist")


if sys.platform != "win32":  # SCM_RIGHTS: Windows has no descriptor passing (FD_PASSING is False there)
    _ANCILLARY = _socket.CMSG_SPACE(MAX_FDS * _INT)

    def _fds_from(ancdata: list[tuple[int, int, bytes]], flags: int) -> list[int]:
        fds: list[int] = []
        for level, kind, data in ancdata:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds.extend(
                    int.from_bytes(data[i : i + _INT], sys.byteorder, signed=True)
                    for i in range(0, len(data) - _INT + 1, _INT)
                )
        own_received(fds)
        if flags & _socket.MSG_CTRUNC or len(fds) > MAX_FDS:
            close_fds(fds)
            raise WireError(f"a message carried more than {MAX_FDS} file descriptors")
        return fds

    def _rights(fds: Sequence[int]) -> list[tuple[int, int, bytes]]:
        if len(fds) > MAX_FDS:
            raise WireError(f"a message may carry at most {MAX_FDS} file descriptors, not {len(fds)}")
        if not fds:
            return []
        data = b"".join(int(fd).to_bytes(_INT, sys.byteorder, signed=True) for fd in fds)
        return [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, data)]

    def _recv_header(sock: _socket.socket, n: int) -> tuple[bytes, list[int]]:
        """Up to ``n`` header bytes of one ``recvmsg`` and the descriptors that came with them."""
        data, ancdata, flags, _ = sock.recvmsg(n, _ANCILLARY, _RECV_FLAGS)
        return data, (_fds_from(ancdata, flags) if ancdata else [])

    def _send_with_fds(sock: _socket.socket, data: bytes | memoryview, fds: Sequence[int]) -> int:
        """Send (part of) ``data`` with ``fds`` riding on its first byte; the bytes sent."""
        return sock.sendmsg([data], _rights(fds))

else:

    def _rights(fds: Sequence[int]) -> list[tuple[int, int, bytes]]:
        if fds:
            raise WireError(_NO_FD_PASSING)
        return []


_NO_FD_PASSING = (
    "this host cannot hand file descriptors to another process (no SCM_RIGHTS); the streams are copied "
    "as binary messages instead"
)


def _header_part(header: bytes, fds: list[int], data: bytes, received: list[int]) -> bytes | None:
    """``header`` with the bytes of one read added (the descriptors ``received`` with them added to ``fds``);
    None when the peer closed between messages; ``WireError`` for too many descriptors or a close inside the
    header."""
    if received:
        fds.extend(received)
        if len(fds) > MAX_FDS:
            raise WireError(f"a message carried more than {MAX_FDS} file descriptors")
    if not data:
        if not header:
            return None
        raise WireError("the connection closed in the middle of a message header")
    return header + data


_RECV_FLAGS = RECVMSG_FLAGS


class Channel:
    """The local wire over a blocking connected byte stream (the client side; owns the stream).

    ``sock`` is a connected Unix socket (a ``socket.socket`` or the ``_socket.socket`` it is built on: what
    the CLI's ``connect`` makes), whose messages may carry descriptors; or, with ``fd_passing=False``, any
    stream with ``recv``, ``recv_into``, ``sendall``, ``fileno`` and ``close`` (Windows: the client end of
    the daemon's named pipe, ``vz_core.platform.pipes.PipeStream``), whose messages carry none. The framing
    is the same on both.
    """

    def __init__(self, sock: Stream, *, fd_passing: bool = FD_PASSING) -> None:
        self.sock = sock
        self._fd_passing = fd_passing

    def fileno(self) -> int:
        """The socket's descriptor (for select/poll)."""
        return self.sock.fileno()

    def send(self, message: Message, fds: Sequence[int] = ()) -> None:
        """Send one message; ``fds`` (at most ``MAX_FDS``) ride with its first byte and stay open here."""
        data = encode(message)
        if fds:
            if sys.platform == "win32" or not self._fd_passing:
                raise WireError(_NO_FD_PASSING)
            else:
                sent = _send_with_fds(self.sock, data, fds)
                if sent < len(data):
                    self.sock.sendall(memoryview(data)[sent:])
        else:
            self.sock.sendall(data)

    def write(self, stream: int, data: bytes) -> None:
        """Send ``data`` for ``stream`` as ``B`` messages of at most ``BINARY_CHUNK`` data bytes."""
        view = memoryview(data)
        for start in range(0, len(view), BINARY_CHUNK):
            self.sock.sendall(encode_binary(stream, bytes(view[start : start + BINARY_CHUNK])))

    def _exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if not k:
                raise WireError("the connection closed in the middle of a message")
            got += k
        return bytes(buf)

    def receive(self) -> tuple[Message, list[int]] | None:
        """The next message and the descriptors that came with it; None when the peer closed between messages.

        The caller owns the returned descriptors (close them, or pass them on).
        """
        header = b""
        fds: list[int] = []
        try:
            while len(header) < _HEADER:
                received: list[int] = []
                if sys.platform != "win32" and self._fd_passing:
                    data, received = _recv_header(self.sock, _HEADER - len(header))
                else:
                    data = self.sock.recv(_HEADER - len(header))
                part = _header_part(header, fds, data, received)
                if part is None:
                    close_fds(fds)
                    return None
                header = part
                if len(header) >= 4:  # a bad length is refused at once, not after a kind byte that never comes
                    _length(header)
            n = _length(header)
            payload = self._exact(n - 1) if n > 1 else b""
            return decode(header[4], payload), fds
        except BaseException:
            close_fds(fds)
            raise

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.sock.close()


class AsyncChannel:
    """The local wire over a Unix socket on the running asyncio loop (the daemon side; owns the socket).

    ``send`` calls are serialized (a message is never interleaved with another); one task reads. The byte
    I/O is four methods (``_header_bytes``, ``_exact``, ``_sendall``, ``peek``) that another stream
    overrides (Windows: the daemon's named pipe on the proactor loop, ``vz_core.daemon._pipe``); the framing
    is this class's.
    """

    def __init__(self, sock: _socket.socket) -> None:
        import asyncio

        sock.setblocking(False)
        self.sock = sock
        self._loop = asyncio.get_running_loop()
        self._send_lock = asyncio.Lock()
        self._asyncio = asyncio

    def fileno(self) -> int:
        """The socket's descriptor."""
        return self.sock.fileno()

    async def _ready(self, add: Callable[..., None], remove: Callable[[int], object]) -> None:
        """Wait until the loop's ``add`` (``add_reader``/``add_writer``) fires for the socket."""
        fut: asyncio.Future[None] = self._loop.create_future()
        fd = self.sock.fileno()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        add(fd, ready)
        try:
            await fut
        finally:
            remove(fd)

    async def _readable(self) -> None:
        await self._ready(self._loop.add_reader, self._loop.remove_reader)

    async def _writable(self) -> None:
        await self._ready(self._loop.add_writer, self._loop.remove_writer)

    async def peek(self, n: int = _PEEK_SIZE) -> bytes:
        """The first ``n`` bytes without consuming them (fewer only at EOF); bound it with ``asyncio.timeout``."""
        while True:
            try:
                data = self.sock.recv(n, _socket.MSG_PEEK)
            except BlockingIOError:
                await self._readable()
                continue
            if len(data) >= n or not data:
                return data
            await self._asyncio.sleep(0.005)  # a partial header: the rest is on its way, readiness fires at once

    async def _exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:])
            except BlockingIOError:
                await self._readable()
                continue
            if not k:
                raise WireError("the connection closed in the middle of a message")
            got += k
        return bytes(buf)

    async def _header_bytes(self, n: int) -> tuple[bytes, list[int]]:
        """Up to ``n`` header bytes (``b""`` at EOF) and the descriptors that came with them."""
        while True:
            try:
                if sys.platform != "win32":
                    return _recv_header(self.sock, n)
                return self.sock.recv(n), []
            except BlockingIOError:
                await self._readable()

    async def receive(self) -> tuple[Message, list[int]] | None:
        """Like ``Channel.receive``: the next message and its descriptors, None at a clean close."""
        header = b""
        fds: list[int] = []
        try:
            while len(header) < _HEADER:
                data, received = await self._header_bytes(_HEADER - len(header))
                part = _header_part(header, fds, data, received)
                if part is None:
                    close_fds(fds)
                    return None
                header = part
                if len(header) >= 4:  # a bad length is refused at once, not after a kind byte that never comes
                    _length(header)
            n = _length(header)
            payload = await self._exact(n - 1) if n > 1 else b""
            return decode(header[4], payload), fds
        except BaseException:
            close_fds(fds)
            raise

    async def _sendall(self, data: bytes, fds: Sequence[int]) -> None:
        view = memoryview(data)
        rights = bool(fds)
        if rights and sys.platform == "win32":
            raise WireError(_NO_FD_PASSING)
        while view:
            try:
                if sys.platform != "win32" and rights:
                    sent = _send_with_fds(self.sock, view, fds)
                else:
                    sent = self.sock.send(view)
            except BlockingIOError:
                await self._writable()
                continue
            rights = False  # the descriptors went with the first bytes
            view = view[sent:]

    async def send(self, message: Message, fds: Sequence[int] = ()) -> None:
        """Send one message (awaits the socket: backpressure); ``fds`` stay open here."""
        data = encode(message)
        async with self._send_lock:
            await self._sendall(data, fds)

    async def write(self, stream: int, data: bytes) -> None:
        """Send ``data`` for ``stream`` as ``B`` messages of at most ``BINARY_CHUNK`` data bytes."""
        view = memoryview(data)
        for start in range(0, len(view), BINARY_CHUNK):
            chunk = encode_binary(stream, bytes(view[start : start + BINARY_CHUNK]))
            async with self._send_lock:
                await self._sendall(chunk, ())

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.sock.close()
