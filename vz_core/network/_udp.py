"""UDP relays between the host's loopback and a route domain: the datagram half of exports and imports.

UDP has no connections, so a relay keeps one **session per peer**: the first datagram from a new peer (host
address and port for an export; Machine address and port for an import) opens a socket of its own on the other
side, connected to the relay's target, and every reply arriving on that socket goes back to that peer only. A
session with no datagram in either direction for ``idle`` seconds is closed (its socket too); at most
``max_peers`` sessions exist at once (the least recently used one is closed to admit a new peer). Datagrams that
arrive while a session's socket is being made wait for it (a bounded number; UDP may drop, a relay never grows
without bound).

* ``UdpExport``: 127.0.0.1:<port> (never a wildcard or LAN address) → the Machine's UDP service; each host peer
  gets its own socket made inside the route domain (the Machine sees the gateway as the peer, one source port
  per host peer).
* ``UdpImport``: the importing Machine's gateway(s) at the Machine-side port, inside the route domain → the
  declared host loopback address and port; datagrams from any other source are dropped (the domain's nft
  ``local`` set already admits only that Machine; the relay checks again), each Machine-side peer gets its own
  host socket.

``vz_core.network._relay.ExportListener`` / ``ImportRelay`` use these for a plan's ``udp`` exports and imports.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import errno
import functools
import ipaddress
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from vz_core.errors import UnavailableError
from vz_core.network._ns import in_namespace

__all__ = ["IDLE", "MAX_PEERS", "MAX_QUEUED", "NamespaceThread", "UdpExport", "UdpImport"]

IDLE = 60.0
"""Seconds without a datagram (either direction) after which a peer's session and its socket are closed."""
MAX_PEERS = 256
"""Sessions one relay keeps at once; a new peer beyond that closes the least recently used session."""
MAX_QUEUED = 64
"""Datagrams of a new peer kept while its session's socket is being made; later ones are dropped."""

T = TypeVar("T")
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

Address = Any  # (host, port) or (host, port, flow, scope): what the socket layer hands back
Key = tuple[int, Address]
"""A session: (index of the listening socket it arrived on, the peer's address)."""


