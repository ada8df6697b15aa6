"""B11: the network of a version 2 Environment: throughput and latency across a declared path and an export.

One Environment of two linux_native Machines, ``client`` and ``server`` (vz:default, no workspace, egress
offline), brought up through the real ``vz`` and daemon from a vz.json written here: ``server`` declares
``iperf`` (tcp/5201) and ``echo`` (tcp/7007), two paths ``client`` → ``server`` name them, and both services are
exported to the host. The tools are the host's: ``iperf3`` and a small Python echo server/client run inside the
Machines' network namespaces with ``nsenter --net=/proc/<pid>/ns/net`` (only the network namespace is the
Machine's; the image has no iperf3). So the figures are the network path's, not the Machine's CPU limits'.

Cases, interleaved round by round so that load noise hits them alike:

* ``declared_path``: client → server's address over the route domain (client's veth, the domain's IPv4
  forwarding and nft table, server's veth);
* ``plain_veth``: the same two namespaces joined by one extra veth pair made here (192.0.2.1/30 ↔ 192.0.2.2/30,
  a documentation range, nothing routed elsewhere): what the domain adds is the difference;
* ``export``: the host → 127.0.0.1:<the port `vz status` shows> → the daemon's export relay → server.

Throughput: ``iperf3 -c … -t T -J`` (one TCP stream, T = 5 s, smoke 1 s), the receiver's bits per second,
median of 3 rounds (smoke 1). Without iperf3, a Python socket pump (send 256 KiB blocks for T seconds, the
receiver counts) stands in, with a note. Latency: one sample = TCP connect + 1 byte written + 1 byte read back
(the server answers then closes), timed in the client process (no process start inside a sample), 1000
samples per case in 5 blocks (smoke: 20 in 1), reported as p50/p95/p99 with the connect alone beside it. The
load average before and after is part of the result: absolute figures move with it, the differences less.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._common import cli_env, linux_native_problem, vz_script
from benchmarks._stats import summary

ID = "B11"
TITLE = "declared path and export: throughput and connect+1-byte latency vs a plain veth"

IPERF_PORT = 5201
ECHO_PORT = 7007
VETH_CLIENT = "192.0.2.1"
VETH_SERVER = "192.0.2.2"

_ECHO_SERVER = r"""
import socket, sys
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[1])))
srv.listen(128)
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    with conn:
        try:
            if conn.recv(1):
                conn.sendall(b"!")
        except OSError:
            pass
"""

_ECHO_CLIENT = r"""
import json, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
total, connect = [], []
for _ in range(n):
    t0 = time.perf_counter()
    s = socket.create_connection((host, port), timeout=10)
    t1 = time.perf_counter()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"?")
    if s.recv(1) != b"!":
        raise SystemExit("no answer from the echo server")
    t2 = time.perf_counter()
    s.close()
    total.append(t2 - t0)
    connect.append(t1 - t0)
print(json.dumps({"total": total, "connect": connect}))
"""

_PUMP_SERVER = r"""
import socket, sys, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[1])))
srv.listen(16)
print("ready", flush=True)
def drain(conn):
    with conn:
        buf = bytearray(1 << 18)
        count = 0
        while n := conn.recv_into(buf):
            count += n
        conn.sendall(count.to_bytes(8, "big"))
while True:
    conn, _ = srv.accept()
    threading.Thread(target=drain, args=(conn,), daemon=True).start()
"""

_PUMP_CLIENT = r"""
import json, socket, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.create_connection((host, port), timeout=10)
block = b"\0" * (1 << 18)
t0 = time.perf_counter()
while time.perf_counter() - t0 < seconds:
    s.sendall(block)
