"""A version 2 qemu Machine in its Environment's route domain: a tap instead of QEMU user networking.

The VM test boots one real Machine (TCG here) attached through the ``vz.network`` label, next to a second
Machine stood in by a plain test namespace attached with ``vz_core.network.attach_machine``. Listeners count
what reaches them: the declared path connects, an undeclared service and an undeclared port of the other
Machine are refused and never reached, and so are the host's loopback and wildcard listeners (through the
gateway, the user-networking host alias and every host address). Stopping the Machine takes its tap along,
starting it makes a new one (the path works again), deleting it leaves nothing of it and nothing else of the
domain is touched. Nothing is left on the host afterwards (QEMU, taps, namespaces, nft tables).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine_testlib import run
from qemu_testlib import Booted, make_driver, qemu_processes

from vz_core import ExecOutput, ExecSpec, HostRequirements, RunImageRequest
from vz_core.env import compile_topology
from vz_core.env._definition import parse_definition
from vz_core.errors import InvalidArgumentError
from vz_core.network import attach_machine, ensure_domain, remove_domain
from vz_core.network.label import machine_slice
from vz_drivers._machine import no_input
from vz_drivers.qemu import QemuDriver, cleanup_state
from vz_drivers.qemu._attach import NETWORK_LABEL, parse_network_label
from vz_drivers.qemu._qemu import VmSpec, build_command

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vz_core" / "network"))
from netns_kit import Listener, inventory, listen, ours

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def _definition() -> dict[str, Any]:
    return {
        "version": 2,
        "project_id": "qemu-topology",
        "machines": [
            {"name": "app", "profile": "developer", "driver": "qemu", "image": "vz:default"},
            {
                "name": "db",
                "profile": "developer",
                "driver": "linux_native",
                "image": "vz:default",
                "services": [{"name": "postgres", "port": 5432}, {"name": "admin", "port": 8081}],
            },
        ],
        "paths": [{"from": "app", "to": "db", "service": "postgres"}],
    }


def _plan(environment_id: str) -> dict[str, Any]:
    return compile_topology(parse_definition(_definition()), environment_id).to_json()


def _env_id() -> str:
    return "env_" + "".join(secrets.choice(_ALPHABET) for _ in range(12))


def _label(plan: dict[str, Any], machine: str) -> str:
    label = machine_slice(plan, machine)
    assert label is not None
    return label


def _machine(plan: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in plan["machines"] if m["name"] == name)


# ---------------------------------------------------------------------------------------------- no VM


def test_the_label_round_trips_and_names_the_attachment() -> None:
    env = _env_id()
    plan = _plan(env)
    network = parse_network_label({NETWORK_LABEL: _label(plan, "app")})
    assert network is not None
    app = _machine(plan, "app")["attachments"][0]
    assert network.domain == "vzd-" + env[4:] and network.machine == "app"
    assert [(str(a.address), str(a.gateway), a.domain_ifname) for a in network.attachments] == [
        (app["address"], app["gateway"], app["domain_ifname"])
    ]
    mac = network.mac(network.attachments[0])
    assert re.fullmatch(r"02(:[0-9a-f]{2}){5}", mac) and mac.replace(":", "")[2:] == app["domain_ifname"][1:]
    subnet = plan["networks"][0]["subnet"]
    assert network.kernel_args() == (
        f"vz.net=eth0,{mac},{app['address']},{app['gateway']},{subnet}",
        f"vz.dns={_machine(plan, 'app')['dns_server']}",
        "vz.search=vz.internal",
    )
    assert parse_network_label({}) is None  # version 1: no label, user networking as before


def _dns_rule(slice_: dict[str, Any]) -> dict[str, Any]:
    att = slice_["machines"][0]["attachments"][0]
    return {
        "ifname": att["domain_ifname"],
        "address": att["address"],
        "gateway": att["gateway"],
        "protocol": "udp",
        "port": 53,
    }


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: "{not json", "not JSON"),
        (lambda d: json.dumps([d]), "JSON object"),
        (lambda d: json.dumps(dict(d, machines=d["machines"] * 2)), "interface name used twice"),
        (lambda d: json.dumps(dict(d, machines=[])), "0 Machines"),
        (lambda d: json.dumps(dict(d, input=[_dns_rule(d)])), "a slice carries no rules"),
        (
            lambda d: json.dumps(
                dict(
                    d,
                    machines=[
                        dict(
                            d["machines"][0],
                            attachments=[dict(d["machines"][0]["attachments"][0], domain_ifname="eth0; reboot")],
                        )
                    ],
                )
            ),
            "domain_ifname",
        ),
        (lambda d: json.dumps(dict(d, machines=[dict(d["machines"][0], dns_server="8.8.8.8")])), "dns_server"),
        (lambda d: json.dumps(dict(d, machines=[dict(d["machines"][0], search=["vz.internal x"])])), "search"),
        (lambda d: json.dumps(dict(d, route_domain="vzd-000000000000")), "route_domain"),
    ],
)
def test_a_bad_label_is_refused_naming_it(mutate: Any, fragment: str) -> None:
    good = json.loads(_label(_plan(_env_id()), "app"))
    with pytest.raises(InvalidArgumentError) as caught:
        parse_network_label({NETWORK_LABEL: mutate(good)})
    assert caught.value.message.startswith(f"label {NETWORK_LABEL}: ") and fragment in caught.value.message


def _spec(**kw: Any) -> VmSpec:
    return VmSpec(
        name="vz-x",
        accelerator="tcg",
        cpus=1,
        memory_mib=256,
        kernel=Path("/k"),
        initrd=Path("/i"),
        disk=Path("/d"),
        config_dir=Path("/c"),
        **kw,
    )


def test_the_command_line_uses_the_tap_and_no_user_networking() -> None:
    network = parse_network_label({NETWORK_LABEL: _label(_plan(_env_id()), "app")})
    assert network is not None
    argv = build_command("qemu", _spec(network=network, egress="deny"), (7,))
    netdevs = [argv[i + 1] for i, a in enumerate(argv) if a == "-netdev"]
    assert netdevs == ["tap,id=net0,fd=7,vhost=off"]
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device" and argv[i + 1].startswith("virtio-net")]
    assert devices == [f"virtio-net-pci,netdev=net0,mac={network.mac(network.attachments[0])},romfile="]
    cmdline = argv[argv.index("-append") + 1].split()
    assert all(arg in cmdline for arg in network.kernel_args())
    with pytest.raises(ValueError, match="tap descriptors"):
        build_command("qemu", _spec(network=network), ())
    # Version 1 (no network): user networking exactly as before, no route-domain arguments.
    plain = build_command("qemu", _spec(egress="deny"))
    assert [plain[i + 1] for i, a in enumerate(plain) if a == "-netdev"] == ["user,id=net0,restrict=on,hostname=vz-x"]
    assert not any(w.startswith("vz.net=") for w in plain[plain.index("-append") + 1].split())


# ---------------------------------------------------------------------------------------------- real VM


def _sh(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True).stdout


def _domain_links(domain: str) -> dict[str, str]:
    """ifname -> kind ("tun", "veth", "") of every link in the domain's namespace."""
    out = json.loads(_sh("ip", "-n", domain, "-j", "-d", "link", "show") or "[]")
    return {d["ifname"]: (d.get("linkinfo") or {}).get("info_kind", "") for d in out}


