"""#26 item 6: a version 1 Machine's egress (``allow``, the default) never reaches the host.

Black-box through the real `vz` (CLI, daemon, linux_native plugin, real Machines) with its own VZ_HOME. The test
makes its own "internet": a namespace joined to the host by a veth pair (198.51.100.0/30, directly connected),
with 203.0.113.10 (a documentation address) and 169.254.201.9 (link-local) on its loopback, both routed by the
host through the namespace's end (a gateway), each with a listener counting connections. On the host, a TCP
service on 0.0.0.0 (and [::]) at a free port. A version 1 project with one Machine of egress ``allow``, in two
projects (so two Environments, of one daemon); the other one's Machine serves HTTP on its own address.

From the first project's Machine: the host service is refused at its gateway address, at every other address of the
host (every interface, the other Machine's host end and the test's veth included) and at an address the host
gains while the Machine runs; the other Environment's service is refused (the other Machine reaches it itself);
the link-local destination is refused and never sees a connection, nor does the host's IPv6 link-local address
of the Machine's link answer; the external destination still answers. On the code before the fix every host
address answered (the Machine's gateway first), and the link-local destination too.

The qemu case: the same contract for a version 1 qemu Machine (QEMU user networking, a real VM under TCG): the
test's listeners on 127.0.0.1 and 0.0.0.0 are refused at slirp's 10.0.2.2 and at every host address, the routed
link-local destination too, and the outside destination answers; QEMU runs in a namespace that is not the
host's. On the code before the fix all of them answered.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_drivers"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_core" / "network"))
from netns_kit import in_netns, run
from topology_testlib import ProjectVz

from vz_core.daemon import stop_daemon

pytestmark = [pytest.mark.root, pytest.mark.slow]

EXTERNAL, LINK_LOCAL, ADDED = "203.0.113.10", "169.254.201.9", "198.51.100.129"


class _Internet:
    """The test's internet namespace: EXTERNAL and LINK_LOCAL on its loopback, routed by the host through it;
    a listener on port 80 of each answering ``inet`` and counting connections."""

    def __init__(self, tag: str) -> None:
        self.name = f"vzt{tag}-inet"
        self.host_end = f"vzt{tag}h"
        self.hits: dict[str, int] = {}
        self._socks: list[socket.socket] = []
        run("ip", "netns", "add", self.name)
        run("ip", "link", "add", self.host_end, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        run("ip", "addr", "add", "198.51.100.1/30", "dev", self.host_end)
        run("ip", "link", "set", self.host_end, "up")
        batch = (
            "link set lo up\nlink set eth0 up\naddr add 198.51.100.2/30 dev eth0\nroute add default via 198.51.100.1\n"
        )
        batch += f"addr add {EXTERNAL}/32 dev lo\naddr add {LINK_LOCAL}/32 dev lo\n"
        run("ip", "-n", self.name, "-batch", "-", stdin=batch)
        for address in (EXTERNAL, LINK_LOCAL):
            run("ip", "route", "add", f"{address}/32", "via", "198.51.100.2", "dev", self.host_end)
            self._listen(address)

    def _listen(self, address: str) -> None:
        def make() -> socket.socket:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, 80))
            sock.listen(16)
            return sock

        sock = in_netns(f"/run/netns/{self.name}", make)
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
            run("ip", "link", "del", self.host_end)  # its routes go with it
        with contextlib.suppress(RuntimeError):
            run("ip", "netns", "del", self.name)


def _host_service() -> tuple[socket.socket, socket.socket, int]:
    """A TCP listener on 0.0.0.0 at a free port and one on [::] (IPv6 only) at the same port, non-blocking."""
    v4 = socket.socket()
    v4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    v4.bind(("0.0.0.0", 0))
    v4.listen(16)
    v4.setblocking(False)
    port = int(v4.getsockname()[1])
    v6 = socket.socket(socket.AF_INET6)
    v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    v6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    v6.bind(("::", port))
    v6.listen(16)
    v6.setblocking(False)
    return v4, v6, port


def _host_addresses() -> list[str]:
    """Every IPv4 address of the host but loopback (inside a Machine, 127.0.0.1 is the Machine's own)."""
    out = []
    for item in json.loads(run("ip", "-j", "-4", "addr", "show") or "[]"):
        for info in item.get("addr_info", []):
            if info.get("local") and not str(info["local"]).startswith("127."):
                out.append(str(info["local"]))
    return out


def _link_of(address: str) -> str:
    """The host's link holding ``address``."""
    for item in json.loads(run("ip", "-j", "-4", "addr", "show") or "[]"):
        if any(info.get("local") == address for info in item.get("addr_info", [])):
            return str(item["ifname"])
    raise AssertionError(f"no host link holds {address}")


def _link_local_v6(link: str) -> list[str]:
    data = json.loads(run("ip", "-j", "-6", "addr", "show", "dev", link) or "[]")
    return [str(i["local"]) for item in data for i in item.get("addr_info", []) if i.get("scope") == "link"]


def _nc(target: str, port: int) -> str:
    """What a connection to ``target`` answers (its first line), ``connected`` when it connects and answers nothing
    (a listener that never accepts: nc waits until ``timeout`` ends it), else ``refused``."""
    return (
        f"out=$(timeout 4 nc -w 2 {target} {port} </dev/null 2>/dev/null); rc=$?; "
        'if [ -n "$out" ]; then echo "$out" | head -n 1; elif [ $rc -ge 124 ]; then echo connected; '
        "else echo refused; fi"
    )


@pytest.fixture
def internet(host_ipv4_forwarding: None) -> Iterator[_Internet]:
    inet = _Internet(os.urandom(2).hex())
    try:
        yield inet
    finally:
        inet.close()


def test_version_1_egress_reaches_outside_and_never_the_host(tmp_path: Path, internet: _Internet) -> None:
    v4, v6, port = _host_service()
    definition = {
        "version": 1,
        "project_id": "sec-r3-06",
        "machines": [
            {
                "name": "dev",
                "profile": "developer",
                "driver": "linux_native",
                "image": "vz:default",
                "workspace": {"projection": "none"},
            }
        ],
    }
    projects = {}
    for name in ("project", "other"):
        projects[name] = tmp_path / name
        projects[name].mkdir()
        (projects[name] / "vz.json").write_text(json.dumps({**definition, "project_id": f"sec-r3-06-{name}"}))
    vz = ProjectVz(tmp_path / "home", projects["project"])
    other = ProjectVz(tmp_path / "home", projects["other"])  # the same daemon, another project's Environment
    added = f"vzt{os.urandom(2).hex()}d"
    try:
        vz.ok("up")
        other.ok("up")

        # The other Environment's Machine serves HTTP on its own address, and reaches it itself.
        other_address = other.sh("dev", "ip -4 -o addr show eth0").split()[3].split("/")[0]
        other.sh("dev", "mkdir -p /tmp/www && echo other > /tmp/www/index.html && httpd -p 8080 -h /tmp/www")
        assert other.sh("dev", f"wget -q -O - http://{other_address}:8080/") == "other"

        # What the Machine sees: its gateway is one of the host's addresses, the host end of its own link.
        gateway = vz.sh("dev", "ip route | awk '/^default/ {print $3}'")
        hosts = _host_addresses()
        assert gateway in hosts and other_address not in hosts

        # The external destination (routed through a gateway of the host) still answers.
        assert vz.sh("dev", _nc(EXTERNAL, 80)) == "inet"
        assert internet.hits[EXTERNAL] == 1

        # Never the host: its service on 0.0.0.0 at the gateway and at every other address of the host, one
        # added while the Machine runs included.
        run("ip", "link", "add", added, "type", "veth", "peer", "name", added[:-1] + "e")
        run("ip", "addr", "add", f"{ADDED}/32", "dev", added)
        run("ip", "link", "set", added, "up")
        targets = [gateway, *(a for a in _host_addresses() if a != gateway)]
        assert ADDED in targets and "198.51.100.1" in targets
        answered = {}  # every probe that was not refused: what it printed
        for address in targets:
            answered[f"host {address}:{port}"] = vz.sh("dev", _nc(address, port))
        # Nor over IPv6: the host's link-local address on the Machine's link, if it has one.
        for address in _link_local_v6(_link_of(gateway)):
            answered[f"host [{address}%eth0]:{port}"] = vz.sh("dev", _nc(f"{address}%eth0", port))
        # Never another Environment's Machine.
        answered[f"other Environment {other_address}:8080"] = vz.sh("dev", _nc(other_address, 8080))
        # Never link-local, even where the host routes it.
        answered[f"link-local {LINK_LOCAL}:80"] = vz.sh("dev", _nc(LINK_LOCAL, 80))
        answered = {k: v for k, v in answered.items() if v != "refused"}
        assert answered == {}, f"reached from a version 1 Machine: {answered}"
        for sock in (v4, v6):
            with pytest.raises(BlockingIOError):
                sock.accept()
        assert internet.hits == {EXTERNAL: 1, LINK_LOCAL: 0}  # nothing of the above went out instead
        assert other.sh("dev", f"wget -q -O - http://{other_address}:8080/") == "other"  # still serving

        other.ok("delete")
        vz.ok("delete")
    finally:
        with contextlib.suppress(RuntimeError):
            run("ip", "link", "del", added)
        v4.close()
        v6.close()
        other.run("delete")
        vz.run("delete")
        stop_daemon(vz.home, environ=vz.environ)


def _host_listener(address: str) -> socket.socket:
    """A TCP listener of the test on ``address`` at a free port that never accepts (non-blocking)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, 0))
    sock.listen(16)
    sock.setblocking(False)
    return sock


def _qemu_of(home: Path) -> list[int]:
    """The pids of the live QEMU processes of Machines under ``home``."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            cmdline = proc.cmdline()
            qemu = bool(cmdline) and Path(cmdline[0]).name.startswith("qemu-system")
            if qemu and proc.status() != psutil.STATUS_ZOMBIE and any(str(home) in arg for arg in cmdline):
                found.append(proc.pid)
    return found


def test_version_1_qemu_egress_reaches_outside_and_never_the_host(tmp_path: Path, internet: _Internet) -> None:
    """The same contract for a version 1 qemu Machine (QEMU user networking): the host's loopback (slirp's
    10.0.2.2) and its wildcard listener at every host address are refused, so is link-local; the routed outside
    destination answers. On the code before the fix QEMU's slirp made the guest's connections from the host's
    own namespace: 10.0.2.2 was the host's loopback and every host address answered."""
    loopback, wildcard = _host_listener("127.0.0.1"), _host_listener("0.0.0.0")
    lo_port, any_port = int(loopback.getsockname()[1]), int(wildcard.getsockname()[1])
    project = tmp_path / "project"
    project.mkdir()
    definition = {
        "version": 1,
        "project_id": "sec-r3-06-qemu",
        "machines": [
            {
                "name": "vm",
                "profile": "developer",
                "driver": "qemu",
                "image": "vz:default",
                "workspace": {"projection": "none"},
            }
        ],
    }
    (project / "vz.json").write_text(json.dumps(definition))
    vz = ProjectVz(tmp_path / "home", project)
    try:
        vz.ok("up")
        # QEMU runs in a network namespace that is not the host's (where slirp's connections are made).
        (qemu,) = _qemu_of(vz.home)
        assert os.readlink(f"/proc/{qemu}/ns/net") != os.readlink("/proc/self/ns/net")
        # Still QEMU user networking inside: 10.0.2.15 behind slirp's gateway 10.0.2.2.
        assert vz.sh("vm", "ip route | awk '/^default/ {print $3}'") == "10.0.2.2"

        # The outside destination (routed by the host through a gateway) answers.
        assert vz.sh("vm", _nc(EXTERNAL, 80)) == "inet"
        assert internet.hits[EXTERNAL] == 1

        answered = {
            f"host loopback via 10.0.2.2:{lo_port}": vz.sh("vm", _nc("10.0.2.2", lo_port)),
            f"host 0.0.0.0 via 10.0.2.2:{any_port}": vz.sh("vm", _nc("10.0.2.2", any_port)),
        }
        for address in _host_addresses():
            answered[f"host {address}:{any_port}"] = vz.sh("vm", _nc(address, any_port))
        answered[f"link-local {LINK_LOCAL}:80"] = vz.sh("vm", _nc(LINK_LOCAL, 80))
        answered = {k: v for k, v in answered.items() if v != "refused"}
        assert answered == {}, f"reached from a version 1 qemu Machine: {answered}"
        for sock in (loopback, wildcard):
            with pytest.raises(BlockingIOError):
                sock.accept()
        assert internet.hits == {EXTERNAL: 1, LINK_LOCAL: 0}
        assert vz.sh("vm", _nc(EXTERNAL, 80)) == "inet"  # and egress still works after the refusals

        vz.ok("delete")
        assert _qemu_of(vz.home) == []
    finally:
        loopback.close()
        wildcard.close()
        vz.run("delete")
        stop_daemon(vz.home, environ=vz.environ)