s.shutdown(socket.SHUT_WR)
received = int.from_bytes(s.recv(8), "big")
elapsed = time.perf_counter() - t0
print(json.dumps({"bits_per_second": received * 8 / elapsed}))
"""


def _definition(project_id: str, iperf_host_port: int, echo_host_port: int) -> dict[str, Any]:
    machine = {"profile": "developer", "driver": "linux_native", "image": "vz:default"}
    return {
        "version": 2,
        "project_id": project_id,
        "machines": [
            {"name": "client", **machine, "workspace": {"projection": "none"}},
            {
                "name": "server",
                **machine,
                "workspace": {"projection": "none"},
                "services": [{"name": "iperf", "port": IPERF_PORT}, {"name": "echo", "port": ECHO_PORT}],
            },
        ],
        "paths": [
            {"from": "client", "to": "server", "service": "iperf"},
            {"from": "client", "to": "server", "service": "echo"},
        ],
        "exports": [
            {"machine": "server", "service": "iperf", "host_port": iperf_host_port},
            {"machine": "server", "service": "echo", "host_port": echo_host_port},
        ],
        "default_machine": "client",
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _machine_pids(home: Path, machine_ids: dict[str, str]) -> dict[str, int]:
    """name → host pid of each Machine's init, from the linux_native driver's records under ``home``."""
    found: dict[str, int] = {}
    for record_file in (home / "drivers" / "linux_native" / "machines").glob("*/record.json"):
        record = json.loads(record_file.read_text())
        for name, mid in machine_ids.items():
            if str(record.get("workspace_id", "")).endswith(f"-{mid}") and record.get("status") == "running":
                found[name] = int(record["pid"])
    missing = sorted(set(machine_ids) - set(found))
    if missing:
        raise RuntimeError(f"no running linux_native record for Machine(s) {', '.join(missing)} under {home}")
    for name, pid in found.items():
        if not os.path.exists(f"/proc/{pid}/ns/net"):
            raise RuntimeError(f"Machine {name}: its process {pid} is gone")
    return found


def _in_ns(pid: int, *argv: str) -> list[str]:
    return ["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv]


def _check(argv: list[str], what: str, timeout: float = 60) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{what}: {' '.join(argv)} exited {result.returncode}: {result.stderr[-1500:]}")
    return result.stdout


def _eth0_address(pid: int) -> str:
    data = json.loads(_check(_in_ns(pid, "ip", "-j", "-4", "addr", "show", "dev", "eth0"), "eth0 address"))
    for item in data:
        for info in item.get("addr_info", []):
            if info.get("family") == "inet":
                return str(info["local"])
    raise RuntimeError(f"the Machine of pid {pid} has no IPv4 address on eth0")


class _Server:
    """A long-running server process inside a Machine's network namespace, waited for until it serves."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def _wait_listening(pid: int, port: int, server: _Server, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"the server for port {port} ended: {Path(server.log.name).read_text()[-1000:]}")
        listening = _check(_in_ns(pid, "ss", "-Htln", f"sport = :{port}"), "ss")
        if listening.strip():
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} in the Machine of pid {pid} after {seconds} s")