def _host_addresses() -> list[str]:
    found = []
    for item in json.loads(_sh("ip", "-j", "-4", "addr", "show")):
        for a in item.get("addr_info", []):
            if a.get("family") == "inet" and not a["local"].startswith("127."):
                found.append(a["local"])
    return found


def _host_listener(address: str) -> Listener:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, 0))
    sock.listen(16)
    sock.setblocking(False)
    return Listener("host", address, sock.getsockname()[1], "tcp", sock)


async def _guest(driver: Any, workspace_id: str, script: str) -> str:
    spec = ExecSpec(workspace_id=workspace_id, argv=("sh", "-c", script))
    out = b""
    async for event in driver.exec(spec, no_input()):
        if isinstance(event, ExecOutput) and event.stream == "stdout":
            out += event.data
    return out.decode()


@pytest.fixture
def topology_host() -> Iterator[dict[str, Any]]:
    """An Environment's route domain with the stand-in Machine ``db`` attached; nothing of it left afterwards."""
    if os.geteuid() != 0:
        pytest.fail("the qemu route-domain test needs root (network namespaces, taps, nft tables)")
    env = _env_id()
    tag = secrets.token_hex(2)
    domain = "vzd-" + env[4:]
    before = ours(inventory(), tag, {domain})
    db_ns = f"vzt{tag}-db"
    plan = _plan(env)
    _sh("ip", "netns", "add", db_ns)
    try:
        asyncio.run(ensure_domain(plan))
        asyncio.run(attach_machine(plan, "db", f"/run/netns/{db_ns}"))
        yield {"env": env, "plan": plan, "domain": domain, "db_ns": f"/run/netns/{db_ns}"}
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(remove_domain(env))
        with contextlib.suppress(subprocess.CalledProcessError):
            _sh("ip", "netns", "del", db_ns)
    after = ours(inventory(), tag, {domain})
    assert after == before, f"leaked: { {k: after[k] - before[k] for k in after} }"


