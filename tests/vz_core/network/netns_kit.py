"""Test Machines as plain network namespaces, listeners and clients inside them, and a leak inventory.

Everything here is created by the tests (namespaces named ``vzt<tag>-...``, route domains of environment ids
made up per test) and removed by the fixtures; the inventory compares the host's namespaces, links and nft
tables before and after, restricted to names these tests could have created (other work on the host may add
its own objects meanwhile).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def run(*argv: str, stdin: str = "") -> str:
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def listed(table: str, name: str, address: str) -> bool:
    """Whether the nft set ``name`` of table ``inet table`` holds ``address`` (an interval set: a network
    covering it)."""
    try:
        run("nft", "get", "element", "inet", table, name, f"{{ {address} }}")
    except RuntimeError:
        return False
    return True


def in_netns(path: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a fresh thread that first joins the network namespace at ``path`` (sockets keep it)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err))
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


@dataclass
class Listener:
    """A TCP or UDP socket in a test namespace that counts what reaches it (connections or datagrams)."""

    namespace: str
    address: str
    port: int
    protocol: str
    sock: socket.socket
    count: int = 0

    def drain(self) -> int:
        """Accept (TCP) or read (UDP) everything pending; return how many arrived since the last drain."""
        got = 0
        while True:
            try:
                if self.protocol == "tcp":
                    conn, _ = self.sock.accept()
                    conn.close()
                else:
                    self.sock.recv(2048)
            except (BlockingIOError, InterruptedError):
                break
            got += 1
        self.count += got
        return got


def listen(netns_path: str, namespace: str, address: str, port: int, protocol: str) -> Listener:
    def make() -> socket.socket:
        kind = socket.SOCK_STREAM if protocol == "tcp" else socket.SOCK_DGRAM
        sock = socket.socket(socket.AF_INET, kind)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        if protocol == "tcp":
            sock.listen(64)
        sock.setblocking(False)
        return sock

    return Listener(namespace, address, port, protocol, in_netns(netns_path, make))


def attempt(netns_path: str, address: str, port: int, protocol: str, *, timeout: float = 2.0) -> bool:
    """From the namespace at ``netns_path``: True when a TCP connect succeeds / a UDP datagram could be sent."""

    def make() -> socket.socket:
        kind = socket.SOCK_STREAM if protocol == "tcp" else socket.SOCK_DGRAM
        return socket.socket(socket.AF_INET, kind)

    sock = in_netns(netns_path, make)
    sock.settimeout(timeout)
    try:
        if protocol == "tcp":
            sock.connect((address, port))
        else:
            sock.sendto(b"vz-test", (address, port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


@dataclass
class Namespaces:
    """Test namespaces (the stand-ins for Machines), removed at the end."""

    tag: str
    created: list[str] = field(default_factory=list)

    def add(self, name: str) -> str:
        full = f"vzt{self.tag}-{name}"
        run("ip", "netns", "add", full)
        self.created.append(full)
        run("ip", "-n", full, "link", "set", "lo", "up")
        return f"/run/netns/{full}"

    def remove(self, full: str) -> None:
        if os.path.lexists(f"/run/netns/{full}"):
            run("ip", "netns", "del", full)
        if full in self.created:
            self.created.remove(full)


def inventory() -> dict[str, set[str]]:
    namespaces = {line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip()}
    links = {item["ifname"] for item in json.loads(run("ip", "-j", "link", "show") or "[]")}
    tables = {
        f"{t['table']['family']} {t['table']['name']}"
        for t in json.loads(run("nft", "-j", "list", "tables"))["nftables"]
        if "table" in t
    }
    return {"namespaces": namespaces, "links": links, "tables": tables}


def ours(inv: dict[str, set[str]], tag: str, domains: set[str]) -> dict[str, set[str]]:
    return {
        "namespaces": {n for n in inv["namespaces"] if n.startswith(f"vzt{tag}") or n in domains},
        # the realization never creates anything in the host's namespace: any v<hex> / vzt link would be a leak
        "links": {n for n in inv["links"] if n.startswith(f"vzt{tag}") or re.fullmatch(r"v[0-9a-f]{10}", n)},
        "tables": {t for t in inv["tables"] if t == "inet vz"},
    }
