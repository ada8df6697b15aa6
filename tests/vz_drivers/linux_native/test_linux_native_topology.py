"""linux_native Machines attached to their Environment's route domain (docs/network.md, linux_native attachment).

Two Environments of two projects declare the same Machines on the same network (so the same addresses) with
different paths. Real Machines (``vz:default``) run a listener on each service port and on an undeclared port,
each counting the connections it accepts into a file. Every source Machine tries every destination: the Machines
of its Environment on declared and undeclared ports (which, the addresses being identical, are also the other
Environment's Machines), its own loopback at a port the host listens on, a host listener on 0.0.0.0 at each
host address and at the domain's gateway. Only declared cells connect; every listener counts exactly the
declared connections it should have had: refused cells never reach their destination, and the other
Environment's identical address is never the one reached. The expectation comes from the declarations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from machine_testlib import request, run, sh
from topology_testlib import vz_project

from vz_core.env import compile_topology
from vz_core.env._definition import parse_definition
from vz_core.env._up import network_label
from vz_core.errors import InvalidArgumentError
from vz_core.network import domain_exists, domain_for, ensure_domain, remove_domain
from vz_drivers._machine import machine_key
from vz_drivers.linux_native import LinuxNativeDriver
from vz_drivers.linux_native._attach import FACT_KEY, LABEL, network_slice

pytestmark = pytest.mark.root

UNDECLARED = 9999
SERVICES = {"app": {"http": 8080}, "db": {"pg": 5432}, "cache": {"redis": 6379}}
# Overlapping declarations: the same Machines and services, different paths.
PATHS = {
    "alpha": [("app", "db", "pg"), ("app", "cache", "redis")],
    "beta": [("app", "db", "pg"), ("db", "cache", "redis")],
}

LISTEN = r"""
for p in "$@"; do
  printf '#!/bin/sh\necho x >> /tmp/conn-%s\necho ok\n' "$p" > /tmp/count-$p.sh
  chmod +x /tmp/count-$p.sh
  nc -ll -p "$p" -e /tmp/count-$p.sh &
done
wait
"""

TRY = r"""
for target in "$@"; do
  if nc -w 2 "${target%:*}" "${target##*:}" </dev/null 2>/dev/null | grep -q '^ok$'; then
    echo "$target yes"
  else
    echo "$target no"
  fi
done
"""


def _definition(project: str) -> dict[str, Any]:
    machines = [
        {
            "name": name,
            "profile": "developer",
            "driver": "linux_native",
            "image": "vz:default",
            "workspace": {"projection": "none"},
            "services": [{"name": s, "port": p} for s, p in services.items()],
        }
        for name, services in SERVICES.items()
    ]
    paths = [{"from": a, "to": b, "service": s} for a, b, s in PATHS[project]]
    return {"version": 2, "project_id": project, "machines": machines, "paths": paths}


def _ports(machine: str) -> list[int]:
    return [*SERVICES[machine].values(), UNDECLARED]


def _declared(project: str, source: str, dest: str, port: int) -> bool:
    return any(a == source and b == dest and SERVICES[b][s] == port for a, b, s in PATHS[project])


def _host_state() -> tuple[set[str], set[str], str]:
    netns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    links = {item["ifname"] for item in json.loads(subprocess.check_output(["ip", "-j", "link", "show"]) or b"[]")}
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return netns, links, tables


def _domain_links(name: str) -> set[str]:
    listed = subprocess.check_output(["ip", "-n", name, "-j", "link", "show"])
    return {item["ifname"] for item in json.loads(listed or b"[]")}


def _has_table(name: str) -> bool:
    argv = ["ip", "netns", "exec", name, "nft", "list", "table", "inet", "vz"]
    return subprocess.run(argv, capture_output=True).returncode == 0


class _Env:
    def __init__(self, project: str) -> None:
        self.project = project
        self.env_id = "env_" + secrets.token_hex(6)
        self.plan = compile_topology(parse_definition(_definition(project)), self.env_id).to_json()

    def wsid(self, machine: str) -> str:
        return f"topo-{self.env_id[4:10]}-{machine}"

    def address(self, machine: str) -> str:
        entry = next(m for m in self.plan["machines"] if m["name"] == machine)
        return str(entry["attachments"][0]["address"])

    def ifnames(self) -> set[str]:
        return {a["domain_ifname"] for m in self.plan["machines"] for a in m["attachments"]}

    def request(self, machine: str) -> Any:
        label = network_label(self.plan, machine)
        assert label is not None
        return request(
            self.wsid(machine),
            args=("sh", "-c", LISTEN, "sh", *map(str, _ports(machine))),
            labels=(f"dev.vz.environment={self.env_id}", "vz.egress=deny", f"{LABEL}={label}"),
        )


def _leftovers(made: dict[str, _Env]) -> list[str]:
    """What of these Environments is still on the host (other tests on the host may own other vz objects)."""
    netns, links, tables = _host_state()
    left = [f"namespace {domain_for(e.env_id)}" for e in made.values() if domain_for(e.env_id) in netns]
    for env in made.values():
        ends = env.ifnames() | {f"vz{machine_key(env.wsid(m))[:12]}" for m in SERVICES}
        left += [f"host link {name}" for name in sorted(ends & links)]
        left += [f"nft table naming {env.env_id[4:]}" for line in tables.splitlines() if env.env_id[4:] in line]
    return left


@pytest.fixture
async def envs(driver: LinuxNativeDriver) -> AsyncIterator[dict[str, _Env]]:
    made = {project: _Env(project) for project in PATHS}
    try:
        yield made
    finally:
        for env in made.values():
            for machine in SERVICES:
                with contextlib.suppress(Exception):
                    await driver.delete(env.wsid(machine))
            await remove_domain(env.env_id)
    assert _leftovers(made) == []


class _HostListener:
    """A TCP listener in the host's namespace counting what it accepts (never blocking the test)."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((address, 0))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def accepted(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1


