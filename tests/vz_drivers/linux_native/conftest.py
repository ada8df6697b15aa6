"""Fixtures for the linux_native tests: real runc, real mounts, real namespaces (root required)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from vz_drivers.linux_native import LinuxNativeDriver, cleanup_state


def _require_host() -> None:
    if os.geteuid() != 0:
        pytest.fail("the linux_native tests need root (namespaces, cgroups, overlay mounts)")
    for tool in ("runc", "ip", "nft", "nsenter"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: apt-get install runc iproute2 nftables util-linux")


@pytest.fixture
async def driver(state_dir: Path, image_dir: Path, agent_binary: str) -> AsyncIterator[LinuxNativeDriver]:
    _require_host()
    drv = LinuxNativeDriver(
        state_dir=state_dir, image_dir=image_dir, agent_binary=agent_binary, stop_timeout=5, subnet="10.231.0.0/16"
    )
    try:
        yield drv
    finally:
        await drv.close()
        await cleanup_state(str(state_dir), image_dir=str(image_dir), agent_binary=agent_binary)


@pytest.fixture
def netns_destination() -> Iterator[tuple[str, str]]:
    """A TCP listener in a test-made network namespace reachable from the host through a veth pair.

    Yields (address, netns name); an nftables counter in the namespace counts TCP packets to port 8080. The
    address (198.18.251.2, of the benchmarking range) is routed by the host through the namespace's end of the
    veth (172.31.251.2, a gateway): a Machine's egress reaches what the host routes through a gateway, never a
    directly connected network (docs/network.md).
    """
    name = f"vzt-dst-{os.getpid()}"
    host_if, peer_if = f"vzt{os.getpid() % 100000}h", f"vzt{os.getpid() % 100000}p"
    cmds = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if, "netns", name],
        ["ip", "addr", "add", "172.31.251.1/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "-n", name, "addr", "add", "172.31.251.2/30", "dev", peer_if],
        ["ip", "-n", name, "link", "set", peer_if, "up"],
        ["ip", "-n", name, "link", "set", "lo", "up"],
        ["ip", "-n", name, "addr", "add", "198.18.251.2/32", "dev", "lo"],
        ["ip", "route", "add", "198.18.251.2/32", "via", "172.31.251.2", "dev", host_if],
    ]
    counter = (
        b"table inet vztest {\n chain input {\n type filter hook input priority 0;\n tcp dport 8080 counter\n }\n}\n"
    )
    try:
        for cmd in cmds:
            subprocess.run(cmd, check=True, capture_output=True)
        subprocess.run(["ip", "netns", "exec", name, "nft", "-f", "-"], input=counter, check=True, capture_output=True)
        yield "198.18.251.2", name
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