def test_a_qemu_machine_reaches_only_its_declared_path(
    topology_host: dict[str, Any], tmp_path: Path, image_dir: Path, agent_binary: str
) -> None:
    plan, domain = topology_host["plan"], topology_host["domain"]
    db = _machine(plan, "db")["attachments"][0]
    app = _machine(plan, "app")["attachments"][0]
    gateway = app["gateway"]
    listeners = {
        "declared db:5432": listen(topology_host["db_ns"], "db", db["address"], 5432, "tcp"),
        "service without a path db:8081": listen(topology_host["db_ns"], "db", db["address"], 8081, "tcp"),
        "undeclared port db:9999": listen(topology_host["db_ns"], "db", db["address"], 9999, "tcp"),
    }
    loopback = _host_listener("127.0.0.1")
    wildcard = _host_listener("0.0.0.0")
    state = tmp_path / "state"
    workspace_id = "topology-app"
    # Every way out of the guest toward the host's two listeners: the gateway, the user-networking host alias,
    # the guest's own loopback (never the host's) and every address of the host.
    host_targets = [(gateway, loopback.port), ("10.0.2.2", loopback.port), ("127.0.0.1", loopback.port)]
    host_targets += [(a, wildcard.port) for a in [gateway, "10.0.2.2", *_host_addresses()]]
    db_targets = [(db["address"], 5432), (db["address"], 8081), (db["address"], 9999)]
    script = "cat /etc/resolv.conf; ip -4 -o addr show dev eth0; ip route; "
    # The declared path gets a long timeout: under TCG on a loaded host the emulated guest may take seconds for its
    # first connection (its SYN is retried after 1 s, then 3 s). A refused path drops, so each refused attempt
    # costs its whole timeout: those keep 3 s, and the listeners' counts below show that nothing of them arrived.
    declared = (db["address"], 5432)
    script += "".join(
        f"nc -w {20 if (a, p) == declared else 3} {a} {p} </dev/null >/dev/null 2>&1; echo connect {a}:{p} $?; "
        for a, p in db_targets
    )
    script += "".join(f"nc -w 3 {a} {p} </dev/null >/dev/null 2>&1; echo connect {a}:{p} $?; " for a, p in host_targets)

    async def scenario() -> tuple[str, list[dict[str, str]], dict[str, str]]:
        driver = make_driver(state, image_dir, agent_binary)
        try:
            request = RunImageRequest(
                workspace_id=workspace_id,
                image="vz:default",
                labels=("vz.egress=deny", f"{NETWORK_LABEL}={_label(plan, 'app')}"),
                host_requirements=HostRequirements(cpus=1, memory_bytes=256 * 1024 * 1024),
                entrypoint="sh",
                args=("-c", "exec sleep 1000000"),
            )
            await driver.run_image(request)
            running = _domain_links(domain)
            output = await _guest(driver, workspace_id, script)
            # Stop: QEMU held the only descriptor of the tap, so the tap goes with it. Start: a new one, and the
            # declared path works again.
            await driver.stop(workspace_id)
            stopped = _domain_links(domain)
            await driver.start(workspace_id)
            output += await _guest(driver, workspace_id, f"nc -w 20 {db['address']} 5432 </dev/null; echo again $?")
            restarted = _domain_links(domain)
            await driver.delete(workspace_id)
            return output, [running, stopped, restarted], _domain_links(domain)
        finally:
            await driver.close()
            await cleanup_state(str(state), image_dir=str(image_dir), agent_binary=agent_binary)

    # Accept and close at once what arrives (counting it), so that a connecting nc in the guest ends.
    stop = threading.Event()

    def accept_all() -> None:
        while not stop.wait(0.05):
            for listener in [*listeners.values(), loopback, wildcard]:
                listener.drain()

    acceptor = threading.Thread(target=accept_all, daemon=True)
    acceptor.start()
    try:
        output, (running, stopped, restarted), deleted = asyncio.run(scenario())
    finally:
        stop.set()
        acceptor.join()
        for listener in [*listeners.values(), loopback, wildcard]:
            listener.drain()
            listener.sock.close()
    counts = {name: listener.count for name, listener in listeners.items()}
    host_counts = {"loopback": loopback.count, "wildcard": wildcard.count}
    assert qemu_processes(state) == [], "a QEMU process outlived its Machine"

    # The guest's side: its address, the link route to the gateway, the Environment's resolver.
    assert f"nameserver {_machine(plan, 'app')['dns_server']}" in output and "search vz.internal" in output
    assert f"inet {app['address']}/32" in output, output
    assert f"default via {gateway} dev eth0" in output, output
    results = dict(re.findall(r"^connect (\S+) (\d+)$", output, re.M))
    assert results[f"{db['address']}:5432"] == "0", output
    refused = [f"{a}:{p}" for a, p in db_targets[1:] + host_targets]
    assert [t for t in refused if results[t] == "0"] == [], output
    assert len(results) == len(db_targets) + len(host_targets), output
    # What reached each listener: exactly the declared connection, nothing at the host.
    assert re.search(r"^again 0$", output, re.M), output
    assert counts == {"declared db:5432": 2, "service without a path db:8081": 0, "undeclared port db:9999": 0}
    assert host_counts == {"loopback": 0, "wildcard": 0}

    # While it ran, its domain end was a tap in the domain (never in the host's namespace); deleting the Machine
    # removed that tap and nothing else of the domain.
    assert running.get(app["domain_ifname"]) == "tun", running
    assert running.get(db["domain_ifname"]) == "veth", running
    expected = dict(running)
    del expected[app["domain_ifname"]]
    assert stopped == expected and restarted == running
    assert deleted == expected
    assert app["domain_ifname"] not in {d["ifname"] for d in json.loads(_sh("ip", "-j", "link", "show"))}


