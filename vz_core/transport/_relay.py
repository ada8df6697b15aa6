"""TLS relays for AutoMTLS peers whose certificates grpcio cannot verify (Go peers use ECDSA P-521).

grpcio's TLS stack rejects P-521 signatures, so a grpcio channel or server cannot complete AutoMTLS with a Go
peer. Instead of falling back to plaintext, the side that meets a P-521 certificate terminates that TLS
session with Python's ``ssl`` module (OpenSSL verifies P-521) and relays the decrypted HTTP/2 bytes to
grpcio over a private Unix socket in a 0700 directory:

* ``ServerRelay`` (plugin side): public socket ⇄ TLS (client certificate required and pinned) ⇄ the
  plugin's internal grpcio server.
* ``ClientRelay`` (host side): grpcio channel ⇄ private socket ⇄ TLS (server certificate pinned, our client
  certificate presented) ⇄ the plugin's socket.

Both pin the peer certificate exactly (DER equality after the handshake), require TLS ≥ 1.2 and negotiate
ALPN "h2". The byte pumps are asyncio protocols with transport-level flow control: a slow side pauses
reading on the other, so a relay never buffers more than the transports' high-water marks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import tempfile
from pathlib import Path

from vz_core.errors import PluginError
from vz_core.transport._certs import CertKey, der_to_pem

__all__ = ["ClientRelay", "ServerRelay", "client_context", "server_context"]

_HIGH_WATER = 1 << 20


def _load_identity(ctx: ssl.SSLContext, identity: CertKey, workdir: Path | None) -> None:
    # The ssl module loads keys only from files: write them into a private directory and remove them at once.
    with tempfile.TemporaryDirectory(dir=workdir, prefix="vz-tls-") as tmp:
        os.chmod(tmp, 0o700)
        cert = Path(tmp) / "cert.pem"
        key = Path(tmp) / "key.pem"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(identity.key_pem)
        cert.write_bytes(identity.cert_pem)
        ctx.load_cert_chain(cert, key)


def server_context(identity: CertKey, client_cert_pem: bytes, *, workdir: Path | None = None) -> ssl.SSLContext:
    """TLS server side: our certificate, the client's certificate required and trusted alone."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=client_cert_pem.decode())
    ctx.set_alpn_protocols(["h2"])
    _load_identity(ctx, identity, workdir)
    return ctx


def client_context(identity: CertKey, server_cert_der: bytes, *, workdir: Path | None = None) -> ssl.SSLContext:
    """TLS client side: our certificate presented, the server's certificate trusted alone, name "localhost"."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cadata=der_to_pem(server_cert_der).decode())
    ctx.set_alpn_protocols(["h2"])
    _load_identity(ctx, identity, workdir)
    return ctx


def _peer_der(transport: asyncio.BaseTransport) -> bytes | None:
    obj = transport.get_extra_info("ssl_object")
    if obj is None:
        return None
    der: bytes | None = obj.getpeercert(binary_form=True)
    return der


class _Pipe(asyncio.Protocol):
    """One side of a relayed connection; forwards to ``peer`` with flow control in both directions."""

    def __init__(self, registry: set[_Pipe]) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self.pending: list[bytes] = []
        self.closed = False
        self._registry = registry

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=_HIGH_WATER)
        self._registry.add(self)

    def _flush_to_peer(self) -> None:
        if self.pending and self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(b"".join(self.pending))
            self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.pending.append(data)

    def eof_received(self) -> bool | None:
        # HTTP/2 never half-closes usefully, and TLS transports cannot write EOF: close both sides.
        self.close()
        return False

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._registry.discard(self)
        if self.peer is not None and not self.peer.closed:
            self.peer.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        if self.peer is not None and self.peer.transport is not None and not self.peer.transport.is_closing():
            self.peer.transport.close()


def _link(a: _Pipe, b: _Pipe) -> None:
    """Join two sides; whatever either received before it had a peer is forwarded now."""
    a.peer, b.peer = b, a
    a._flush_to_peer()
    b._flush_to_peer()


class _RelayBase:
    def __init__(self) -> None:
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._pipes: set[_Pipe] = set()

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop accepting and drop every relayed connection."""
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None


