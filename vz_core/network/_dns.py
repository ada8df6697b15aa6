"""The Environment's DNS responder: each Machine resolves exactly the names its plan lets it see.

``DnsView.from_plan(plan)`` reads the ``dns`` records of every Machine of a topology plan (JSON form), keyed by
the Machine's addresses: inside a route domain the source address of a query identifies its Machine (the
domain's nft ``sources`` set drops anything arriving with another Machine's address). ``answer(view, source,
query)`` is pure: the response bytes for one DNS message, or None for what is not worth an answer.

* a name the Machine may see: its A / SRV records (SRV answers carry the target's A record as additional);
  another type of a visible name: no data;
* any other name under ``vz.internal`` or ``docker.internal``: NXDOMAIN (another Machine's name is never
  confirmed to exist);
* every other name: REFUSED by ``answer``. ``DnsServer`` forwards it to the host's resolvers instead when the
  Machine's egress allows it (``forwardable``): an ``allowed`` Machine's every name, an allowlist Machine's only
  names matching its ``domains`` (``example.com`` exactly, ``*.example.com`` every name below it), an
  ``offline`` Machine's never (no way out through DNS either). For an allowlist Machine every A record of the
  answer is added, before the answer is sent, to the domain's ``egress_dns`` set (Machine . address) with a
  timeout of the record's TTL clamped to ``min_ttl``..``max_ttl`` (30 s..1 h): the forward rule toward the
  uplink admits exactly those pairs, until they expire.

``DnsServer(plan)`` serves a view on UDP and TCP port 53 of every gateway address, with sockets created inside
the domain's namespace (a fresh thread joins it; the sockets keep it), so one process can serve every domain;
queries are forwarded from the process's own namespace (the host's, in the daemon) to ``upstreams`` (default:
the ``nameserver`` lines of /etc/resolv.conf).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import secrets
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from vz_core.network._ns import NetworkTools, in_namespace, run
from vz_core.network._spec import DomainSpec, PlanError

__all__ = [
    "DnsRecordSpec",
    "DnsServer",
    "DnsView",
    "answer",
    "answer_addresses",
    "forwardable",
    "host_resolvers",
    "name_matches",
]

log = logging.getLogger("vz.network")

T = TypeVar("T")
TTL = 30
ZONES = ("vz.internal", "docker.internal")
_PATTERN_RE = re.compile(r"(?:\*\.)?(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?\.)+[a-z0-9-]{2,63}")
_NAME_RE = re.compile(r"(?:_?[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}")
TYPE_A, TYPE_SRV, TYPE_ANY = 1, 33, 255
CLASS_IN = 1
NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5
MAX_IN_FLIGHT = 128
"""Forwarded UDP queries in flight per responder; beyond it a query is answered SERVFAIL at once."""


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
    egress: Mapping[ipaddress.IPv4Address, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """Per source address: its Machine's egress mode and allowlisted domain names (lowercase)."""
    machines: Mapping[ipaddress.IPv4Address, tuple[ipaddress.IPv4Address, ...]] = field(default_factory=dict)
    """Per source address: every address of its Machine (an allowlist entry is added for each)."""

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
        modes: dict[str, tuple[str, tuple[str, ...]]] = {}
        for i, machine in enumerate(plan["machines"]):
            egress = machine.get("egress") if isinstance(machine, Mapping) else None
            domains = egress.get("domains", []) if isinstance(egress, Mapping) else []
            if not isinstance(domains, list) or not all(
                isinstance(d, str) and _PATTERN_RE.fullmatch(d.lower().rstrip(".")) for d in domains
            ):
                raise PlanError(f"$.machines[{i}].egress.domains: expected a list of domain names")
            mode = str(egress.get("mode")) if isinstance(egress, Mapping) else "offline"
            modes[str(machine["name"])] = (mode, tuple(d.lower().rstrip(".") for d in domains))
        egress = {a.address: modes.get(a.machine, ("offline", ())) for a in spec.attachments}
        own = {a.address: tuple(b.address for b in spec.machine(a.machine)) for a in spec.attachments}
        return cls(spec.environment_id, gateways, view, egress, own)


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


