"""The daemon's network parts through the real `vz` (CLI, daemon, linux_native plugin, real Machines).

A version 2 Environment of two Machines: ``app`` exports its http service to the host and imports one host
loopback port; ``db`` declares neither. Checked: the export answers on 127.0.0.1 at the port `vz status` shows
(and on no other host address), the import reaches the host listener from ``app`` by name
(``host.vz.internal``, through the Environment's DNS) and never from ``db``; `vz stop` closes both and `vz up`
brings the export back on the same port; a restarted daemon serves them again; `vz delete` leaves no listener.
Host-side traffic stays on loopback (and the host's own addresses); everything else is in the route domain.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vz_drivers"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "network"))
from relay_testlib import HostService, free_port
from topology_testlib import ProjectVz, vz_project

from vz_core.daemon import stop_daemon
from vz_core.network import domain_exists

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _definition(export_port: int, host_port: int) -> dict[str, Any]:
    machine = {"profile": "developer", "driver": "linux_native", "image": "vz:default"}
    return {
        "version": 2,
        "project_id": "netexport",
        "machines": [
            {
                "name": "app",
                **machine,
                "workspace": {"projection": "none"},
                "services": [{"name": "http", "port": 8080}],
            },
            {"name": "db", **machine, "workspace": {"projection": "none"}},
        ],
        "exports": [{"machine": "app", "service": "http", "host_port": export_port}],
        "imports": [{"machine": "app", "host_port": host_port, "port": 7000}],
        "default_machine": "app",
    }


def _fetch(address: str, port: int) -> bytes | None:
    try:
        with socket.create_connection((address, port), timeout=5) as sock:
            sock.sendall(b"ping\n")
            data = b""
            while part := sock.recv(4096):
                data += part
            return data or None
    except OSError:
        return None


def _reach(address: str, port: int, seconds: float = 10.0) -> bytes | None:
    """``_fetch`` until it gets an answer (a Machine's listener just started may not be accepting yet)."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        got = _fetch(address, port)
        if got is not None or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _host_addresses() -> list[str]:
    out = ["127.0.0.2"]
    data = json.loads(subprocess.check_output(["ip", "-j", "-4", "addr", "show"]) or b"[]")
    for item in data:
        for info in item.get("addr_info", []):
            if info.get("local") and not info["local"].startswith("127."):
                out.append(info["local"])
    return out


SERVE = (
    "printf '#!/bin/sh\\necho from-app\\n' > /tmp/reply.sh; chmod +x /tmp/reply.sh; "
    "setsid nc -ll -p 8080 -e /tmp/reply.sh </dev/null >/dev/null 2>&1 &"
)
WAIT = "for i in $(seq 50); do netstat -ltn | grep -q ':8080 ' && exit 0; sleep 0.1; done; exit 1"
IMPORT = "nc -w 3 host.vz.internal 7000 </dev/null 2>&1 || echo refused"


def _serve_app(vz: ProjectVz) -> None:
    vz.ok("exec", "--machine", "app", "--", "sh", "-c", SERVE)
    vz.ok("exec", "--machine", "app", "--", "sh", "-c", WAIT)


def test_exports_and_imports_through_the_daemon(tmp_path: Path) -> None:
    preferred, host_port = free_port(), free_port()
    outside = HostService(host_port, b"from the host\n")
    with contextlib.ExitStack() as stack:
        stack.callback(outside.stop)
        vz = stack.enter_context(vz_project(tmp_path, _definition(preferred, host_port)))
        vz.up()
        env = vz.status()
        env_id = env["id"]
        assert domain_exists(env_id)
        assert env["endpoints"] == [
            {"machine": "app", "service": "http", "protocol": "tcp", "host": "127.0.0.1", "port": preferred}
        ]
        _serve_app(vz)
        assert _reach("127.0.0.1", preferred) == b"from-app\n"
        for address in _host_addresses():
            assert _fetch(address, preferred) is None, address

        # The import: app reaches the host port by name; db neither resolves nor reaches it.
        assert vz.ok("exec", "--machine", "app", "--", "sh", "-c", IMPORT).strip() == "from the host"
        assert outside.hits == 1
        got = vz.ok("exec", "--machine", "db", "--", "sh", "-c", IMPORT).strip()
        assert "from the host" not in got and outside.hits == 1
        gateway = vz.ok("exec", "--machine", "app", "--", "sh", "-c", "awk '/nameserver/ {print $2}' /etc/resolv.conf")
        probe = f"nc -w 3 {gateway.strip()} 7000 </dev/null 2>&1 || echo refused"
        assert "from the host" not in vz.ok("exec", "--machine", "db", "--", "sh", "-c", probe)
        assert outside.hits == 1

        # Stop: nothing listens; up: the same port again.
        vz.ok("stop")
        assert _fetch("127.0.0.1", preferred) is None
        assert "endpoints" not in vz.status()
        vz.ok("up")
        assert vz.status()["endpoints"][0]["port"] == preferred
        _serve_app(vz)
        assert _reach("127.0.0.1", preferred) == b"from-app\n"

        # A restarted daemon serves them again (Machines kept running).
        stop_daemon(vz.home, environ=vz.environ)
        assert _fetch("127.0.0.1", preferred) is None
        assert vz.status()["endpoints"][0]["port"] == preferred  # the status call started a new daemon
        _serve_app(vz)  # (the listener in app keeps running, or is started again)
        assert _reach("127.0.0.1", preferred) == b"from-app\n"
        assert vz.ok("exec", "--machine", "app", "--", "sh", "-c", IMPORT).strip() == "from the host"

        vz.ok("delete")
        assert not domain_exists(env_id)
        assert _fetch("127.0.0.1", preferred) is None