def _host_addresses() -> list[str]:
    data = json.loads(subprocess.check_output(["ip", "-j", "-4", "addr", "show"]) or b"[]")
    found = [a["local"] for item in data for a in item.get("addr_info", []) if a.get("family") == "inet"]
    return sorted({a for a in found if not a.startswith("127.")})


async def _wait_listening(driver: LinuxNativeDriver, wsid: str, ports: list[int]) -> None:
    script = 'for p in "$@"; do netstat -ltn | grep -q ":$p " || exit 1; done'
    for _ in range(100):
        if (await sh(driver, wsid, script, *map(str, ports))).exit.success:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the listeners of {wsid} did not start")


async def _counts(driver: LinuxNativeDriver, env: _Env, machine: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for port in _ports(machine):
        result = await sh(driver, env.wsid(machine), f"cat /tmp/conn-{port} 2>/dev/null || true")
        out[port] = len(result.stdout.split())
    return out


async def _try(driver: LinuxNativeDriver, wsid: str, targets: list[str]) -> dict[str, bool]:
    result = await sh(driver, wsid, TRY, *targets)
    assert result.exit.success, result.stderr
    rows = dict(line.split() for line in result.stdout.decode().splitlines())
    assert sorted(rows) == sorted(targets)
    return {t: rows[t] == "yes" for t in targets}


async def test_only_declared_paths_connect_between_real_machines_of_two_environments(
    driver: LinuxNativeDriver, envs: dict[str, _Env]
) -> None:
    alpha, beta = envs["alpha"], envs["beta"]
    for machine in SERVICES:  # the point of the test: the other Environment's Machines sit at the same addresses
        assert alpha.address(machine) == beta.address(machine)
    ext = await driver.extensions()
    assert ext is not None and FACT_KEY in ext.facts
    for env in envs.values():
        await ensure_domain(env.plan)
        for machine in SERVICES:
            await driver.run_image(env.request(machine))
    for env in envs.values():
        for machine in SERVICES:
            await _wait_listening(driver, env.wsid(machine), _ports(machine))
            resolv = await run(driver, env.wsid(machine), "cat", "/etc/resolv.conf")
            dns = next(m for m in env.plan["machines"] if m["name"] == machine)["dns_server"]
            assert resolv.stdout.decode() == f"nameserver {dns}\nsearch vz.internal\n"
            links = await run(driver, env.wsid(machine), "ip", "-o", "link", "show")
            names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.stdout.decode().splitlines())
            assert names == ["eth0", "lo"], "an attached Machine has its attachment and loopback, nothing else"

    loopback = _HostListener("127.0.0.1")
    wildcard = _HostListener("0.0.0.0")
    try:
        gateway = alpha.plan["networks"][0]["gateway"]
        host_targets = [
            f"127.0.0.1:{loopback.port}",
            f"{gateway}:{wildcard.port}",
            *(f"{a}:{wildcard.port}" for a in _host_addresses()),
        ]
        expected: dict[tuple[str, str, int], int] = {}
        for project, env in envs.items():
            for source in SERVICES:
                targets = {
                    f"{env.address(dest)}:{port}": (dest, port)
                    for dest in SERVICES
                    if dest != source
                    for port in _ports(dest)
                }
                got = await _try(driver, env.wsid(source), [*targets, *host_targets])
                for target, (dest, port) in targets.items():
                    want = _declared(project, source, dest, port)
                    assert got[target] is want, f"{project}: {source} -> {dest}:{port} connected={got[target]}"
                    if want:
                        expected[(project, dest, port)] = expected.get((project, dest, port), 0) + 1
                for target in host_targets:
                    assert got[target] is False, f"{project}: {source} reached the host at {target}"
        assert loopback.accepted() == 0 and wildcard.accepted() == 0, "a Machine's connection reached a host listener"
    finally:
        loopback.sock.close()
        wildcard.sock.close()
    for project, env in envs.items():
        for dest in SERVICES:
            counts = await _counts(driver, env, dest)
            for port in _ports(dest):
                assert counts[port] == expected.get((project, dest, port), 0), (project, dest, port, counts)

    # Stop/Start: the container (and its namespace) is new; the start attaches it again and the path works.
    await driver.stop(alpha.wsid("db"))
    await driver.start(alpha.wsid("db"))
    await _wait_listening(driver, alpha.wsid("db"), _ports("db"))
    got = await _try(driver, alpha.wsid("app"), [f"{alpha.address('db')}:5432", f"{alpha.address('db')}:{UNDECLARED}"])
    assert got == {f"{alpha.address('db')}:5432": True, f"{alpha.address('db')}:{UNDECLARED}": False}

    # Deleting alpha's Machines and its domain removes everything of alpha and nothing of beta.
    for machine in SERVICES:
        await driver.delete(alpha.wsid(machine))
    assert await remove_domain(alpha.env_id)
    assert not domain_exists(alpha.env_id) and domain_exists(beta.env_id)
    assert _leftovers({"alpha": alpha}) == []
    netns, links, _ = _host_state()
    assert domain_for(alpha.env_id) not in netns and domain_for(beta.env_id) in netns
    assert beta.ifnames() <= _domain_links(domain_for(beta.env_id))
    assert not alpha.ifnames() & links
    assert _has_table(domain_for(beta.env_id)), "beta's nft table survived alpha's removal"
    before = (await _counts(driver, beta, "db"))[5432]
    got = await _try(driver, beta.wsid("app"), [f"{beta.address('db')}:5432", f"{beta.address('cache')}:6379"])
    assert got == {f"{beta.address('db')}:5432": True, f"{beta.address('cache')}:6379": False}
    assert (await _counts(driver, beta, "db"))[5432] == before + 1