async def test_a_version_1_machine_keeps_user_networking(booted: Booted) -> None:
    """No vz.network label: QEMU user networking exactly as before (10.0.2.15/24 via 10.0.2.2), no tap."""
    driver = booted.driver()
    try:
        result = await run(
            driver, booted.workspace_id, "sh", "-c", "ip -4 -o addr show dev eth0; ip route; cat /proc/cmdline"
        )
    finally:
        await driver.close()
    text = result.stdout.decode()
    assert "inet 10.0.2.15/24" in text and "default via 10.0.2.2" in text, text
    assert "vz.net=" not in text and "vz.dns=" not in text
    (proc,) = qemu_processes(booted.state_dir)
    netdevs = [a for a in proc.cmdline() if a.startswith(("user,", "tap,"))]
    assert netdevs == [
        "user,id=net0,restrict=off,hostname=" + proc.cmdline()[proc.cmdline().index("-name") + 1].split(",")[0]
    ]


def test_two_networks_give_two_taps_and_two_named_interfaces() -> None:
    definition = _definition()
    definition["networks"] = [
        {"name": "front", "machines": ["app", "db"]},
        {"name": "back", "machines": ["app"], "subnet": "10.89.7.0/24"},
    ]
    plan = compile_topology(parse_definition(definition), _env_id()).to_json()
    network = parse_network_label({NETWORK_LABEL: _label(plan, "app")})
    assert network is not None and [a.machine_ifname for a in network.attachments] == ["eth0", "eth1"]
    argv = build_command("qemu", _spec(network=network), (7, 9))
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-netdev"] == [
        "tap,id=net0,fd=7,vhost=off",
        "tap,id=net1,fd=9,vhost=off",
    ]
    macs = [network.mac(a) for a in network.attachments]
    assert len(set(macs)) == 2
    words = argv[argv.index("-append") + 1].split()
    nets = [w for w in words if w.startswith("vz.net=")]
    assert [n.split(",")[:2] for n in nets] == [["vz.net=eth0", macs[0]], ["vz.net=eth1", macs[1]]]
    assert "vz.net=eth1," + macs[1] + ",10.89.7." in nets[1]


