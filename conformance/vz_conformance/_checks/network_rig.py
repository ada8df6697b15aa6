"""The host side of the ``network`` cases: route domains, stand-in Machines, an upstream and the daemon's parts.

The suite plays what ``vz up`` and the vz daemon do for a version 2 Environment, with ``vz_core.network``:

* Environment A (``suite_definition``): its route domain (``ensure_domain``) with an uplink into an upstream
  namespace the suite creates, holding an allowlisted address and another public-looking one
  (documentation ranges, only inside that namespace); two Machines of the driver under test, ``app`` (a path
  to ``db``'s ``pg``, an export, an import, egress allowlisting ``ALLOWED_CIDR``) and ``off`` (offline, one
  path: to ``other``'s ``web``), each given its ``vz.network`` label (``vz_core.network.label.machine_slice``);
  ``db`` and ``other`` stood in by network namespaces the suite attaches itself (``attach_machine``), each port
  with a listener that records what arrives; and the Environment's DNS responder, export listener and import
  relay (``NetworkHost``, as the daemon runs them), the import relaying to a suite listener on 127.0.0.1.
* Environment B: the same definition under another environment id, so the same addresses; only its ``db``,
  another listening namespace. Nothing of A may ever reach it.

Built once per run (the cases share it through ``DriverSession.share``) and removed when the run ends: the
Machines, the domains, the namespaces, the listeners. Needs root, ``ip`` (iproute2) and ``nft`` (nftables).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from vz_conformance._expect import expect_ok, fail
from vz_core import RunImageRequest

if TYPE_CHECKING:
    from vz_conformance._context import CheckContext

__all__ = [
    "ALLOWED_CIDR",
    "ALLOWED_HOST",
    "DB_ADMIN_PORT",
    "DB_PORT",
    "EXPORT_PORT",
    "OTHER_PORT",
    "UNLISTED_HOST",
    "UPSTREAM_PORT",
    "Listener",
    "Rig",
    "rig",
    "suite_definition",
]

DB_PORT = 5432
DB_ADMIN_PORT = 8081
OTHER_PORT = 8000
EXPORT_PORT = 8080
UPSTREAM_PORT = 8443
ALLOWED_CIDR = "203.0.113.0/24"
ALLOWED_HOST = "203.0.113.10"
UNLISTED_HOST = "198.51.100.10"
LISTED_NAME = "listed.vz-conformance.test"
"""The domain name ``app``'s allowlist names; the suite's DNS upstream answers it with ``NAMED_HOST``."""
NAMED_HOST = "198.51.100.20"
UNLISTED_NAME = "unlisted.vz-conformance.test"
"""A name the upstream would answer (``UNLISTED_NAMED_HOST``) but no allowlist names."""
UNLISTED_NAMED_HOST = "198.51.100.30"
NAME_TTL = 4
"""The TTL the upstream gives and the clamp of the resolver's entries: an admitted address expires after it."""
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_KEY = "network.rig"


def suite_definition(import_port: int) -> dict[str, Any]:
    """The vz.json (version 2) of the suite's Environment; ``import_port`` is the host port ``app`` imports."""
    return {
        "version": 2,
        "project_id": "vz-conformance-network",
        "machines": [
            {
                "name": "app",
                "profile": "developer",
                "driver": "under-test",
                "image": "vz:default",
                "services": [{"name": "http", "port": EXPORT_PORT}],
                "egress": {"allow": [ALLOWED_CIDR, LISTED_NAME]},
            },
            {"name": "off", "profile": "developer", "driver": "under-test", "image": "vz:default"},
            {
                "name": "db",
                "profile": "developer",
                "driver": "suite",
                "image": "vz:default",
                "services": [{"name": "pg", "port": DB_PORT}, {"name": "admin", "port": DB_ADMIN_PORT}],
            },
            {
                "name": "other",
                "profile": "developer",
                "driver": "suite",
                "image": "vz:default",
                "services": [{"name": "web", "port": OTHER_PORT}],
            },
        ],
        "paths": [{"from": "app", "to": "db", "service": "pg"}, {"from": "off", "to": "other", "service": "web"}],
        "exports": [{"machine": "app", "service": "http"}],
        "imports": [{"machine": "app", "host_port": import_port}],
    }


