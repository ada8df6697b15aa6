"""Messages with file descriptors over a Unix stream socket, on asyncio (stdlib only).

The framing is the daemon's local wire's (docs/daemon.md): a message is a 4-byte big-endian length ``N``
(1 <= N <= ``MAX_FRAME``), one kind byte and ``N - 1`` payload bytes. Kind ``J`` (0x4A): one UTF-8 JSON
object; kind ``B`` (0x42): a stream byte and raw data. Descriptors ride as SCM_RIGHTS on the ``sendmsg``
carrying a message's first header byte and belong to that message (at most ``MAX_FDS``).

Received descriptors are close-on-exec (``vz_core.platform.fdpass.own_received``); the receiver owns and closes
them. Reads take exactly the bytes of one message, never more, so descriptors are never attributed to the wrong message.
Sockets given to these helpers must be non-blocking.
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import socket
import struct
import sys
from typing import Any

from vz_core.platform.fdpass import RECVMSG_FLAGS, own_received

if sys.platform != "win32":
    from vz_core.platform.peer import peer_credentials as _peer_credentials

__all__ = [
    "KIND_BYTES",
    "KIND_JSON",
    "MAX_FDS",
    "MAX_FRAME",
    "FramingError",
    "peer_credentials",
    "recv_message",
    "send_json",
    "send_message",
]

KIND_JSON = 0x4A
KIND_BYTES = 0x42
MAX_FRAME = 16 * 1024 * 1024
"""Largest ``N`` (kind byte + payload) of one message."""
MAX_FDS = 3
"""Most descriptors one message may carry."""

_HEADER = struct.Struct(">IB")


class FramingError(Exception):
    """The peer broke the framing (bad length, too many descriptors, truncated message)."""


if sys.platform != "win32":  # SCM_RIGHTS over Unix sockets: Windows has neither (local exec is not offered there)

    def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
        """(pid, uid, gid) of the peer of a connected Unix socket (``vz_core.platform.peer_credentials``)."""
        return _peer_credentials(sock)

    async def _wait(sock: socket.socket, *, write: bool) -> None:
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        fd = sock.fileno()

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        if write:
            loop.add_writer(fd, wake)
        else:
            loop.add_reader(fd, wake)
        try:
            await waiter
        finally:
            if write:
                loop.remove_writer(fd)
            else:
                loop.remove_reader(fd)

    def _close_all(fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)

    async def _recv_exactly(sock: socket.socket, n: int, fds: list[int], max_fds: int) -> bytes:
        buf = bytearray()
        space = socket.CMSG_SPACE(max(max_fds, 1) * 4)
        while len(buf) < n:
            try:
                data, ancillary, flags, _ = sock.recvmsg(n - len(buf), space, RECVMSG_FLAGS)
            except BlockingIOError:
                await _wait(sock, write=False)
                continue
            for level, kind, raw in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(raw[: len(raw) - len(raw) % got.itemsize])
                    own_received(list(got))
                    fds.extend(got)
            if flags & socket.MSG_CTRUNC or len(fds) > max_fds:
                raise FramingError(f"a message carried more than {max_fds} file descriptors")
            if not data:
                if buf:
                    raise FramingError("the connection ended inside a message")
                raise EOFError
            buf += data
        return bytes(buf)

    async def recv_message(sock: socket.socket, *, max_fds: int = MAX_FDS) -> tuple[int, bytes, list[int]]:
        """The next message: (kind, payload, descriptors). ``EOFError`` at a clean end of the connection,
        ``FramingError`` when the peer broke the framing (descriptors received so far are closed then)."""
        fds: list[int] = []
        try:
            header = await _recv_exactly(sock, _HEADER.size, fds, max_fds)
            length, kind = _HEADER.unpack(header)
            if not 1 <= length <= MAX_FRAME:
                raise FramingError(f"a message length of {length} bytes (1..{MAX_FRAME})")
            payload = await _recv_exactly(sock, length - 1, fds, max_fds) if length > 1 else b""
        except BaseException:
            _close_all(fds)
            raise
        return kind, payload, fds

    async def send_message(
        sock: socket.socket, kind: int, payload: bytes, fds: tuple[int, ...] | list[int] = ()
    ) -> None:
        """Send one message; ``fds`` ride on its first byte (they stay open here)."""
        if len(payload) + 1 > MAX_FRAME:
            raise ValueError(f"a message of {len(payload) + 1} bytes is over the limit of {MAX_FRAME}")
        if len(fds) > MAX_FDS:
            raise ValueError(f"at most {MAX_FDS} descriptors per message")
        data = memoryview(_HEADER.pack(len(payload) + 1, kind) + payload)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
        while data:
            try:
                sent = sock.sendmsg([data], ancillary, socket.MSG_NOSIGNAL)
            except BlockingIOError:
                await _wait(sock, write=True)
                continue
            ancillary = []  # delivered with the first byte sent
            data = data[sent:]

    async def send_json(sock: socket.socket, doc: dict[str, Any], fds: tuple[int, ...] | list[int] = ()) -> None:
        """Send one ``J`` message."""
        await send_message(sock, KIND_JSON, json.dumps(doc, separators=(",", ":")).encode(), fds)