async def test_a_bad_label_is_refused_before_anything_is_created(driver: QemuDriver, state_dir: Path) -> None:
    good = json.loads(_label(_plan(_env_id()), "app"))
    good["machines"][0]["attachments"][0]["domain_ifname"] = "eth0"
    request = RunImageRequest(
        workspace_id="bad-label",
        image="vz:default",
        labels=("vz.egress=deny", f"{NETWORK_LABEL}={json.dumps(good)}"),
    )
    with pytest.raises(InvalidArgumentError, match=r"label vz.network: .*domain_ifname"):
        await driver.run_image(request)
    assert await driver.find("bad-label") is None
    machines = state_dir / "machines"
    assert not machines.exists() or list(machines.iterdir()) == []


def test_a_machine_on_two_networks_gets_both_interfaces_in_the_guest(
    tmp_path: Path, image_dir: Path, agent_binary: str
) -> None:
    if os.geteuid() != 0:
        pytest.fail("the qemu route-domain test needs root (network namespaces, taps, nft tables)")
    definition = _definition()
    definition["networks"] = [
        {"name": "front", "machines": ["app", "db"]},
        {"name": "back", "machines": ["app"], "subnet": "10.89.7.0/24"},
    ]
    env = _env_id()
    domain = "vzd-" + env[4:]
    plan = compile_topology(parse_definition(definition), env).to_json()
    attachments = _machine(plan, "app")["attachments"]
    tag = secrets.token_hex(2)
    before = ours(inventory(), tag, {domain})
    state = tmp_path / "state"

    async def scenario() -> tuple[str, dict[str, str]]:
        await ensure_domain(plan)
        driver = make_driver(state, image_dir, agent_binary)
        try:
            await driver.run_image(
                RunImageRequest(
                    workspace_id="two-networks",
                    image="vz:default",
                    labels=("vz.egress=deny", f"{NETWORK_LABEL}={_label(plan, 'app')}"),
                    host_requirements=HostRequirements(cpus=1, memory_bytes=256 * 1024 * 1024),
                    entrypoint="sh",
                    args=("-c", "exec sleep 1000000"),
                )
            )
            links = _domain_links(domain)
            output = await _guest(driver, "two-networks", "ip -4 -o addr; ip route")
            await driver.delete("two-networks")
            return output, links
        finally:
            await driver.close()
            await cleanup_state(str(state), image_dir=str(image_dir), agent_binary=agent_binary)
            await remove_domain(env)

    output, links = asyncio.run(scenario())
    assert qemu_processes(state) == []
    for att in attachments:
        assert links.get(att["domain_ifname"]) == "tun", links
        assert re.search(rf"{att['machine_ifname']}\s+inet {re.escape(att['address'])}/32", output), output
        subnet = next(n["subnet"] for n in plan["networks"] if n["name"] == att["network"])
        assert f"{subnet} via {att['gateway']} dev {att['machine_ifname']}" in output, output
    assert f"default via {attachments[0]['gateway']} dev eth0" in output, output
    after = ours(inventory(), tag, {domain})
    assert after == before, f"leaked: { {k: after[k] - before[k] for k in after} }"
