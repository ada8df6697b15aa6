"""Export listeners and import relays (TCP and UDP): the only ways between the host and a route domain.

* ``ExportListener(plan, machine, service)``: listens on 127.0.0.1 (never a wildcard or LAN address) at the
  first free port of the export's ``host_ports`` (the declared preference first, then the Environment's stable
  fallbacks) and relays every connection to the Machine's service, connecting from a socket made inside the
  route domain (the domain's own traffic: no path or egress rule is involved, and the Machine sees the gateway
  as the peer).
* ``ImportRelay(plan, index)``: listens inside the route domain on the importing Machine's gateway(s) at the
  import's Machine-side port (the domain's nft ``local`` set admits only that Machine's interface and address),
  checks the peer again, and relays to the declared host loopback address and port.

Both are asyncio servers in the calling process (the daemon owns them): ``await start()``, ``await close()``
(closes the listeners and every relayed connection). ``protocol`` is the plan's: a ``udp`` export or import is
relayed datagram by datagram, one socket per peer on the other side, closed after ``idle`` seconds without
traffic (``vz_core.network._udp``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import socket
from collections.abc import Mapping
from typing import Any

from vz_core.errors import UnavailableError
from vz_core.network._ns import in_namespace
from vz_core.network._spec import DomainSpec, PlanError
from vz_core.network._udp import IDLE, NamespaceThread, UdpExport, UdpImport

__all__ = ["ExportListener", "ImportRelay"]

_CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of file, then half-close the writer. On a reset or any socket error the writer is closed
    at once: the other end learns the connection is gone (else a side that was reset would leave its peer
    waiting forever for an end of file); the opposite direction keeps delivering what it already has."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


class _Relay:
    def __init__(self) -> None:
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def _join(
        self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter, up: tuple[Any, Any] | None
    ) -> None:
        if up is None:
            down_w.close()
            return
        up_r, up_w = up
        try:
            await asyncio.gather(_pipe(down_r, up_w), _pipe(up_r, down_w))
        finally:
            for w in (up_w, down_w):  # both closed before anything is awaited: a cancellation cannot skip one
                w.close()
            for w in (up_w, down_w):
                with contextlib.suppress(ConnectionError, OSError):
                    await w.wait_closed()

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One accepted connection (the server's handler task, tracked so that ``close`` ends it)."""
        task = asyncio.current_task()
        assert task is not None
        self._track(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            # The listener is closing: the connection ends with it. Returning (not raising) keeps asyncio's
            # stream server from logging the cancelled handler as an error.
            writer.close()

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()


def _close_made(made: asyncio.Future[socket.socket]) -> None:
    if not made.cancelled() and made.exception() is None:
        made.result().close()


def _find(plan: Mapping[str, Any], key: str, index_of: Any) -> Mapping[str, Any]:
    items = plan.get(key)
    if not isinstance(items, list):
        raise PlanError(f"$.{key}: expected a list")
    for item in items:
        if isinstance(item, Mapping) and index_of(item):
            return item
    raise PlanError(f"$.{key}: no such entry in the plan")


class ExportListener(_Relay):
    """One export: 127.0.0.1:<port> on the host → the Machine's service inside the route domain."""

    def __init__(self, plan: Mapping[str, Any], machine: str, service: str, *, idle: float = IDLE) -> None:
        super().__init__()
        spec = DomainSpec.from_plan(plan)
        item = _find(plan, "exports", lambda e: e.get("machine") == machine and e.get("service") == service)
        protocol = item.get("protocol")
        if protocol not in ("tcp", "udp"):
            raise PlanError(f"$.exports: {machine} {service}: protocol {protocol!r} is not tcp or udp")
        self.protocol: str = protocol
        self.idle = idle
        self._udp: UdpExport | None = None
        addresses = {str(a.address) for a in spec.machine(machine)}
        self.target = str(item.get("machine_address"))
        if self.target not in addresses:
            raise PlanError(f"$.exports: {self.target!r} is not an address of {machine}")
        port = item.get("port")
        ports = item.get("host_ports")
        if not isinstance(port, int) or not isinstance(ports, list) or not ports:
            raise PlanError(f"$.exports: {machine} {service} has no port or host_ports")
        if item.get("host_address") != "127.0.0.1":
            raise PlanError("$.exports: an export listens on 127.0.0.1 only")
        self.target_port = port
        self.candidates = [p for p in ports if isinstance(p, int) and 1 <= p <= 65535]
        self.domain_path = f"/run/netns/{spec.name}"
        self.port: int | None = None
        self._thread = NamespaceThread(self.domain_path)  # makes the in-domain socket of each connection
        self._spare: asyncio.Future[socket.socket] | None = None  # the next connection's, made ahead

    async def start(self) -> int:
        """Listen on the first free candidate port; returns it (UnavailableError when every one is taken)."""
        if self.protocol == "udp":
            self._udp = UdpExport(self.domain_path, (self.target, self.target_port), self.candidates, idle=self.idle)
            self.port = await self._udp.start()
            return self.port
        for candidate in self.candidates:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # Linux never lets two listeners share the port with SO_REUSEADDR alone; it only lets the listener
            # come back while old connections of its port linger in TIME_WAIT (the port stays stable).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError as exc:
                sock.close()
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue
                raise
            sock.listen(64)
            sock.setblocking(False)
            self._servers.append(await asyncio.start_server(self._accept, sock=sock))
            self.port = candidate
            return candidate
        raise UnavailableError(
            f"every host port of this export is taken on 127.0.0.1 ({', '.join(map(str, self.candidates))})"
        )

    @property
    def udp(self) -> UdpExport | None:
        """The datagram relay of a started UDP export (its sessions), else None."""
        return self._udp

    async def close(self) -> None:
        if self._udp is not None:
            await self._udp.close()
        await super().close()
        if self._spare is not None:
            self._spare.add_done_callback(_close_made)
            self._spare = None
        self._thread.close()

    def _next_socket(self) -> asyncio.Future[socket.socket]:
        """The in-domain socket for a new connection: the one made ahead when it is ready (a connection then
        waits for no thread), and another made ahead for the next one."""
        made = self._spare
        if made is None or (made.done() and (made.cancelled() or made.exception() is not None)):
            made = asyncio.ensure_future(self._thread.run(socket.socket))
        self._spare = asyncio.ensure_future(self._thread.run(socket.socket))
        return made

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up: tuple[Any, Any] | None = None
        made = self._next_socket()
        try:
            sock = await asyncio.shield(made)
        except asyncio.CancelledError:  # closing: the socket being made is closed when it arrives
            made.add_done_callback(_close_made)
            raise
        sock.setblocking(False)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (self.target, self.target_port)), 10)
            up = await asyncio.open_connection(sock=sock)
        except (OSError, TimeoutError):
            sock.close()
        except BaseException:  # cancelled mid-connect (the listener closing): the socket is not left to the GC
            sock.close()
            raise
        await self._join(reader, writer, up)