def _iperf(argv: list[str]) -> float:
    """Receiver bits per second of one ``iperf3 -J`` client run."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError:
        data = {"error": result.stdout[-500:] + result.stderr[-500:]}
    if result.returncode != 0 or "error" in data:
        raise RuntimeError(f"{' '.join(argv)}: {data.get('error')}")
    return float(data["end"]["sum_received"]["bits_per_second"])


def _pump(argv: list[str]) -> float:
    return float(json.loads(_check(argv, "socket pump", timeout=120))["bits_per_second"])


def _echo(argv: list[str]) -> dict[str, list[float]]:
    data: dict[str, list[float]] = json.loads(_check(argv, "echo client", timeout=300))
    return data


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _throughput(bits: list[float]) -> dict[str, Any]:
    med = _median(bits)
    return {
        "n": len(bits),
        "gbit_per_s": round(med / 1e9, 3),
        "mib_per_s": round(med / 8 / (1 << 20), 1),
        "rounds_gbit_per_s": [round(b / 1e9, 3) for b in bits],
    }


@dataclass
class _Run:
    """One run's scratch Environment and what it started, so that every exit path removes it."""

    workdir: Path
    vz: str
    env: dict[str, str]
    project: Path
    servers: list[_Server] = field(default_factory=list)
    env_id: str = ""
    veth: tuple[int, str] | None = None  # (client pid, client end) once made

    def vz_ok(self, *args: str) -> str:
        result = subprocess.run(
            [self.vz, *args], cwd=self.project, env=self.env, capture_output=True, text=True, timeout=300, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"vz {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
        return result.stdout

    def stop_servers(self) -> None:
        for srv in self.servers:
            srv.stop()
        self.servers.clear()

    def cleanup(self) -> None:
        """Servers, the plain veth and the Environment (blocking; the daemon is stopped by the caller)."""
        self.stop_servers()
        if self.veth is not None and os.path.exists(f"/proc/{self.veth[0]}/ns/net"):
            with contextlib.suppress(Exception):
                _check(_in_ns(self.veth[0], "ip", "link", "del", self.veth[1]), "plain veth removal")
        self.veth = None
        with contextlib.suppress(Exception):
            subprocess.run(
                [self.vz, "delete"], cwd=self.project, env=self.env, capture_output=True, timeout=300, check=False
            )


def _measure(ctx: Any, state: _Run, iperf3: str | None) -> dict[str, Any]:
    """Bring the Environment up, measure every case, delete it (blocking: run in a thread)."""
    from vz_core.network import domain_exists

    seconds = 1 if ctx.smoke else 5
    rounds = ctx.n(3, 1)
    blocks, per_block = ctx.n(5, 1), ctx.n(200, 20)
    workdir = state.workdir
    out: dict[str, Any] = {
        "measured": True,
        "tool": "iperf3" if iperf3 else "python socket pump",
        "seconds_per_throughput_run": seconds,
        "rounds": rounds,
        "latency_samples_per_case": blocks * per_block,
    }
    t0 = time.perf_counter()
    state.vz_ok("up")
    out["up_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    (environment,) = json.loads(state.vz_ok("status", "--json"))["environments"]
    state.env_id = environment["id"]
    out["environment_id"] = state.env_id
    ports = {e["service"]: int(e["port"]) for e in environment.get("endpoints", [])}
    if set(ports) != {"iperf", "echo"}:
        raise RuntimeError(f"vz status shows the endpoints {environment.get('endpoints')}, not both exports")
    pids = _machine_pids(Path(state.env["VZ_HOME"]), {m["name"]: m["id"] for m in environment["machines"]})
    client, server = pids["client"], pids["server"]
    server_address = _eth0_address(server)

    # The plain veth between the same two namespaces (made here; removed below, else with the Machines).
    suffix = secrets.token_hex(2)
    a, b = f"b11a{suffix}", f"b11b{suffix}"
    argv = ["ip", "link", "add", a, "netns", str(client), "type", "veth", "peer", "name", b, "netns", str(server)]
    _check(argv, "plain veth")
    state.veth = (client, a)
    for pid, name, address in ((client, a, VETH_CLIENT), (server, b, VETH_SERVER)):
        _check(_in_ns(pid, "ip", "addr", "add", f"{address}/30", "dev", name), "plain veth address")
        _check(_in_ns(pid, "ip", "link", "set", name, "up"), "plain veth up")

    if iperf3:
        tput_server = _Server(_in_ns(server, iperf3, "-s", "-p", str(IPERF_PORT)), workdir / "iperf3.log")
    else:
        tput_server = _Server(_in_ns(server, sys.executable, "-c", _PUMP_SERVER, str(IPERF_PORT)), workdir / "pump.log")
    state.servers.append(tput_server)
    echo_server = _Server(_in_ns(server, sys.executable, "-c", _ECHO_SERVER, str(ECHO_PORT)), workdir / "echo.log")
    state.servers.append(echo_server)
    _wait_listening(server, IPERF_PORT, tput_server)
    _wait_listening(server, ECHO_PORT, echo_server)

    def tput_argv(pid: int | None, host: str, port: int) -> list[str]:
        if iperf3:
            argv = [iperf3, "-c", host, "-p", str(port), "-t", str(seconds), "-J"]
        else:
            argv = [sys.executable, "-c", _PUMP_CLIENT, host, str(port), str(seconds)]
        return _in_ns(pid, *argv) if pid is not None else argv

    def echo_argv(pid: int | None, host: str, port: int, n: int = per_block) -> list[str]:
        argv = [sys.executable, "-c", _ECHO_CLIENT, host, str(port), str(n)]
        return _in_ns(pid, *argv) if pid is not None else argv

    cases: dict[str, tuple[int | None, str, int, int]] = {
        "declared_path": (client, server_address, IPERF_PORT, ECHO_PORT),
        "plain_veth": (client, VETH_SERVER, IPERF_PORT, ECHO_PORT),
        "export": (None, "127.0.0.1", ports["iperf"], ports["echo"]),
    }
    measure = _iperf if iperf3 else _pump
    # Warm-up: a few connections per case (neighbour entries, the export relay's first connections).
    for pid_, host, _, echo_port in cases.values():
        _echo(echo_argv(pid_, host, echo_port, 3))
    bits: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (pid_, host, tput_port, _) in cases.items():
            bits[name].append(measure(tput_argv(pid_, host, tput_port)))
    total: dict[str, list[float]] = {name: [] for name in cases}
    connect: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(blocks):
        for name, (pid_, host, _, echo_port) in cases.items():
            got = _echo(echo_argv(pid_, host, echo_port))
            total[name] += got["total"]
            connect[name] += got["connect"]

    out["throughput"] = {name: _throughput(values) for name, values in bits.items()}
    out["path_throughput"] = out["throughput"]["declared_path"]
    out["export_throughput"] = out["throughput"]["export"]
    out["latency"] = {
        name: {"connect_and_1_byte": summary(total[name]), "connect": summary(connect[name])} for name in cases
    }
    p50 = {name: out["latency"][name]["connect_and_1_byte"]["p50_ms"] for name in cases}
    out["added_latency_p50_us"] = {
        "declared_path_over_plain_veth": round((p50["declared_path"] - p50["plain_veth"]) * 1000, 1),
        "export_over_declared_path": round((p50["export"] - p50["declared_path"]) * 1000, 1),
    }
    state.stop_servers()
    t0 = time.perf_counter()
    state.vz_ok("delete")
    out["delete_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    state.veth = None  # gone with the Machines
    out["domain_left_after_delete"] = domain_exists(state.env_id)
    return out


async def run(ctx: Any) -> dict[str, Any]:
    workdir: Path = ctx.workdir
    if os.geteuid() != 0:
        ctx.notes.append("not measured: B11 needs root (linux_native Machines, nsenter, veth pairs)")
        return {"headline": "not measured: needs root (see notes)", "measured": False}
    problem = await linux_native_problem(workdir / "preflight")
    if problem:
        ctx.notes.append(f"not measured: linux_native cannot run Machines here: {problem}")
        return {"headline": "not measured: linux_native unavailable (see notes)", "measured": False}
    for tool in ("nsenter", "ip", "ss"):
        if shutil.which(tool) is None:
            ctx.notes.append(f"not measured: {tool} is missing (util-linux, iproute2)")
            return {"headline": f"not measured: {tool} missing (see notes)", "measured": False}
    from benchmarks.b7_cli_exec import cleanup_cli
    from vz_core.network import domain_exists, remove_domain
    from vz_drivers.agent import ensure_agent_binary

    iperf3 = shutil.which("iperf3")
    if iperf3 is None:
        ctx.notes.append(
            "iperf3 is not installed (scripts/install-bench-peers.sh): throughput measured with a Python socket "
            "pump instead (it saturates at a lower rate than iperf3)"
        )
    agent = await asyncio.to_thread(ensure_agent_binary)
    home = workdir / "home"
    project = workdir / "project"
    project.mkdir()
    project_id = f"vz-bench-b11-{secrets.token_hex(3)}"
    (project / "vz.json").write_text(json.dumps(_definition(project_id, _free_port(), _free_port()), indent=2))
    state = _Run(workdir, vz_script(), cli_env(home, agent), project)
    load_before = [round(x, 2) for x in os.getloadavg()]
    try:
        out = await asyncio.to_thread(_measure, ctx, state, iperf3)
    finally:
        await asyncio.to_thread(state.cleanup)
        await cleanup_cli(home, state.env)
        if state.env_id and domain_exists(state.env_id):
            await remove_domain(state.env_id)
    out["load_average_before_after"] = [load_before, [round(x, 2) for x in os.getloadavg()]]
    t = out["throughput"]
    lat = {name: out["latency"][name]["connect_and_1_byte"]["p50_ms"] * 1000 for name in out["latency"]}
    out["headline"] = (
        f"{out['tool']}: declared path {t['declared_path']['gbit_per_s']:.2f} Gbit/s vs plain veth "
        f"{t['plain_veth']['gbit_per_s']:.2f}, export {t['export']['gbit_per_s']:.2f}; connect+1-byte p50 "
        f"{lat['declared_path']:.0f} us vs plain veth {lat['plain_veth']:.0f} us, export {lat['export']:.0f} us "
        f"(load {load_before[0]} on {os.cpu_count()} CPUs)"
    )
    return out
