"""The Environment's DNS responder: each Machine resolves exactly the names its plan lets it see.

``DnsView.from_plan(plan)`` reads the ``dns`` records of every Machine of a topology plan (JSON form), keyed by
the Machine's addresses: inside a route domain the source address of a query identifies its Machine (the
domain's nft ``sources`` set drops anything arriving with another Machine's address). ``answer(view, source,
query)`` is pure: the response bytes for one DNS message, or None for what is not worth an answer.

* a name the Machine may see: its A / SRV records (SRV answers carry the target's A record as additional);
  another type of a visible name: no data;
* any other name under ``vz.internal`` or ``docker.internal``: NXDOMAIN (another Machine's name is never
  confirmed to exist);
* every other name: REFUSED. Forwarding to the host's resolvers (and the allowlist's expiring entries) is the
  next step (docs/network.md).

``DnsServer(plan)`` serves a view on UDP and TCP port 53 of every gateway address, with sockets created inside
the domain's namespace (a fresh thread joins it; the sockets keep it), so one process can serve every domain.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import os
import re
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from vz_core.network._spec import DomainSpec, PlanError

__all__ = ["DnsRecordSpec", "DnsServer", "DnsView", "answer"]

T = TypeVar("T")
TTL = 30
ZONES = ("vz.internal", "docker.internal")
_NAME_RE = re.compile(r"(?:_?[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}")
TYPE_A, TYPE_SRV, TYPE_ANY = 1, 33, 255
CLASS_IN = 1
NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5
CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class DnsRecordSpec:
    name: str
    type: str
    address: ipaddress.IPv4Address | None = None
    port: int | None = None
    target: str | None = None


@dataclass(frozen=True)
class DnsView:
    """Per source address: the records that Machine may resolve (names lowercase, no trailing dot)."""

    environment_id: str
    gateways: tuple[ipaddress.IPv4Address, ...]
    records: Mapping[ipaddress.IPv4Address, tuple[DnsRecordSpec, ...]]

    @classmethod
    def from_plan(cls, plan: Mapping[str, Any]) -> DnsView:
        spec = DomainSpec.from_plan(plan)  # the addressing half, checked
        by_machine: dict[str, tuple[DnsRecordSpec, ...]] = {}
        for i, machine in enumerate(plan["machines"]):
            records: list[DnsRecordSpec] = []
            items = machine.get("dns") if isinstance(machine, Mapping) else None
            if not isinstance(items, list):
                raise PlanError(f"$.machines[{i}].dns: expected a list of records")
            for j, item in enumerate(items):
                records.append(_record(item, f"$.machines[{i}].dns[{j}]"))
            by_machine[str(machine["name"])] = tuple(records)
        view = {a.address: by_machine.get(a.machine, ()) for a in spec.attachments}
        gateways = tuple(sorted({a.gateway for a in spec.attachments}))
        return cls(spec.environment_id, gateways, view)


def _record(item: Any, where: str) -> DnsRecordSpec:
    if not isinstance(item, Mapping):
        raise PlanError(f"{where}: expected a record object")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or len(name) > 253:
        raise PlanError(f"{where}.name: {name!r} is not a DNS name")
    kind = item.get("type")
    if kind == "A":
        try:
            return DnsRecordSpec(name, "A", address=ipaddress.IPv4Address(item.get("address")))
        except (ValueError, TypeError):
            raise PlanError(f"{where}.address: {item.get('address')!r} is not an IPv4 address") from None
    if kind == "SRV":
        port, target = item.get("port"), item.get("target")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise PlanError(f"{where}.port: {port!r} is not a port")
        if not isinstance(target, str) or not _NAME_RE.fullmatch(target):
            raise PlanError(f"{where}.target: {target!r} is not a DNS name")
        return DnsRecordSpec(name, "SRV", port=port, target=target)
    raise PlanError(f"{where}.type: {kind!r} is not A or SRV")


# --- the wire ------------------------------------------------------------------------------------------------


def _encode_name(name: str) -> bytes:
    out = b""
    for label in name.split("."):
        out += bytes([len(label)]) + label.encode("ascii")
    return out + b"\x00"


def _question(message: bytes) -> tuple[str, int, int, int] | None:
    """(name, qtype, qclass, end offset) of the first question, or None if it is not well formed."""
    offset = 12
    labels: list[str] = []
    while True:
        if offset >= len(message):
            return None
        length = message[offset]
        offset += 1
        if length == 0:
            break
        if length & 0xC0 or offset + length > len(message):  # no compression in a question we answer
            return None
        raw = message[offset : offset + length]
        offset += length
        try:
            labels.append(raw.decode("ascii").lower())
        except UnicodeDecodeError:
            return None
        if sum(len(x) + 1 for x in labels) > 255:
            return None
    if offset + 4 > len(message):
        return None
    qtype, qclass = struct.unpack_from("!HH", message, offset)
    return ".".join(labels), qtype, qclass, offset + 4


def _rr(name_ref: bytes, rtype: int, rdata: bytes) -> bytes:
    return name_ref + struct.pack("!HHIH", rtype, CLASS_IN, TTL, len(rdata)) + rdata


def answer(view: DnsView, source: str, message: bytes) -> bytes | None:
    """The response to one DNS message from ``source`` (None: too short to answer, or itself a response)."""
    if len(message) < 12:
        return None
    ident, flags, qdcount = struct.unpack_from("!HHH", message, 0)
    if flags & 0x8000:
        return None  # a response: never answer those (no reflection loops)
    rd = flags & 0x0100
    opcode = (flags >> 11) & 0xF

    def reply(
        rcode: int, question: bytes = b"", answers: list[bytes] | None = None, extra: list[bytes] | None = None
    ) -> bytes:
        answers, extra = answers or [], extra or []
        head = struct.pack(
            "!HHHHHH",
            ident,
            0x8000 | (opcode << 11) | 0x0400 | rd | rcode,
            1 if question else 0,
            len(answers),
            0,
            len(extra),
        )
        return head + question + b"".join(answers) + b"".join(extra)

    if opcode != 0:
        return reply(NOTIMP)
    parsed = _question(message) if qdcount == 1 else None
    if parsed is None:
        return reply(FORMERR)
    name, qtype, qclass, end = parsed
    question = message[12:end]
    try:
        records = view.records.get(ipaddress.IPv4Address(source))
    except ValueError:
        records = None
    if records is None:
        return reply(REFUSED, question)  # not a Machine of this Environment
    ours = any(name == zone or name.endswith("." + zone) for zone in ZONES)
    if not ours:
        return reply(REFUSED, question)
    if qclass not in (CLASS_IN, 255):
        return reply(NOERROR, question)
    matching = [r for r in records if r.name == name]
    if not matching:
        return reply(NXDOMAIN, question)
    answers: list[bytes] = []
    extra: list[bytes] = []
    for record in matching:
        if record.type == "A" and qtype in (TYPE_A, TYPE_ANY) and record.address is not None:
            answers.append(_rr(b"\xc0\x0c", TYPE_A, record.address.packed))
        elif record.type == "SRV" and qtype in (TYPE_SRV, TYPE_ANY) and record.target and record.port:
            answers.append(
                _rr(b"\xc0\x0c", TYPE_SRV, struct.pack("!HHH", 0, 0, record.port) + _encode_name(record.target))
            )
            for target in records:
                if target.type == "A" and target.name == record.target and target.address is not None:
                    extra.append(_rr(_encode_name(target.name), TYPE_A, target.address.packed))
    return reply(NOERROR, question, answers, extra)


# --- the server ----------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def in_namespace(path: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a fresh thread joined to the network namespace at ``path`` (sockets it makes keep it)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {path}: {os.strerror(err)}")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="vz-netns")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, view: DnsView) -> None:
        self.view = view
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        response = answer(self.view, str(addr[0]), data)
        if response is not None and self.transport is not None:
            self.transport.sendto(response, addr)


class DnsServer:
    """The responder of one route domain on UDP and TCP 53 of each gateway; ``await start()``, ``await close()``."""

    def __init__(self, plan: Mapping[str, Any], *, port: int = 53) -> None:
        self.view = DnsView.from_plan(plan)
        self.domain = DomainSpec.from_plan(plan).name
        self.port = port
        self._transports: list[asyncio.BaseTransport] = []
        self._servers: list[asyncio.Server] = []

    def _sockets(self) -> list[tuple[socket.socket, socket.socket]]:
        pairs = []
        try:
            for gateway in self.view.gateways:
                udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                pairs.append((udp, socket.socket(socket.AF_INET, socket.SOCK_STREAM)))
                tcp = pairs[-1][1]
                for sock in (udp, tcp):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind((str(gateway), self.port))
                    sock.setblocking(False)
                tcp.listen(64)
        except BaseException:
            for udp, tcp in pairs:
                udp.close()
                tcp.close()
            raise
        return pairs

    async def start(self) -> None:
        path = f"/run/netns/{self.domain}"
        pairs = await asyncio.to_thread(in_namespace, path, self._sockets)
        loop = asyncio.get_running_loop()
        try:
            for udp, tcp in pairs:
                transport, _ = await loop.create_datagram_endpoint(lambda: _Udp(self.view), sock=udp)
                self._transports.append(transport)
                self._servers.append(await asyncio.start_server(self._tcp, sock=tcp))
        except BaseException:
            await self.close()
            for udp, tcp in pairs:
                udp.close()
                tcp.close()
            raise

    async def _tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            while True:
                head = await asyncio.wait_for(reader.readexactly(2), 10)
                (length,) = struct.unpack("!H", head)
                message = await asyncio.wait_for(reader.readexactly(length), 10)
                response = answer(self.view, str(peer[0]), message)
                if response is None:
                    break
                writer.write(struct.pack("!H", len(response)) + response)
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def close(self) -> None:
        for transport in self._transports:
            transport.close()
        for server in self._servers:
            server.close()
            await server.wait_closed()
        self._transports.clear()
        self._servers.clear()