class ImportRelay(_Relay):
    """One import: the Machine's gateway:port inside the route domain → host loopback address:port."""

    def __init__(self, plan: Mapping[str, Any], index: int, *, idle: float = IDLE) -> None:
        super().__init__()
        spec = DomainSpec.from_plan(plan)
        items = plan.get("imports")
        if not isinstance(items, list) or not 0 <= index < len(items) or not isinstance(items[index], Mapping):
            raise PlanError(f"$.imports[{index}]: no such import in the plan")
        item = items[index]
        where = f"$.imports[{index}]"
        protocol = item.get("protocol")
        if protocol not in ("tcp", "udp"):
            raise PlanError(f"{where}.protocol: {protocol!r} is not tcp or udp")
        self.protocol: str = protocol
        self.idle = idle
        self._udp: UdpImport | None = None
        try:
            host = ipaddress.ip_address(item.get("host_address"))
        except ValueError:
            raise PlanError(f"{where}.host_address: not an IP address") from None
        if not host.is_loopback:
            raise PlanError(f"{where}.host_address: {host} is not a loopback address")
        host_port, port = item.get("host_port"), item.get("port")
        if not isinstance(host_port, int) or not isinstance(port, int):
            raise PlanError(f"{where}: host_port and port are integers")
        attachments = spec.machine(str(item.get("machine")))
        self.listen_on = sorted({str(a.gateway) for a in attachments})
        self.host = (str(host), host_port)
        # Machines on one network share its gateway: every import of this protocol/port (one host target, the
        # definition says so) is served by whichever of their relays the kernel hands the flow to, so each relay
        # admits all of them on its gateways (the nft ``local`` set admits each only to its own gateway).
        sharing = {
            str(other.get("machine"))
            for other in items
            if isinstance(other, Mapping) and (other.get("protocol"), other.get("port")) == (protocol, port)
        }
        for other in items:
            if (
                isinstance(other, Mapping)
                and (other.get("protocol"), other.get("port")) == (protocol, port)
                and (other.get("host_address"), other.get("host_port")) != (item.get("host_address"), host_port)
            ):
                raise PlanError(f"{where}: {protocol}/{port} of the gateway carries two different host targets")
        self.allowed = {
            str(a.address) for name in sorted(sharing) for a in spec.machine(name) if str(a.gateway) in self.listen_on
        }
        self.port = port
        self.domain_path = f"/run/netns/{spec.name}"

    def _sockets(self) -> list[socket.socket]:
        out: list[socket.socket] = []
        try:
            for address in self.listen_on:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                out.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                # Another Machine's import of the same port on this gateway is an equivalent relay: both listen.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((address, self.port))
                sock.listen(64)
                sock.setblocking(False)
        except BaseException:
            for sock in out:
                sock.close()
            raise
        return out

    @property
    def udp(self) -> UdpImport | None:
        """The datagram relay of a started UDP import (its sessions), else None."""
        return self._udp

    async def start(self) -> None:
        if self.protocol == "udp":
            relay = UdpImport(self.domain_path, self.listen_on, self.port, self.allowed, self.host, idle=self.idle)
            await relay.start()
            self._udp = relay
            return
        sockets = await asyncio.to_thread(in_namespace, self.domain_path, self._sockets)
        for sock in sockets:
            self._servers.append(await asyncio.start_server(self._accept, sock=sock))

    async def close(self) -> None:
        if self._udp is not None:
            await self._udp.close()
        await super().close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        up: tuple[Any, Any] | None = None
        if peer and peer[0] in self.allowed:  # the nft input rule already says so; the relay checks again
            with contextlib.suppress(OSError, TimeoutError):
                up = await asyncio.wait_for(asyncio.open_connection(*self.host), 10)
        await self._join(reader, writer, up)
