"""examples/two-machines runs as its README says, through the real `vz` (CLI, daemon, linux_native plugin).

The example is copied as it is (its scripts keep their modes); only its import's host port is moved to a free
port, so a host service already on 11434 cannot answer in its place (the Machine still connects to
``host.vz.internal:11434``). Checked, with values made up by the test so nothing can pass by accident:

* `vz up` alone starts db's kv and app's http (their vz.json commands, app's once kv is healthy): no `vz exec`;
  again after `vz stop` / `vz up`, after the daemon was SIGKILLed (the services keep running under their
  Machines' agents and the next `vz status` reports them), and after `vz up --recreate`;
* app stores a value in db and reads it back by name over the one declared path (``db:5984``, service kv);
* the host reads it through the export of app's web server at the port `vz status --json` shows (app's page
  asks db by name), on 127.0.0.1 only;
* the import: app reaches the host's loopback service at ``host.vz.internal:11434``; db neither resolves the
  name nor reaches the relay through its gateway; the host service counts exactly app's connections;
* what is not declared is refused: db → app (by name and by address), app → a second port db really listens
  on, and (egress ``offline``) a name outside the Environment;
* `vz delete` removes the route domain and the export.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from vz_core.daemon import stop_daemon
from vz_core.network import domain_exists, remove_domain

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_drivers"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_core" / "network"))
from relay_testlib import HostService
from topology_testlib import ProjectVz

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "two-machines"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sh(vz: ProjectVz, machine: str, script: str) -> str:
    """``script`` in ``machine``: its stdout and stderr together (what a user sees), whatever its exit."""
    proc = vz.run("exec", "--machine", machine, "--", "sh", "-c", script)
    return proc.stdout + proc.stderr


def _http_get(port: int, path: str, address: str = "127.0.0.1") -> str | None:
    """The body of ``GET path`` (None when the connection is refused or gives no answer)."""
    try:
        with socket.create_connection((address, port), timeout=5) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: app\r\n\r\n".encode())
            data = b""
            while part := sock.recv(4096):
                data += part
    except OSError:
        return None
    _, _, body = data.partition(b"\r\n\r\n")
    return body.decode(errors="replace") if data else None


def _until(probe: Any, seconds: float = 10.0) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = probe()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _copy_example(project: Path, import_port: int) -> dict[str, Any]:
    shutil.copytree(EXAMPLE, project)
    definition: dict[str, Any] = json.loads((EXAMPLE / "vz.json").read_text())
    (imp,) = definition["imports"]
    assert imp == {"machine": "app", "host_port": 11434}, "the README and this test describe this import"
    definition["imports"] = [{"machine": "app", "host_port": import_port, "port": 11434}]
    definition.pop("$schema", None)
    (project / "vz.json").write_text(json.dumps(definition, indent=2))
    return definition


WGET = "timeout 5 wget -q -O - {url} 2>&1; echo rc=$?"


def _services(env: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["name"], s["name"]): s for m in env["machines"] for s in m["services"]}


def _check_services_run(vz: ProjectVz) -> dict[tuple[str, str], dict[str, Any]]:
    """Both services run, healthy, as `vz up` left them (it waits for that before it returns)."""
    services = _services(vz.status())
    assert set(services) == {("app", "http"), ("db", "kv")}, services
    for svc in services.values():
        assert (svc["state"], svc["health"]) == ("running", "healthy"), svc
        assert svc["pid"] > 0
    return services


def test_the_two_machines_example_talks_by_name_exports_and_imports(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("examples/two-machines runs linux_native Machines: it needs root")
    import_port = _free_port()
    project = tmp_path / "two-machines"
    _copy_example(project, import_port)
    vz = ProjectVz(tmp_path / "home", project)
    greeting = f"hello-{secrets.token_hex(6)}"
    from_host = f"host-{secrets.token_hex(6)}"
    reply = f"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n{from_host}\n".encode()
    outside = HostService(import_port, reply, read_request=True)
    env_id = ""
    try:
        up = vz.ok("up", stderr=True)
        assert "setup 1/1: mkdir -p /var/lib/db/keys" in up, up
        first = _check_services_run(vz)
        env = vz.status()
        env_id = env["id"]
        assert domain_exists(env_id)
        (endpoint,) = env["endpoints"]
        assert endpoint["machine"] == "app" and endpoint["service"] == "http" and endpoint["host"] == "127.0.0.1"
        port = int(endpoint["port"])

        # The services were started by `vz up` itself: nothing is started with `vz exec`.
        listening = _sh(vz, "db", "netstat -ltn 2>/dev/null | grep -c ':5984 '").strip()
        assert listening == "1", listening

        # app → db by name, over the declared path: store, then read back.
        put = f"echo {greeting} | timeout 5 wget -q -O - --post-file=/dev/stdin 'http://db:5984/cgi-bin/kv?greeting'"
        stored = _until(lambda: "stored greeting" in _sh(vz, "app", put))
        assert stored, _sh(vz, "app", put)
        assert _sh(vz, "app", WGET.format(url="'http://db:5984/cgi-bin/kv?greeting'")) == f"{greeting}\nrc=0\n"

        # The host → the export → app's page → db by name.
        page = _until(lambda: _http_get(port, "/cgi-bin/hello"))
        assert page == f"app (development) says: {greeting}\n"
        assert _http_get(port, "/cgi-bin/hello", address="127.0.0.2") is None  # 127.0.0.1 only

        # The import: app reaches the host's loopback service by name; db does not.
        assert _sh(vz, "app", WGET.format(url="http://host.vz.internal:11434/")) == f"{from_host}\nrc=0\n"
        assert outside.hits == 1
        db_import = _sh(vz, "db", WGET.format(url="http://host.vz.internal:11434/"))
        assert "bad address" in db_import and from_host not in db_import
        gateway = _sh(vz, "db", "awk '/nameserver/ {print $2}' /etc/resolv.conf").strip()
        assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", gateway), gateway
        db_gateway = _sh(vz, "db", f"nc -w 3 {gateway} 11434 </dev/null 2>&1; echo rc=$?")
        assert from_host not in db_gateway and db_gateway.endswith("rc=1\n"), db_gateway
        assert outside.hits == 1

        # What is not declared is refused.
        app_address = _sh(vz, "app", "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1").strip()
        assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", app_address), app_address
        assert "bad address" in _sh(vz, "db", WGET.format(url="http://app:8080/cgi-bin/hello"))  # no name
        index = _sh(vz, "app", WGET.format(url=f"http://{app_address}:8080/"))
        assert "served by the Machine <code>app</code>" in index and index.endswith("rc=0\n")  # it listens...
        db_to_app = _sh(vz, "db", f"nc -w 3 {app_address} 8080 </dev/null 2>&1; echo rc=$?")
        assert "refused" in db_to_app and db_to_app.endswith("rc=1\n"), db_to_app  # ...but not for db
        vz.ok("exec", "--machine", "db", "--", "httpd", "-p", "5985", "-h", "/workspace/db")
        other = WGET.format(url="'http://{host}:5985/cgi-bin/kv?greeting'")
        assert _sh(vz, "db", other.format(host="127.0.0.1")) == f"{greeting}\nrc=0\n"  # db serves 5985 too...
        app_5985 = _sh(vz, "app", other.format(host="db"))
        assert greeting not in app_5985 and not app_5985.endswith("rc=0\n"), app_5985  # ...no path to it
        offline = _sh(vz, "app", WGET.format(url="http://example.com/"))
        assert "bad address" in offline, offline

        # The daemon dies hard: the services keep running under their Machines' agents; the next command (a new
        # daemon) reports them as they were.
        daemon = int(json.loads((vz.home / "daemon" / "daemon.json").read_text())["pid"])
        os.kill(daemon, signal.SIGKILL)
        _until(
            lambda: (
                not Path(f"/proc/{daemon}").exists() or "zombie" in Path(f"/proc/{daemon}/status").read_text().lower()
            )
        )
        after_kill = _check_services_run(vz)
        assert {k: s["pid"] for k, s in after_kill.items()} == {k: s["pid"] for k, s in first.items()}
        assert _until(lambda: _http_get(port, "/cgi-bin/hello")) == f"app (development) says: {greeting}\n"

        # vz stop, vz up: the services start again by themselves; setup does not run twice.
        vz.ok("stop")
        again = vz.ok("up", stderr=True)
        assert "setup steps unchanged" in again and "setup 1/1" not in again, again
        _check_services_run(vz)
        page = _until(lambda: _http_get(port, "/cgi-bin/hello"))
        assert page == f"app (development) says: {greeting}\n"  # db's data is in its volume

        # A creation-time change, vz up --recreate: new Machines, setup again, the services again.
        changed = json.loads((project / "vz.json").read_text())
        for machine in changed["machines"]:
            machine.setdefault("environment", {})["REVISION"] = "2"
        (project / "vz.json").write_text(json.dumps(changed, indent=2))
        recreated = vz.ok("up", "--recreate", stderr=True)
        assert "recreating machine db" in recreated and "recreating machine app" in recreated, recreated
        assert "setup 1/1: mkdir -p /var/lib/db/keys" in recreated, recreated
        _check_services_run(vz)
        page = _until(lambda: _http_get(port, "/cgi-bin/hello"))
        assert page == f"app (development) says: {greeting}\n"

        vz.ok("delete")
        assert not domain_exists(env_id)
        assert _http_get(port, "/cgi-bin/hello") is None
    finally:
        outside.stop()
        vz.run("delete")
        if env_id and domain_exists(env_id):
            import asyncio

            asyncio.run(remove_domain(env_id))
        stop_daemon(vz.home, environ=vz.environ)