def name_matches(name: str, pattern: str) -> bool:
    """``example.com`` matches exactly that name; ``*.example.com`` every name below it (not itself)."""
    name, pattern = name.lower().rstrip("."), pattern.lower().rstrip(".")
    if pattern.startswith("*."):
        return name.endswith(pattern[1:]) and len(name) > len(pattern) - 1
    return name == pattern


def forwardable(view: DnsView, source: str, message: bytes) -> bool:
    """Whether the query from ``source`` goes to the host's resolvers: a well-formed standard query for a name
    outside the Environment's zones, from a Machine whose egress is ``allowed``, or an allowlist whose domain
    names match it. Never for ``offline`` Machines, never for a name under vz.internal/docker.internal."""
    if len(message) < 12:
        return False
    _, flags, qdcount = struct.unpack_from("!HHH", message, 0)
    if flags & 0x8000 or (flags >> 11) & 0xF or qdcount != 1:
        return False
    parsed = _question(message)
    if parsed is None:
        return False
    name = parsed[0]
    if any(name == zone or name.endswith("." + zone) for zone in ZONES) or not name:
        return False
    try:
        mode, domains = view.egress.get(ipaddress.IPv4Address(source), ("offline", ()))
    except ValueError:
        return False
    if mode == "allowed":
        return True
    return mode == "allowlist" and any(name_matches(name, d) for d in domains)


def _skip_name(message: bytes, offset: int) -> int:
    while True:
        if offset >= len(message):
            raise ValueError("truncated name")
        length = message[offset]
        if length & 0xC0 == 0xC0:
            return offset + 2
        if length & 0xC0:
            raise ValueError("bad label")
        offset += 1 + length
        if length == 0:
            return offset


def answer_addresses(message: bytes) -> list[tuple[ipaddress.IPv4Address, int]]:
    """The (address, TTL) of every A record in the answer section of a response (empty if malformed)."""
    try:
        ancount = struct.unpack_from("!H", message, 6)[0]
        qdcount = struct.unpack_from("!H", message, 4)[0]
        offset = 12
        for _ in range(qdcount):
            offset = _skip_name(message, offset) + 4
        out = []
        for _ in range(ancount):
            offset = _skip_name(message, offset)
            rtype, rclass, ttl, length = struct.unpack_from("!HHIH", message, offset)
            offset += 10
            if offset + length > len(message):
                raise ValueError("truncated record")
            if rtype == TYPE_A and rclass == CLASS_IN and length == 4:
                out.append((ipaddress.IPv4Address(message[offset : offset + 4]), ttl))
            offset += length
        return out
    except (struct.error, ValueError):
        return []


def host_resolvers(path: str = "/etc/resolv.conf") -> list[tuple[str, int]]:
    """The IPv4 ``nameserver`` lines of resolv.conf, as (address, 53)."""
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    try:
                        out.append((str(ipaddress.IPv4Address(parts[1])), 53))
                    except ValueError:
                        continue
    except OSError:
        pass
    return out


def _servfail(message: bytes) -> bytes:
    ident, flags = struct.unpack_from("!HH", message, 0)
    parsed = _question(message)
    question = message[12 : parsed[3]] if parsed is not None else b""
    head = struct.pack("!HHHHHH", ident, 0x8000 | (flags & 0x7900) | 0x0080 | SERVFAIL, 1 if question else 0, 0, 0, 0)
    return head + question


# --- the server ----------------------------------------------------------------------------------------------


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, server: DnsServer) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        source = str(addr[0])
        if forwardable(self.server.view, source, data):
            if len(self.server._tasks) >= MAX_IN_FLIGHT:  # a flood gets SERVFAIL, not unbounded upstream queries
                if self.transport is not None:
                    self.transport.sendto(_servfail(data), addr)
                return
            self.server._spawn(self._forward(source, data, addr))
            return
        response = answer(self.server.view, source, data)
        if response is not None and self.transport is not None:
            self.transport.sendto(response, addr)

    async def _forward(self, source: str, data: bytes, addr: tuple[str | Any, int]) -> None:
        response = await self.server.resolve(source, data, tcp=False)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(response, addr)