async def test_a_damaged_label_is_refused_before_anything_is_created(
    driver: LinuxNativeDriver, envs: dict[str, _Env]
) -> None:
    env = envs["alpha"]
    good = json.loads(network_label(env.plan, "app") or "{}")
    assert network_slice({LABEL: json.dumps(good)}) is not None
    bad_address = json.loads(json.dumps(good))
    bad_address["machines"][0]["attachments"][0]["address"] = "10.0.0.1; ip link del eth0"
    cases = {
        "not JSON": "{",
        "is not an IPv4 address": json.dumps(bad_address),
        "exactly the one Machine": json.dumps(env.plan),  # the whole plan: every Machine, every rule
        "no rules": json.dumps({**good, "input": [r for r in env.plan["input"] if r["machine"] == "app"]}),
        "is not a gateway": json.dumps({**good, "machines": [{**good["machines"][0], "dns_server": "8.8.8.8"}]}),
        "not the Machine's Environment": json.dumps(
            {**good, "environment_id": "env_000000000000", "route_domain": "vzd-000000000000"}
        ),
    }
    for why, text in cases.items():
        req = request(env.wsid("app"), labels=(f"dev.vz.environment={env.env_id}", f"{LABEL}={text}"))
        with pytest.raises(InvalidArgumentError, match=why):
            await driver.run_image(req)
        assert await driver.find(env.wsid("app")) is None
        assert driver._store.load(machine_key(env.wsid("app"))) is None