_LISTENER = r"""
import selectors, socket, sys
sel = selectors.DefaultSelector()
for spec in sys.argv[1:]:
    host, port = spec.rsplit(":", 1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(16)
    sel.register(s, selectors.EVENT_READ)
print("listening", flush=True)
while True:
    for key, _ in sel.select():
        c, _ = key.fileobj.accept()
        here = "%s:%d" % c.getsockname()[:2]
        c.settimeout(3)
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
        print("received", here, data.hex() or "-", flush=True)
"""


class Upstream(asyncio.DatagramProtocol):
    """The suite's DNS upstream on 127.0.0.1 (UDP): A records for ``LISTED_NAME`` and ``UNLISTED_NAME`` with TTL
    ``NAME_TTL``, no data for anything else; ``asked`` records every name it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram endpoint's transport

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        if len(data) < 12 or data[2] & 0x80 or self.transport is None:
            return
        labels, offset = [], 12
        while offset < len(data) and data[offset]:
            size = data[offset]
            labels.append(data[offset + 1 : offset + 1 + size].decode(errors="replace").lower())
            offset += 1 + size
        question_end = offset + 5
        if question_end > len(data):
            return
        name = ".".join(labels)
        qtype = int.from_bytes(data[offset + 1 : offset + 3], "big")
        self.asked.append(name)
        address = {LISTED_NAME: NAMED_HOST, UNLISTED_NAME: UNLISTED_NAMED_HOST}.get(name)
        answers = b""
        if address is not None and qtype == 1:
            rdata = socket.inet_aton(address)
            answers = b"\xc0\x0c" + (1).to_bytes(2, "big") + (1).to_bytes(2, "big") + NAME_TTL.to_bytes(4, "big")
            answers += len(rdata).to_bytes(2, "big") + rdata
        flags = (0x8180 | (data[2] & 0x01) << 8).to_bytes(2, "big")
        header = data[:2] + flags + data[4:6] + (1 if answers else 0).to_bytes(2, "big") + b"\0\0\0\0"
        self.transport.sendto(header + data[12:question_end] + answers, addr)


async def start_upstream() -> tuple[Upstream, int]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(Upstream, local_addr=("127.0.0.1", 0))
    port: int = transport.get_extra_info("sockname")[1]
    return protocol, port


_CONNECT = r"""
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    c.sendall(b"vz-conformance\n")
    c.close()
except OSError as exc:
    print(exc, flush=True)
    sys.exit(1)
