"""A test destination for the egress cases: a TCP listener in a network namespace the suite creates.

The namespace is reached from the host through a veth pair with a private /30, and the listener's address
(198.18.x.2, of the benchmarking range) is routed by the host through the namespace's end of that pair, as an
outside destination is routed through a gateway: vz's egress never reaches a network directly connected to the
host (docs/network.md), so a directly connected listener would not stand for "the internet". IPv6 is disabled on
both ends so the packet counter of the namespace side only moves when something really sends to it. Needs root and
``ip`` (iproute2); everything is removed on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Destination", "destination"]

_LISTENER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0))
s.listen(16)
print("listening", s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(5)
    data = b""
    try:
        while len(data) < 4096:
            part = c.recv(4096)
            if not part:
                break
            data += part
    except OSError:
        pass
    c.close()
    print("received", data.hex() or "-", flush=True)
"""


@dataclass
class Destination:
    """Where a Machine should (or should not) be able to connect, and what arrived there."""

    host: str
    port: int
    namespace: str
    peer_interface: str
    received: list[bytes] = field(default_factory=list)

    def rx_packets(self) -> int:
        out = _ip("netns", "exec", self.namespace, "cat", f"/sys/class/net/{self.peer_interface}/statistics/rx_packets")
        return int(out.strip())


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _free_subnet() -> int:
    used = _ip("-4", "addr")
    for _ in range(200):
        third = random.randrange(0, 256)
        if f"10.251.{third}." not in used and f"198.18.{third}." not in used:
            return third
    raise RuntimeError("no free 10.251.x.0/30 subnet for the egress test destination")


@contextlib.asynccontextmanager
async def destination() -> AsyncIterator[Destination]:
    """Create the namespace, veth pair and listener; yield the destination; remove everything."""
    if os.geteuid() != 0:
        raise RuntimeError("the egress cases create a network namespace and need root")
    tag = secrets.token_hex(3)
    namespace, host_if, peer_if = f"vzc-{tag}", f"vzch{tag}", f"vzcp{tag}"
    third = _free_subnet()
    host_ip, peer_ip, listen_ip = f"10.251.{third}.1", f"10.251.{third}.2", f"198.18.{third}.2"
    listener: asyncio.subprocess.Process | None = None
    reader: asyncio.Task[None] | None = None
    try:
        _ip("netns", "add", namespace)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        _ip("link", "set", peer_if, "netns", namespace)
        for path in (Path(f"/proc/sys/net/ipv6/conf/{host_if}/disable_ipv6"),):
            with contextlib.suppress(OSError):
                path.write_text("1")
        _ip("netns", "exec", namespace, "sh", "-c", f"echo 1 > /proc/sys/net/ipv6/conf/{peer_if}/disable_ipv6 || true")
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", namespace, "addr", "add", f"{peer_ip}/30", "dev", peer_if)
        _ip("-n", namespace, "link", "set", peer_if, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "addr", "add", f"{listen_ip}/32", "dev", "lo")
        _ip("route", "add", f"{listen_ip}/32", "via", peer_ip, "dev", host_if)
        listener = await asyncio.create_subprocess_exec(
            "ip",
            "netns",
            "exec",
            namespace,
            sys.executable,
            "-c",
            _LISTENER,
            listen_ip,
            stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        assert listener.stdout is not None
        first = await asyncio.wait_for(listener.stdout.readline(), 10)
        parts = first.decode().split()
        if len(parts) != 2 or parts[0] != "listening":
            raise RuntimeError(f"the egress test listener did not start: {first!r}")
        dest = Destination(listen_ip, int(parts[1]), namespace, peer_if)

        async def read_lines() -> None:
            assert listener is not None and listener.stdout is not None
            while line := await listener.stdout.readline():
                fields = line.decode().split()
                if len(fields) == 2 and fields[0] == "received":
                    dest.received.append(b"" if fields[1] == "-" else bytes.fromhex(fields[1]))

        reader = asyncio.create_task(read_lines())
        yield dest
    finally:
        if listener is not None and listener.returncode is None:
            listener.kill()
            await listener.wait()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", host_if)
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", namespace)