def _join(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


class NamespaceThread:
    """One thread joined to the network namespace at ``path`` for as long as its owner lives: sockets of that
    namespace are made there without starting a thread per socket (a relay's per-connection cost). The thread
    keeps the namespace alive until ``close``; the owner closes it with its listeners."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[[], T]) -> T:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="vz-netns", initializer=_join, initargs=(self.path,)
            )
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        except concurrent.futures.BrokenExecutor:  # joining failed (the domain is gone): say why, as in_namespace
            self.close()
            return await asyncio.to_thread(in_namespace, self.path, fn)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class _Listening(asyncio.DatagramProtocol):
    def __init__(self, relay: _UdpRelay, index: int) -> None:
        self.relay = relay
        self.index = index

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self.relay._from_peer(self.index, data, addr)

    def error_received(self, exc: Exception) -> None:  # an ICMP error about a reply sent to a peer: UDP, ignored
        pass


class _Session(asyncio.DatagramProtocol):
    def __init__(self, relay: _UdpRelay, key: Key) -> None:
        self.relay = relay
        self.key = key
        self.transport: asyncio.DatagramTransport | None = None
        self.queued: list[bytes] = []
        self.last = time.monotonic()
        self.closed = False

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self.last = time.monotonic()
        self.relay._to_peer(self.key, data)

    def error_received(self, exc: Exception) -> None:  # e.g. the target's port is closed (ICMP): UDP, ignored
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True
        self.queued.clear()
        if self.transport is not None:
            self.transport.close()


class _UdpRelay:
    """Listening sockets on one side, one upstream socket per peer on the other (``upstream()`` makes it,
    connected to the target; it may block, so it runs on a thread)."""

    def __init__(
        self,
        upstream: Callable[[], socket.socket],
        *,
        accept: Callable[[Address], bool] | None = None,
        idle: float = IDLE,
        max_peers: int = MAX_PEERS,
    ) -> None:
        if idle <= 0 or max_peers < 1:
            raise ValueError("a UDP relay needs idle > 0 and max_peers >= 1")
        self._upstream = upstream
        self._accept = accept
        self.idle = idle
        self.max_peers = max_peers
        self._listening: list[asyncio.DatagramTransport] = []
        self._sessions: OrderedDict[Key, _Session] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.dropped = 0
        """Datagrams not relayed: from a source the relay does not accept, or beyond a new session's queue."""

    @property
    def peers(self) -> int:
        """Sessions open now."""
        return len(self._sessions)

    async def _listen(self, sockets: Iterable[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        for sock in sockets:
            index = len(self._listening)
            transport, _ = await loop.create_datagram_endpoint(functools.partial(_Listening, self, index), sock=sock)
            self._listening.append(transport)
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep())

    def _from_peer(self, index: int, data: bytes, addr: Address) -> None:
        if self._accept is not None and not self._accept(addr):
            self.dropped += 1
            return
        key = (index, addr)
        session = self._sessions.get(key)
        if session is not None and not session.closed:
            self._sessions.move_to_end(key)
            session.last = time.monotonic()
            if session.transport is None:
                if len(session.queued) < MAX_QUEUED:
                    session.queued.append(data)
                else:
                    self.dropped += 1
            else:
                session.transport.sendto(data)
            return
        if session is not None:  # its socket went away (closed under it): a new one
            self._drop(key)
        while len(self._sessions) >= self.max_peers:
            self._drop(next(iter(self._sessions)))
        session = _Session(self, key)
        session.queued.append(data)
        self._sessions[key] = session
        task = asyncio.get_running_loop().create_task(self._open(session))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self, session: _Session) -> None:
        try:
            sock = await self._make_upstream()
        except OSError:
            self._drop(session.key)
            return
        try:
            if session.closed:  # closed (evicted, relay closing) while its socket was being made
                sock.close()
                return
            transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: session, sock=sock)
        except BaseException:
            sock.close()
            self._drop(session.key)
            raise
        session.transport = transport
        if session.closed:
            transport.close()
            return
        for data in session.queued:
            transport.sendto(data)
        session.queued.clear()

    async def _make_upstream(self) -> socket.socket:
        return await asyncio.to_thread(self._upstream)

    def _to_peer(self, key: Key, data: bytes) -> None:
        index, addr = key
        if index < len(self._listening) and key in self._sessions:
            self._sessions.move_to_end(key)
            self._listening[index].sendto(data, addr)

    def _drop(self, key: Key) -> None:
        session = self._sessions.pop(key, None)
        if session is not None:
            session.close()

    async def _sweep(self) -> None:
        period = max(0.05, min(self.idle / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            horizon = time.monotonic() - self.idle
            for key in [k for k, s in self._sessions.items() if s.last < horizon or s.closed]:
                self._drop(key)

    async def close(self) -> None:
        """Close the listening sockets and every session's socket (idempotent)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for transport in self._listening:
            transport.close()
        self._listening.clear()
        for key in list(self._sessions):
            self._drop(key)
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task  # a socket being made is closed by _open once it sees the session closed
        await asyncio.sleep(0)  # let the transports' connection_lost run: their sockets are closed now

    def local_addresses(self) -> list[Address]:
        """Where the relay listens (for tests and status)."""
        return [t.get_extra_info("sockname") for t in self._listening]


class UdpExport(_UdpRelay):
    """127.0.0.1:<port> UDP on the host → ``target`` inside the route domain at ``domain_path``."""

    def __init__(
        self,
        domain_path: str,
        target: tuple[str, int],
        candidates: list[int],
        *,
        idle: float = IDLE,
        max_peers: int = MAX_PEERS,
    ) -> None:
        super().__init__(self._domain_socket, idle=idle, max_peers=max_peers)
        self.domain_path = domain_path
        self._thread = NamespaceThread(domain_path)
        self.target = target
        self.candidates = list(candidates)
        self.port: int | None = None

    def _domain_socket(self) -> socket.socket:
        """A socket of the route domain (run on a thread joined to it), connected to the target."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.connect(self.target)  # the domain's own address toward the Machine is the source
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    async def _make_upstream(self) -> socket.socket:
        return await self._thread.run(self._domain_socket)

    async def close(self) -> None:
        await super().close()
        self._thread.close()

    async def start(self) -> int:
        """Listen on the first free candidate port of 127.0.0.1; returns it (UnavailableError if all are taken)."""
        for candidate in self.candidates:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError as exc:
                sock.close()
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue
                raise
            sock.setblocking(False)
            try:
                await self._listen([sock])
            except BaseException:
                sock.close()
                raise
            self.port = candidate
            return candidate
        raise UnavailableError(
            f"every host port of this export is taken on 127.0.0.1 (udp {', '.join(map(str, self.candidates))})"
        )


class UdpImport(_UdpRelay):
    """The importing Machine's gateway(s):``port`` UDP inside the route domain → ``host`` (a loopback address)."""

    def __init__(
        self,
        domain_path: str,
        listen_on: list[str],
        port: int,
        allowed: set[str],
        host: tuple[str, int],
        *,
        idle: float = IDLE,
        max_peers: int = MAX_PEERS,
    ) -> None:
        address = ipaddress.ip_address(host[0])
        if not address.is_loopback:
            raise ValueError(f"an import relays to a host loopback address, not {address}")
        super().__init__(self._host_socket, accept=self._allowed, idle=idle, max_peers=max_peers)
        self.domain_path = domain_path
        self.listen_on = list(listen_on)
        self.port = port
        self.allowed = set(allowed)
        self.host = host
        self._family = socket.AF_INET6 if address.version == 6 else socket.AF_INET

    def _allowed(self, addr: Address) -> bool:
        return bool(addr) and addr[0] in self.allowed

    def _host_socket(self) -> socket.socket:
        sock = socket.socket(self._family, socket.SOCK_DGRAM)  # made by this process: the host's namespace
        try:
            sock.connect(self.host)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def _sockets(self) -> list[socket.socket]:
        out: list[socket.socket] = []
        try:
            for address in self.listen_on:
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                out.append(sock)
                # Another Machine's import of the same port on this gateway is an equivalent relay: both listen
                # (the kernel keeps each peer's datagrams on one socket).
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((address, self.port))
                sock.setblocking(False)
        except BaseException:
            for sock in out:
                sock.close()
            raise
        return out

    async def start(self) -> None:
        """Listen on each gateway (the sockets are made inside the route domain)."""
        sockets = await asyncio.to_thread(in_namespace, self.domain_path, self._sockets)
        try:
            await self._listen(sockets)
        except BaseException:
            for sock in sockets:
                sock.close()
            await self.close()
            raise
