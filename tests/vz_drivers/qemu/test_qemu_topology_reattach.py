"""A qemu Machine whose attachments changed after its creation takes the new ones at its next start.

One real VM (TCG here) is created with the ``vz.network`` label of a one-network plan. The plan then changes as
`vz up` would record it (the network gets a declared subnet, a second network is added): the recorded slice
(``vz_core.network.label.write_slices``) says the running Machine needs re-attaching; after a stop and a start
its taps are the new plan's, the guest has exactly the new addresses and the new plan's DNS server in its
resolv.conf (not QEMU user networking's, even with the driver-level egress "allow"), and nothing needs
re-attaching any more.
Nothing is left on the host afterwards (QEMU, taps, namespaces, recorded slices).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from qemu_testlib import make_driver, qemu_processes

from vz_core import ExecOutput, ExecSpec, HostRequirements, RunImageRequest
from vz_core.env import compile_topology
from vz_core.env._definition import parse_definition
from vz_core.network import ensure_domain, remove_domain
from vz_core.network.label import SLICES_DIR, machine_slice, needs_reattach, remove_slices, write_slices
from vz_drivers._machine import no_input
from vz_drivers.qemu import cleanup_state
from vz_drivers.qemu._attach import NETWORK_LABEL

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vz_core" / "network"))
from netns_kit import inventory, ours

pytestmark = [pytest.mark.root, pytest.mark.slow]

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
BEFORE = {
    "version": 2,
    "project_id": "qemu-reattach",
    "machines": [
        {"name": "app", "profile": "developer", "driver": "qemu", "image": "vz:default"},
        {"name": "db", "profile": "developer", "driver": "linux_native", "image": "vz:default"},
    ],
    "networks": [{"name": "front", "machines": ["app", "db"]}],
    "default_machine": "app",
}
AFTER = {
    **BEFORE,
    "networks": [
        {"name": "front", "machines": ["app", "db"], "subnet": "10.77.5.0/24"},
        {"name": "back", "machines": ["app"], "subnet": "10.77.6.0/24"},
    ],
}


def _random(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(12))


def _links(domain: str) -> dict[str, str]:
    import json

    out = subprocess.run(["ip", "-n", domain, "-j", "-d", "link", "show"], capture_output=True, text=True, check=True)
    return {d["ifname"]: (d.get("linkinfo") or {}).get("info_kind", "") for d in json.loads(out.stdout or "[]")}


async def _guest(driver: Any, workspace_id: str, script: str) -> str:
    out = b""
    async for event in driver.exec(ExecSpec(workspace_id=workspace_id, argv=("sh", "-c", script)), no_input()):
        if isinstance(event, ExecOutput) and event.stream == "stdout":
            out += event.data
    return out.decode()


def test_a_running_qemu_machine_is_re_attached_by_its_next_start(
    tmp_path: Path, image_dir: Path, agent_binary: str
) -> None:
    if os.geteuid() != 0:
        pytest.fail("the qemu route-domain test needs root (network namespaces, taps, nft tables)")
    env, machine_id = _random("env_"), _random("mch_")
    domain = "vzd-" + env[4:]
    before = compile_topology(parse_definition(BEFORE), env).to_json()
    after = compile_topology(parse_definition(AFTER), env).to_json()
    old, new = machine_slice(before, "app"), machine_slice(after, "app")
    assert old is not None and new is not None and old != new
    tag = secrets.token_hex(2)
    leftovers = ours(inventory(), tag, {domain})
    state = tmp_path / "state"
    labels = (
        "vz.egress=allow",  # the route domain decides, not QEMU user networking (nor its resolv.conf)
        f"dev.vz.environment={env}",
        f"dev.vz.machine={machine_id}",
        f"{NETWORK_LABEL}={old}",
    )
    wsid = "reattach"

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        await ensure_domain(before)
        driver = make_driver(state, image_dir, agent_binary)
        try:
            await driver.run_image(
                RunImageRequest(
                    workspace_id=wsid,
                    image="vz:default",
                    labels=labels,
                    host_requirements=HostRequirements(cpus=1, memory_bytes=256 * 1024 * 1024),
                    entrypoint="sh",
                    args=("-c", "exec sleep 1000000"),
                )
            )
            seen["before"] = await _guest(driver, wsid, "ip -4 -o addr")
            # What `vz up` does with the changed vz.json: the domain converged, the current slice recorded.
            await ensure_domain(after)
            await asyncio.to_thread(write_slices, env, {machine_id: new})
            seen["stale"] = needs_reattach(env, machine_id, new, old)
            await driver.stop(wsid)
            await driver.start(wsid)
            seen["after"] = await _guest(driver, wsid, "ip -4 -o addr; ip route")
            seen["resolv"] = await _guest(driver, wsid, "cat /etc/resolv.conf")
            seen["links"] = _links(domain)
            seen["converged"] = not needs_reattach(env, machine_id, new, old)
            await driver.delete(wsid)
            return seen
        finally:
            await driver.close()
            await cleanup_state(str(state), image_dir=str(image_dir), agent_binary=agent_binary)
            await remove_domain(env)
            remove_slices(env)

    seen = asyncio.run(scenario())
    assert qemu_processes(state) == []
    old_app = next(m for m in before["machines"] if m["name"] == "app")["attachments"]
    new_app = next(m for m in after["machines"] if m["name"] == "app")["attachments"]
    assert f"inet {old_app[0]['address']}/32" in seen["before"]
    assert seen["stale"] is True
    for att in new_app:
        assert seen["links"].get(att["domain_ifname"]) == "tun", seen["links"]
        assert re.search(rf"{att['machine_ifname']}\s+inet {re.escape(att['address'])}/32", seen["after"])
    assert f"inet {old_app[0]['address']}/32" not in seen["after"]
    assert f"default via {new_app[0]['gateway']} dev eth0" in seen["after"], seen["after"]
    assert seen["converged"] is True
    dns = next(m for m in after["machines"] if m["name"] == "app")["dns_server"]
    assert seen["resolv"] == f"nameserver {dns}\nsearch vz.internal\n", seen["resolv"]
    assert not (SLICES_DIR / domain).exists()
    assert ours(inventory(), tag, {domain}) == leftovers
