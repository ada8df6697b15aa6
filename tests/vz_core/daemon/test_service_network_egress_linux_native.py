"""Egress through the real `vz` (CLI, daemon, linux_native plugin, real Machines) into a test-made internet.

The test creates a namespace standing in for the internet, joined to the host by a veth pair, routes
203.0.113.0/24 (a documentation range) through it, and runs a DNS upstream on the host's 127.0.0.1 that the
daemon forwards to (``VZ_NETWORK_DNS_UPSTREAMS``). A version 2 Environment of three linux_native Machines:
``app`` (allowed), ``lst`` (an allowlist of one domain name) and ``off`` (offline, the default). Checked: app
reaches the public destination, off nothing, lst a listed name's address only once it resolved that name (and
no longer after the entry expired), never another name; a restarted daemon forwards again; a host table lost
(a killed `vz up`) comes back with the next `vz up`; no Machine reaches a host listener on 0.0.0.0 at any host
address; a network the host joins while the Environment runs is listed in its host table by the daemon within
a second, its directly connected address never reached (what the host routes through it is); `vz delete`
leaves no uplink end, host table or route domain.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vz_drivers"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "network"))
from netns_kit import listed, run
from topology_testlib import ProjectVz

from vz_core.daemon import stop_daemon
from vz_core.network import domain_exists, host_table, remove_domain, uplink_name

pytestmark = [pytest.mark.root, pytest.mark.slow]

PUBLIC, BY_NAME, OTHER = "203.0.113.10", "203.0.113.60", "203.0.113.70"
NAMES = {"api.example.com": BY_NAME, "other.example.com": OTHER, "public.example.org": PUBLIC}
TTL = 2


class _Upstream:
    """A DNS server on 127.0.0.1 answering NAMES (A, TTL 2), NXDOMAIN otherwise; counts queries per name."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.asked: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(2048)
            except (TimeoutError, OSError):
                continue
            offset, labels = 12, []
            while data[offset]:
                labels.append(data[offset + 1 : offset + 1 + data[offset]].decode())
                offset += 1 + data[offset]
            name, end = ".".join(labels).lower(), offset + 5
            self.asked[name] = self.asked.get(name, 0) + 1
            qtype = struct.unpack_from("!H", data, offset + 1)[0]
            address = NAMES.get(name)
            answers = b""
            if address is not None and qtype == 1:
                answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, TTL, 4) + ipaddress.IPv4Address(address).packed
            flags = 0x8180 if address is not None else 0x8183
            head = data[:2] + struct.pack("!HHHHH", flags, 1, 1 if answers else 0, 0, 0)
            self.sock.sendto(head + data[12:end] + answers, addr)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _in_netns(path: str, fn: Callable[[], socket.socket]) -> socket.socket:
    """``fn`` on a fresh thread joined to the namespace at ``path`` (the socket it makes stays in it)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    sock: socket.socket = box["value"]
    return sock


class _Internet:
    """The test's internet: a namespace with 203.0.113.x listeners answering ``inet`` and counting connections."""

    def __init__(self, tag: str) -> None:
        self.name = f"vzt{tag}-inet"
        self.host_end = f"vzt{tag}h"
        self.hits: dict[str, int] = {}
        self._socks: list[socket.socket] = []
        run("ip", "netns", "add", self.name)
        run("ip", "link", "add", self.host_end, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        run("ip", "addr", "add", "198.51.100.1/30", "dev", self.host_end)
        run("ip", "link", "set", self.host_end, "up")
        batch = "link set lo up\nlink set eth0 up\naddr add 198.51.100.2/30 dev eth0\n"
        batch += "route add default via 198.51.100.1\n"
        batch += "".join(f"addr add {a}/32 dev lo\n" for a in (PUBLIC, BY_NAME, OTHER))
        run("ip", "-n", self.name, "-batch", "-", stdin=batch)
        run("ip", "route", "add", "203.0.113.0/24", "via", "198.51.100.2", "dev", self.host_end)
        for address in (PUBLIC, BY_NAME, OTHER):
            self._listen(address)

    def _listen(self, address: str) -> None:
        def make() -> socket.socket:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, 80))
            sock.listen(16)
            return sock

        sock = _in_netns(f"/run/netns/{self.name}", make)
        self._socks.append(sock)
        self.hits[address] = 0
        threading.Thread(target=self._serve, args=(address, sock), daemon=True).start()

    def _serve(self, address: str, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self.hits[address] += 1
            with conn:
                conn.sendall(b"inet\n")

    def close(self) -> None:
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with contextlib.suppress(RuntimeError):
            run("ip", "link", "del", self.host_end)
        with contextlib.suppress(RuntimeError):
            run("ip", "netns", "del", self.name)


class _Lan(_Internet):
    """A network the host joins while the Environment runs: 198.51.100.8/30 directly connected (the namespace's
    end, .10, listening) and 198.51.100.200 behind it, routed by the host through .10 (a gateway)."""

    CONNECTED, ROUTED = "198.51.100.10", "198.51.100.200"

    def __init__(self, tag: str) -> None:
        self.name = f"vzt{tag}-lan"
        self.host_end = f"vzt{tag}l"
        self.hits = {}
        self._socks = []
        run("ip", "netns", "add", self.name)
        run("ip", "link", "add", self.host_end, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        batch = "link set lo up\nlink set eth0 up\naddr add 198.51.100.10/30 dev eth0\n"
        batch += f"route add default via 198.51.100.9\naddr add {self.ROUTED}/32 dev lo\n"
        run("ip", "-n", self.name, "-batch", "-", stdin=batch)
        for address in (self.CONNECTED, self.ROUTED):
            self._listen(address)
        # The host joins it now: its address, the link up, a route through the namespace.
        run("ip", "addr", "add", "198.51.100.9/30", "dev", self.host_end)
        run("ip", "link", "set", self.host_end, "up")
        run("ip", "route", "add", f"{self.ROUTED}/32", "via", self.CONNECTED, "dev", self.host_end)


def _nc(target: str, port: int = 80) -> str:
    return f"nc -w 2 {target} {port} </dev/null 2>/dev/null || echo refused"


@pytest.fixture
def internet(host_ipv4_forwarding: None) -> Iterator[_Internet]:
    inet = _Internet(os.urandom(2).hex())
    try:
        yield inet
    finally:
        inet.close()


def _definition() -> dict[str, Any]:
    machine: dict[str, Any] = {"profile": "developer", "driver": "linux_native", "image": "vz:default"}
    machine["workspace"] = {"projection": "none"}
    return {
        "version": 2,
        "project_id": "netegress",
        "machines": [
            {"name": "app", **machine, "egress": "allowed"},
            {"name": "lst", **machine, "egress": {"allow": ["api.example.com"]}},
            {"name": "off", **machine},
        ],
        "default_machine": "app",
    }


def _host_addresses() -> list[str]:
    out = []
    for item in json.loads(run("ip", "-j", "-4", "addr", "show") or "[]"):
        for info in item.get("addr_info", []):
            if info.get("local") and not str(info["local"]).startswith("127."):
                out.append(str(info["local"]))
    return out


def test_egress_through_the_daemon(tmp_path: Path, internet: _Internet) -> None:
    upstream = _Upstream()
    wildcard = socket.socket()
    wildcard.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    wildcard.bind(("0.0.0.0", 0))
    wildcard.listen(16)
    wildcard.setblocking(False)
    port = int(wildcard.getsockname()[1])
    project = tmp_path / "project"
    project.mkdir()
    (project / "vz.json").write_text(json.dumps(_definition()))
    extra = {
        "VZ_NETWORK_DNS_UPSTREAMS": f"127.0.0.1:{upstream.port}",
        "VZ_NETWORK_DNS_MIN_TTL": "1",
        "VZ_NETWORK_DNS_MAX_TTL": str(TTL),
    }
    vz = ProjectVz(tmp_path / "home", project)
    vz.environ.update(extra)
    env_id = ""
    lan: _Lan | None = None
    try:
        vz.ok("up")
        env_id = vz.status()["id"]
        assert uplink_name(env_id) in run("ip", "-o", "link")
        assert host_table(env_id) in run("nft", "list", "tables")

        assert vz.sh("app", _nc(PUBLIC)) == "inet"
        assert vz.sh("app", _nc("public.example.org")) == "inet"  # resolved through the host's resolver
        assert internet.hits[PUBLIC] == 2
        assert vz.sh("off", _nc(PUBLIC)) == "refused"
        assert "refused" in vz.sh("off", "nslookup public.example.org 2>&1 || echo refused")
        assert internet.hits[PUBLIC] == 2

        # A network the host joins now: the daemon lists it in the host table within a second; the Machine never
        # reaches its directly connected address, and reaches what the host routes through it.
        table = host_table(env_id)
        lan = _Lan(os.urandom(2).hex())
        joined = time.monotonic()
        while not listed(table, "connected", lan.CONNECTED) and time.monotonic() < joined + 3:
            time.sleep(0.02)
        took = time.monotonic() - joined
        assert listed(table, "connected", lan.CONNECTED) and took < 1.0, f"listed after {took:.2f} s"
        assert vz.sh("app", _nc(lan.CONNECTED)) == "refused"
        assert vz.sh("app", _nc(lan.ROUTED)) == "inet"
        assert lan.hits == {lan.CONNECTED: 0, lan.ROUTED: 1}
        lan.close()
        lan = None

        # The allowlist: the name's address only after the name was resolved, until it expires; no other name.
        assert vz.sh("lst", _nc(BY_NAME)) == "refused"
        assert vz.sh("lst", _nc(PUBLIC)) == "refused"
        asked = upstream.asked.get("other.example.com", 0)
        assert vz.sh("lst", _nc("other.example.com")) == "refused"
        assert upstream.asked.get("other.example.com", 0) == asked  # refused by the Environment's resolver
        assert vz.sh("lst", _nc("api.example.com")) == "inet"
        assert vz.sh("lst", _nc(BY_NAME)) == "inet"  # admitted for the name's TTL
        assert internet.hits == {PUBLIC: 2, BY_NAME: 2, OTHER: 0}
        time.sleep(TTL + 1.5)
        assert vz.sh("lst", _nc(BY_NAME)) == "refused"
        assert internet.hits[BY_NAME] == 2

        # A restarted daemon forwards again (restored at its start); a `vz up` killed before the host table was
        # written is converged by the next one.
        stop_daemon(vz.home, environ=vz.environ)
        assert vz.sh("lst", _nc("api.example.com")) == "inet"
        assert internet.hits[BY_NAME] == 3
        run("nft", "delete", "table", "inet", host_table(env_id))
        vz.ok("up")
        assert "masquerade" in run("nft", "list", "table", "inet", host_table(env_id))
        assert vz.sh("app", _nc(PUBLIC)) == "inet"

        # Never the host: a listener on 0.0.0.0 at every host address, nor the uplink's host end.
        for address in _host_addresses():
            for machine in ("app", "lst", "off"):
                assert vz.sh(machine, _nc(address, port)) == "refused", (machine, address)
        with pytest.raises(BlockingIOError):
            wildcard.accept()

        vz.ok("delete")
        assert not domain_exists(env_id)
        assert uplink_name(env_id) not in run("ip", "-o", "link")
        assert host_table(env_id) not in run("nft", "list", "tables")
    finally:
        if lan is not None:
            lan.close()
        wildcard.close()
        upstream.close()
        vz.run("delete")
        if env_id and domain_exists(env_id):
            import asyncio

            asyncio.run(remove_domain(env_id))
        stop_daemon(vz.home, environ=vz.environ)
