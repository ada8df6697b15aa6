"""A version 1 qemu Machine's ``allow`` egress: its QEMU runs in a network namespace of its own, behind the host guard.

QEMU user networking (slirp) makes the guest's connections with the sockets of QEMU's own process. Run in the
host's namespace, that made every host address reachable, and 10.0.2.2 (slirp's gateway, which slirp maps to
127.0.0.1) the host's loopback. So a version 1 Machine with egress ``allow`` gets what a linux_native Machine
gets, from the same code (``vz_drivers._machine.setup_network``): a network namespace whose only way out is a
veth pair whose host end (``vz<key12>``) carries the host table of the subnet (``inet vz_<subnet>``: nothing to
any host address, another Machine or Environment, link-local or the host's directly connected networks; only
the namespace's address leaves, masqueraded). QEMU is started in that namespace (``nsenter --net``), so slirp's
connections are the namespace's: 10.0.2.2 and the guest's own forwards to the host's loopback land on the
namespace's loopback, where nothing listens, and the kernel, not the guest, refuses the rest.

The namespace is created under ``/run/netns/vzq<key12>`` only while the Machine boots; once QEMU runs in it the
name is removed, so the namespace (and its veth pair) lives exactly as long as QEMU. ``release`` removes the
host end at once (the kernel destroys a namespace some time after its last process exits) and the host table
when no Machine of the subnet is left.

Egress ``deny`` keeps ``restrict=on`` (slirp forwards nothing out of the guest) and needs none of this; version 2
Machines use tap devices in their route domain (``_attach.py``). qemu publishes no ports over user networking
(no ``hostfwd``): a version 2 Environment's published ports are served by the daemon from its route domain.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from vz_core.errors import InvalidArgumentError, RuntimeFailureError, UnavailableError
from vz_core.network import NETNS_DIR, NetworkTools
from vz_drivers._machine import NetworkConfig, remove_host_link, remove_host_table, setup_network

__all__ = ["EgressNamespace", "netns_name"]


def netns_name(key: str) -> str:
    """The name of a Machine's namespace while it boots (``vzq`` + 12 hex digits of its key)."""
    return f"vzq{key[:12]}"


class EgressNamespace:
    """The namespaces of version 1 ``allow`` Machines of one driver object, their links in ``subnet`` (the driver
    option; linux_native's default too, so one host table guards the version 1 Machines of both drivers)."""

    def __init__(self, subnet: str) -> None:
        self.subnet = subnet
        self._cfg: NetworkConfig | None = None

    def config(self) -> NetworkConfig:
        """The tools and address pool (checked on first use): ``UnavailableError`` naming what is missing."""
        if self._cfg is None:
            if os.geteuid() != 0:
                raise UnavailableError(
                    "a version 1 qemu Machine with egress allow runs QEMU in a network namespace of its own behind "
                    "the host's guard (veth pair, nftables), which needs root; run vz as root, declare egress deny, "
                    "or use a version 2 vz.json (its route domain needs root too)"
                )
            tools = NetworkTools.find()
            try:
                self._cfg = NetworkConfig(ip=tools.ip, nsenter=tools.nsenter, nft=tools.nft, subnet=self.subnet)
            except ValueError as exc:
                raise InvalidArgumentError(f"subnet {self.subnet!r}: {exc}", details={"option": "subnet"}) from None
        return self._cfg

    async def prepare(self, key: str) -> list[str]:
        """Create the Machine's namespace with its guarded link; the argv prefix that runs QEMU in it."""
        cfg = self.config()
        name = netns_name(key)
        await self.forget(key)  # a crashed boot's name
        await _run([cfg.ip, "netns", "add", name], what=f"network namespace {name}")
        try:
            await _run([cfg.ip, "-n", name, "link", "set", "lo", "up"], what="namespace loopback")
            await setup_network(cfg, key=key, egress="allow", netns=name)
        except BaseException:
            await self.release(key)
            raise
        return [cfg.nsenter, f"--net={NETNS_DIR}/{name}", "--"]

    async def forget(self, key: str) -> None:
        """Remove the namespace's name (QEMU, once running in it, keeps the namespace itself alive)."""
        cfg = self.config()
        name = netns_name(key)
        if await asyncio.to_thread(os.path.lexists, NETNS_DIR / name):
            with contextlib.suppress(RuntimeFailureError):
                await _run([cfg.ip, "netns", "del", name], what=f"remove the network namespace {name}")

    async def release(self, key: str) -> None:
        """After QEMU is gone: the name, the host end of the veth and, when unused, the subnet's host table."""
        cfg = self.config()
        await self.forget(key)
        await remove_host_link(cfg, key)
        await remove_host_table(cfg)


async def _run(argv: list[str], *, what: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeFailureError(f"network setup failed: {what}", runtime_message=err.decode(errors="replace").strip())