async def test_without_its_route_domain_a_machine_does_not_start(
    driver: LinuxNativeDriver, envs: dict[str, _Env]
) -> None:
    env = envs["beta"]
    with pytest.raises(Exception, match="does not exist"):
        await driver.run_image(env.request("db"))
    found = await driver.find(env.wsid("db"))
    assert found is None or found.state.status != "running"


UP_DEFINITION = {
    "version": 2,
    "project_id": "topology-up",
    "machines": [
        {
            "name": "app",
            "profile": "developer",
            "driver": "linux_native",
            "image": "vz:default",
            "workspace": {"projection": "none"},
        },
        {
            "name": "db",
            "profile": "developer",
            "driver": "linux_native",
            "image": "vz:default",
            "workspace": {"projection": "none"},
            "services": [{"name": "pg", "port": 5432}],
        },
    ],
    "paths": [{"from": "app", "to": "db", "service": "pg"}],
    "default_machine": "app",
}


@pytest.mark.slow
def test_vz_up_attaches_stop_keeps_and_delete_removes_the_route_domain(tmp_path: Path) -> None:
    """Through the real `vz` (CLI, daemon, plugin): the Environment layer realizes the domain and labels."""
    with vz_project(tmp_path, UP_DEFINITION) as vz:
        vz.up()
        env_id = vz.env_id
        plan = compile_topology(parse_definition(UP_DEFINITION), env_id).to_json()
        address = {m["name"]: m["attachments"][0]["address"] for m in plan["machines"]}
        assert domain_exists(env_id)
        resolv = vz.ok("exec", "--machine", "db", "--", "cat", "/etc/resolv.conf")
        assert resolv == f"nameserver {plan['machines'][1]['dns_server']}\nsearch vz.internal\n"
        listen = (
            "printf '#!/bin/sh\\necho x >> /tmp/conn\\necho ok\\n' > /tmp/count.sh; chmod +x /tmp/count.sh; "
            "setsid nc -ll -p {port} -e /tmp/count.sh </dev/null >/dev/null 2>&1 &"
        )
        wait = "for i in $(seq 50); do netstat -ltn | grep -q ':{port} ' && exit 0; sleep 0.1; done; exit 1"
        for machine, port in (("db", 5432), ("db", 5433), ("app", 8080)):
            vz.sh(machine, listen.format(port=port))
            vz.sh(machine, wait.format(port=port))
        probe = "nc -w 2 {0} {1} </dev/null 2>/dev/null | grep -q '^ok$' && echo yes || echo no"
        cells = {
            ("app", address["db"], 5432): "yes",  # the declared path
            ("app", address["db"], 5433): "no",  # an undeclared port of the same Machine
            ("db", address["app"], 8080): "no",  # the reverse direction
        }
        for (source, target, port), want in cells.items():
            got = vz.sh(source, probe.format(target, port))
            assert got == want, (source, target, port)
        counted = vz.sh("db", "cat /tmp/conn 2>/dev/null | wc -l")
        assert counted == "1", "only the declared connection reached db"
        vz.sh("app", "cat /tmp/conn 2>/dev/null | wc -l")

        vz.ok("stop")
        assert domain_exists(env_id), "vz stop keeps the route domain"
        vz.ok("up")  # starts the Machines again: attached again
        vz.sh("db", listen.format(port=5432))
        vz.sh("db", wait.format(port=5432))
        got = vz.sh("app", probe.format(address["db"], 5432))
        assert got == "yes"

        vz.ok("delete")
        assert not domain_exists(env_id), "vz delete removes the route domain"
        _netns, links, tables = _host_state()
        ends = {a["domain_ifname"] for m in plan["machines"] for a in m["attachments"]}
        assert not ends & links and env_id[4:] not in tables