class DnsServer:
    """The responder of one route domain on UDP and TCP 53 of each gateway; ``await start()``, ``await close()``."""

    def __init__(
        self,
        plan: Mapping[str, Any],
        *,
        port: int = 53,
        upstreams: Sequence[tuple[str, int]] | None = None,
        min_ttl: int = 30,
        max_ttl: int = 3600,
        timeout: float = 3.0,
    ) -> None:
        self.view = DnsView.from_plan(plan)
        self.domain = DomainSpec.from_plan(plan).name
        self.port = port
        self.upstreams = list(upstreams) if upstreams is not None else None
        self.min_ttl, self.max_ttl, self.timeout = min_ttl, max(min_ttl, max_ttl), timeout
        self._transports: list[asyncio.BaseTransport] = []
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def resolve(self, source: str, message: bytes, *, tcp: bool) -> bytes:
        """A forwardable query's response from the upstreams (its id restored); for an allowlist Machine, its
        A records admitted in ``egress_dns`` first. SERVFAIL when no upstream answers or the entries cannot be
        added (an answer whose addresses the domain would refuse is not an answer)."""
        upstreams = self.upstreams if self.upstreams is not None else host_resolvers()
        ident = message[:2]
        for host, port in upstreams:
            query_id = secrets.token_bytes(2)
            try:
                response = await asyncio.wait_for(_ask(host, port, query_id + message[2:], tcp=tcp), self.timeout)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                continue
            if len(response) < 12 or response[:2] != query_id or not response[2] & 0x80:
                continue
            asked, answered = _question(message), _question(response)
            if asked is None or answered is None or asked[:3] != answered[:3]:
                continue
            response = ident + response[2:]
            mode, _ = self.view.egress.get(ipaddress.IPv4Address(source), ("offline", ()))
            if mode == "allowlist" and response[3] & 0x0F == NOERROR:
                try:
                    await self._admit(source, answer_addresses(response))
                except Exception as exc:
                    log.warning("resolved addresses of %s not admitted: %s", self.domain, exc)
                    return _servfail(message)
            return response
        return _servfail(message)

    async def _admit(self, source: str, found: list[tuple[ipaddress.IPv4Address, int]]) -> None:
        if not found:
            return
        from vz_core.network._rules import DNS_SET, TABLE

        tools = NetworkTools.find()
        sources = self.view.machines.get(ipaddress.IPv4Address(source), (ipaddress.IPv4Address(source),))
        ttls: dict[str, int] = {}
        for src in sources:
            for address, ttl in found:
                key = f"{src} . {address}"
                ttls[key] = max(ttls.get(key, 0), min(self.max_ttl, max(self.min_ttl, ttl)))
        keys = ", ".join(sorted(ttls))
        timed = ", ".join(f"{key} timeout {ttls[key]}s" for key in sorted(ttls))
        # One transaction: make sure each pair exists, drop it, add it with the new timeout (so an answer
        # refreshes an entry's lifetime; an `add` alone keeps an existing element's old timeout).
        where = f"inet {TABLE} {DNS_SET}"
        script = (
            f"add element {where} {{ {keys} }}\n"
            f"delete element {where} {{ {keys} }}\n"
            f"add element {where} {{ {timed} }}\n"
        )
        await run(
            [tools.nsenter, f"--net=/run/netns/{self.domain}", "--", tools.nft, "-f", "-"],
            script.encode(),
            what=f"admit resolved addresses in {self.domain}",
        )

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
                transport, _ = await loop.create_datagram_endpoint(lambda: _Udp(self), sock=udp)
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
                if forwardable(self.view, str(peer[0]), message):
                    response: bytes | None = await self.resolve(str(peer[0]), message, tcp=True)
                else:
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
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for transport in self._transports:
            transport.close()
        for server in self._servers:
            server.close()
            await server.wait_closed()
        self._transports.clear()
        self._servers.clear()


async def _ask(host: str, port: int, message: bytes, *, tcp: bool) -> bytes:
    """One query to one upstream (from this process's namespace): UDP, or TCP with its length prefix."""
    loop = asyncio.get_running_loop()
    if tcp:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(struct.pack("!H", len(message)) + message)
            await writer.drain()
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            return await reader.readexactly(length)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, port))
        await loop.sock_sendall(sock, message)
        while True:
            data = await loop.sock_recv(sock, 65535)
            if data[:2] == message[:2]:
                return data
    finally:
        sock.close()