class ServerRelay(_RelayBase):
    """Plugin side: terminate AutoMTLS on the public address and relay to a private grpcio socket."""

    def __init__(self, internal_path: str, pinned_client_der: bytes, context: ssl.SSLContext) -> None:
        super().__init__()
        self._internal = internal_path
        self._pinned = pinned_client_der
        self._ctx = context
        self.address = ""

    async def listen_unix(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accept, path=path, ssl=self._ctx, backlog=64)
        self.address = path

    async def listen_tcp(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, host=host, port=port, ssl=self._ctx, backlog=64)
        sock = self._server.sockets[0]
        self.address = "{}:{}".format(*sock.getsockname()[:2])

    def _accept(self) -> _Pipe:
        return _ServerSide(self)

    async def _connect_inner(self, outer: _Pipe) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, inner = await loop.create_unix_connection(lambda: _Pipe(self._pipes), self._internal)
        except OSError:
            outer.close()
            return
        _link(outer, inner)
        assert outer.transport is not None
        outer.transport.resume_reading()


class _ServerSide(_Pipe):
    def __init__(self, relay: ServerRelay) -> None:
        super().__init__(relay._pipes)
        self._relay = relay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        if _peer_der(transport) != self._relay._pinned:
            # A certificate the CA check accepted but that is not exactly the host's: refuse.
            self.transport.abort()
            return
        self.transport.pause_reading()
        self._relay._spawn(self._relay._connect_inner(self))


class ClientRelay(_RelayBase):
    """Host side: grpcio connects in plaintext to a private socket; each connection is carried over TLS."""

    def __init__(
        self,
        network: str,
        address: str,
        pinned_server_der: bytes,
        context: ssl.SSLContext,
        *,
        connect_timeout: float = 10.0,
    ) -> None:
        super().__init__()
        self._network = network
        self._address = address
        self._pinned = pinned_server_der
        self._ctx = context
        self._timeout = connect_timeout
        self.path = ""

    async def listen(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accept, path=path, backlog=64)
        os.chmod(path, 0o600)
        self.path = path

    def _accept(self) -> _Pipe:
        return _ClientSide(self)

    async def open_tls(self) -> tuple[asyncio.Transport, _Pipe]:
        """One TLS connection to the plugin, its certificate checked against the pinned one."""
        loop = asyncio.get_running_loop()
        if self._network == "unix":
            coro = loop.create_unix_connection(
                lambda: _Pipe(self._pipes),
                self._address,
                ssl=self._ctx,
                server_hostname="localhost",
                ssl_handshake_timeout=self._timeout,
            )
        else:
            host, _, port = self._address.rpartition(":")
            coro = loop.create_connection(
                lambda: _Pipe(self._pipes),
                host.strip("[]"),
                int(port),
                ssl=self._ctx,
                server_hostname="localhost",
                ssl_handshake_timeout=self._timeout,
            )
        transport, pipe = await asyncio.wait_for(coro, self._timeout)
        if _peer_der(transport) != self._pinned:
            transport.abort()
            raise PluginError("plugin presented a TLS certificate other than the one in its handshake line")
        return transport, pipe

    async def _connect_outer(self, inner: _Pipe) -> None:
        try:
            _, outer = await self.open_tls()
        except (OSError, ssl.SSLError, PluginError, TimeoutError):
            inner.close()
            return
        _link(inner, outer)
        assert inner.transport is not None
        inner.transport.resume_reading()


class _ClientSide(_Pipe):
    def __init__(self, relay: ClientRelay) -> None:
        super().__init__(relay._pipes)
        self._relay = relay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.pause_reading()
        self._relay._spawn(self._relay._connect_outer(self))