"""


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Listener:
    """A process listening on ``(address, port)`` pairs (inside ``namespace``, or the host's when None); what
    arrived, per ``address:port``."""

    namespace: str | None
    process: asyncio.subprocess.Process
    received: list[tuple[str, bytes]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    def count(self, where: str) -> int:
        return sum(1 for here, _ in self.received if here == where)

    def got(self, where: str, marker: bytes = b"vz-conformance") -> bool:
        return any(here == where and marker in data for here, data in self.received)

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader


async def listen(namespace: str | None, *where: str) -> Listener:
    argv = [sys.executable, "-c", _LISTENER, *where]
    if namespace is not None:
        argv = ["ip", "netns", "exec", namespace, *argv]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 15)
    if first.strip() != b"listening":
        err = await proc.stderr.read()
        await proc.wait()
        raise RuntimeError(f"a test listener on {where} did not start: {err.decode(errors='replace')[-500:]}")
    listener = Listener(namespace, proc)

    async def read_lines() -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            parts = line.decode().split()
            if len(parts) == 3 and parts[0] == "received":
                listener.received.append((parts[1], b"" if parts[2] == "-" else bytes.fromhex(parts[2])))

    listener.reader = asyncio.create_task(read_lines())
    return listener


async def connect_from(namespace: str, host: str, port: int) -> bool:
    """Whether a TCP connection from inside ``namespace`` to host:port (sending the probe line) works."""
    proc = await asyncio.create_subprocess_exec(
        "ip",
        "netns",
        "exec",
        namespace,
        sys.executable,
        "-c",
        _CONNECT,
        host,
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        stdin=asyncio.subprocess.DEVNULL,
    )
    return await asyncio.wait_for(proc.wait(), 15) == 0


def _env_id() -> str:
    return "env_" + "".join(secrets.choice(_ALPHABET) for _ in range(12))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _free_uplink() -> str:
    used = _ip("-4", "addr") + _ip("-4", "route")
    for _ in range(200):
        third = random.randrange(0, 256)
        fourth = random.randrange(0, 64) * 4
        net = f"10.252.{third}.{fourth}"
        if f"10.252.{third}." not in used:
            return f"{net}/30"
    raise RuntimeError("no free 10.252.x.y/30 network for the suite's uplink")


@dataclass
class Rig:
    """Everything the ``network`` cases look at (see the module docstring)."""

    plan: dict[str, Any]
    plan_b: dict[str, Any]
    machines: dict[str, str]
    """Machine name -> workspace id of the driver's Machines (``app``, ``off``)."""
    requests: dict[str, RunImageRequest]
    upstream: str
    namespaces: dict[str, str]
    """``db``, ``other`` (Environment A) and ``db_b`` (Environment B) -> their namespace."""
    listeners: dict[str, Listener]
    """``db``, ``other``, ``db_b``, ``upstream``, ``host`` (the import's target on 127.0.0.1)."""
    import_port: int
    export_port: int
    host: Any
    """The ``vz_core.network.NetworkHost`` running A's DNS responder, export listener and import relay."""
    dns_upstream: Upstream

    def entry(self, machine: str) -> dict[str, Any]:
        return next(m for m in self.plan["machines"] if m["name"] == machine)

    def address(self, machine: str) -> str:
        return str(self.entry(machine)["attachments"][0]["address"])

    def gateway(self, machine: str) -> str:
        return str(self.entry(machine)["attachments"][0]["gateway"])

    async def ensure_parts(self) -> None:
        """(Re)start A's DNS responder, export listener and import relay, as the daemon does after an up."""
        endpoints = await self.host.ensure(self.plan, ports={("app", "http"): self.export_port})
        ports = [e.port for e in endpoints if (e.machine, e.service) == ("app", "http")]
        if ports != [self.export_port]:
            raise RuntimeError(f"the export of app/http listens on {ports}, not {self.export_port}")


async def rig(ctx: CheckContext) -> Rig:
    """The run's shared rig, built by the first ``network`` case that needs it (a failure to build it fails that
    case and every later one with the same text)."""
    found = ctx.session.shared(_KEY)
    if isinstance(found, Rig):
        return found
    if isinstance(found, str):
        fail("network rig", "the suite's Environment built", found)
    try:
        built = await _build(ctx)
    except asyncio.CancelledError:
        # The case ran out of time while the rig was built: later cases fail at once rather than build a second
        # rig next to the first one's teardown.
        ctx.session.share(_KEY, "not built within the time limit of the first network case", _nothing)
        raise
    except AssertionError as exc:
        ctx.session.share(_KEY, str(exc), _nothing)
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        ctx.session.share(_KEY, text, _nothing)
        fail("network rig", "the suite's Environment built (route domains, namespaces, Machines)", text)
    return built


async def _nothing() -> None:
    return None


def requirements() -> str | None:
    """Why the host cannot run the ``network`` cases (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "the network cases build Linux route domains (vz_core.network); run them on a Linux host"
    if os.geteuid() != 0:
        return "the network cases create network namespaces and nft tables: run the suite as root"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"the network cases need {', '.join(missing)} (iproute2, nftables) on PATH"
    return None


def label_request(ctx: CheckContext, plan: dict[str, Any], machine: str, workspace_id: str) -> RunImageRequest:
    from vz_core.network.label import LABEL, machine_slice

    value = machine_slice(plan, machine)
    assert value is not None
    base = ctx.adapter.unique_request(workspace_id, f"net-{machine}")
    return replace(base, labels=(*base.labels, f"{LABEL}={value}"))


async def _build(ctx: CheckContext) -> Rig:
    from vz_core.env import compile_topology, parse_definition
    from vz_core.network import NetworkHost, Uplink, attach_machine, ensure_domain, remove_domain

    undo: list[Callable[[], Any]] = []

    async def unwind() -> None:
        while undo:
            step = undo.pop()
            with contextlib.suppress(Exception):
                result = step()
                if asyncio.iscoroutine(result):
                    await result

    try:
        import_port = _free_port()
        definition = parse_definition(suite_definition(import_port))
        env_a, env_b = _env_id(), _env_id()
        plan = json.loads(json.dumps(compile_topology(definition, env_a).to_json()))
        plan_b = json.loads(json.dumps(compile_topology(definition, env_b).to_json()))
        tag = secrets.token_hex(3)
        upstream = f"vzc-up-{tag}"
        namespaces = {"db": f"vzc-db-{tag}", "other": f"vzc-ot-{tag}", "db_b": f"vzc-db2-{tag}"}
        for name in (upstream, *namespaces.values()):
            _ip("netns", "add", name)
            undo.append(functools.partial(_ip, "netns", "del", name))
            _ip("-n", name, "link", "set", "lo", "up")
        for host in (ALLOWED_HOST, UNLISTED_HOST, NAMED_HOST, UNLISTED_NAMED_HOST):
            _ip("-n", upstream, "addr", "add", f"{host}/32", "dev", "lo")

        await ensure_domain(plan, uplink=Uplink.of(f"/run/netns/{upstream}", _free_uplink()))
        undo.append(lambda: remove_domain(env_a))
        await ensure_domain(plan_b, uplink=None)
        undo.append(lambda: remove_domain(env_b))
        await attach_machine(plan, "db", f"/run/netns/{namespaces['db']}")
        await attach_machine(plan, "other", f"/run/netns/{namespaces['other']}")
        await attach_machine(plan_b, "db", f"/run/netns/{namespaces['db_b']}")

        db = next(m for m in plan["machines"] if m["name"] == "db")["attachments"][0]["address"]
        other = next(m for m in plan["machines"] if m["name"] == "other")["attachments"][0]["address"]
        db_b = next(m for m in plan_b["machines"] if m["name"] == "db")["attachments"][0]["address"]
        listeners: dict[str, Listener] = {}
        for key, namespace, where in (
            ("db", namespaces["db"], (f"{db}:{DB_PORT}", f"{db}:{DB_ADMIN_PORT}")),
            ("other", namespaces["other"], (f"{other}:{OTHER_PORT}",)),
            ("db_b", namespaces["db_b"], (f"{db_b}:{DB_PORT}", f"{db_b}:{DB_ADMIN_PORT}")),
            (
                "upstream",
                upstream,
                tuple(
                    f"{host}:{UPSTREAM_PORT}" for host in (ALLOWED_HOST, UNLISTED_HOST, NAMED_HOST, UNLISTED_NAMED_HOST)
                ),
            ),
            ("host", None, (f"127.0.0.1:{import_port}",)),
        ):
            listeners[key] = await listen(namespace, *where)
            undo.append(listeners[key].close)

        dns_upstream, dns_port = await start_upstream()
        undo.append(lambda: dns_upstream.transport.close() if dns_upstream.transport else None)
        machines = {name: f"vzc-{ctx.token}-network-{name}" for name in ("app", "off")}
        requests = {name: label_request(ctx, plan, name, ws) for name, ws in machines.items()}
        for workspace_id in machines.values():
            undo.append(functools.partial(_delete, ctx, workspace_id))
        # Both at once: a VM driver boots them in parallel (the first case's time limit holds the whole build).
        await asyncio.gather(
            *(
                expect_ok(
                    "RunImage", functools.partial(ctx.driver.run_image, req), note=f"Machine {name!r} (vz.network)"
                )
                for name, req in requests.items()
            )
        )

        network_host = NetworkHost(upstreams=[("127.0.0.1", dns_port)], min_ttl=NAME_TTL, max_ttl=NAME_TTL)
        undo.append(network_host.close)
        from vz_core.network import ExportListener

        # The export's port: the first free candidate, as NetworkHost would choose it (kept across restarts).
        probe = ExportListener(plan, "app", "http")
        export_port = await probe.start()
        await probe.close()
        built = Rig(
            plan=plan,
            plan_b=plan_b,
            machines=machines,
            requests=requests,
            upstream=upstream,
            namespaces=namespaces,
            listeners=listeners,
            import_port=import_port,
            export_port=export_port,
            host=network_host,
            dns_upstream=dns_upstream,
        )
        await built.ensure_parts()
    except BaseException:
        await unwind()
        raise
    steps = list(undo)
    undo.clear()

    async def finalize() -> None:
        undo.extend(steps)
        await unwind()

    ctx.session.share(_KEY, built, finalize)
    return built


async def _delete(ctx: CheckContext, workspace_id: str) -> None:
    driver = await ctx.session.driver()
    if await driver.find(workspace_id) is not None:
        await driver.delete(workspace_id)
