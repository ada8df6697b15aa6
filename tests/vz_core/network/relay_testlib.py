"""Helpers of the export/import relay tests (TCP and UDP): route domains with Machines as test namespaces, a host
loopback service that counts its connections, a client in a namespace (or on the host), and the clean-up.

Host-side traffic stays on loopback; everything else is in namespaces the tests create.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from netns_kit import Namespaces, in_netns

from vz_core.env._definition import parse_definition
from vz_core.env._topology import TopologyPlan, compile_topology
from vz_core.network import attach_machine, ensure_domain, remove_domain


def free_port(kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    """A 127.0.0.1 port free right now for ``kind`` (TCP by default, ``socket.SOCK_DGRAM`` for UDP)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def definition(
    project_id: str, service: dict[str, Any], export_port: int, host_port: int, **import_fields: Any
) -> dict[str, Any]:
    """A version 2 vz.json of two fake Machines: ``app`` offers ``service``, exported to the host (preferring
    ``export_port``), and imports host port ``host_port`` at its port 7000 (``import_fields``: e.g. ``protocol``);
    ``db`` offers pg, reached from ``app`` on a declared path."""
    m = {"profile": "developer", "driver": "fake", "image": "vz:default"}
    return {
        "version": 2,
        "project_id": project_id,
        "machines": [
            {"name": "app", **m, "services": [service]},
            {"name": "db", **m, "services": [{"name": "pg", "port": 5432}]},
        ],
        "paths": [{"from": "app", "to": "db", "service": "pg"}],
        "exports": [{"machine": "app", "service": service["name"], "host_port": export_port}],
        "imports": [{"machine": "app", "host_port": host_port, "port": 7000, **import_fields}],
    }


@contextlib.contextmanager
def taking(ports: Iterable[int], kind: socket.SocketKind = socket.SOCK_STREAM) -> Iterator[None]:
    """Every one of ``ports`` on 127.0.0.1 that is free bound by this test (for ``kind``) while the block runs
    (a port something else holds already is left to it)."""
    blockers = []
    try:
        for port in ports:
            sock = socket.socket(socket.AF_INET, kind)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            blockers.append(sock)
        yield
    finally:
        for sock in blockers:
            sock.close()


async def build(
    spaces: Namespaces, env_id: str, data: dict[str, Any], label: str
) -> tuple[TopologyPlan, dict[str, str]]:
    """The route domain of ``data`` for ``env_id`` with each Machine a new test namespace attached to it."""
    plan = compile_topology(parse_definition(data), env_id)
    await ensure_domain(plan.to_json())
    netns = {}
    for m in plan.machines:
        netns[m.name] = spaces.add(f"{label}-{m.name}")
        await attach_machine(plan.to_json(), m.name, netns[m.name])
    return plan, netns


class HostService:
    """A host loopback TCP service answering ``reply`` and counting connections (``hits``), in a thread with plain
    sockets: every connection it accepted is closed by it before ``close()``/``stop()`` returns, whatever the
    test's event loop does."""

    def __init__(self, port: int, reply: bytes, *, read_request: bool = False) -> None:
        self.hits = 0
        self.reply = reply
        self.read_request = read_request
        """Read the client's first bytes (an HTTP request) before replying, so closing cannot reset them away."""
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            with conn, contextlib.suppress(OSError):
                if self.read_request:
                    conn.settimeout(5)
                    conn.recv(4096)
                conn.sendall(self.reply)

    def _shut(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def stop(self) -> None:
        """Close the listener and wait for its thread (outside an event loop)."""
        self._shut()
        self.thread.join(5)

    async def close(self) -> None:
        """``stop`` from an event loop."""
        self._shut()
        await asyncio.to_thread(self.thread.join, 5)


def fetch_from(netns: str | None, address: str, port: int, timeout: float = 3.0) -> bytes | None:
    """Connect from ``netns`` (None: the host) and read to EOF; None when the connection fails."""
    sock = in_netns(netns, socket.socket) if netns else socket.socket()
    sock.settimeout(timeout)
    try:
        sock.connect((address, port))
        data = b""
        while part := sock.recv(4096):
            data += part
        return data
    except OSError:
        return None
    finally:
        sock.close()


async def close_all(opened: list[Any], env_ids: list[str]) -> None:
    """Close what a test opened, last first (relays before the services they connect to), then remove the route
    domains of ``env_ids``."""
    for item in reversed(opened):
        if isinstance(item, asyncio.Server):
            item.close()
            await item.wait_closed()
        elif isinstance(item, asyncio.BaseTransport):
            item.close()
        else:
            await item.close()
    await asyncio.sleep(0)
    for env_id in env_ids:
        await remove_domain(env_id)
