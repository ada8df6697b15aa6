"""Version 1 egress networking: a network namespace per Machine joined to the host by a guarded veth.

This is the networking of Machines without a route domain (version 1 definitions, and any Machine created
without the ``vz.network`` label): linux_native's container namespace (set up between ``runc create`` and
``runc start``, found by the container's pid) and, for qemu, a namespace the driver creates for the Machine's
QEMU process (found by its name; QEMU's user networking then makes its connections from inside it). A Machine
with the label is attached to its Environment's route domain instead and never touches the host-wide pool or
the host table below.

* ``allow``: a veth pair, host end ``vz<key[:12]>`` with ``<subnet>.4i+1/30`` (IPv6 off), namespace end ``eth0``
  with ``.4i+2/30`` and a default route via the host end. The host forwards IPv4 and guards the host from these
  links with the rules a version 2 uplink gets (``vz_core.network.ensure_direct_egress``: the table
  ``inet vz_<subnet>``): nothing reaches any address of the host (the host end included, whatever listens on
  0.0.0.0), another Machine or Environment, link-local addresses or the host's directly connected networks;
  only the namespace's own address leaves its link, masqueraded; DNS to the host's resolvers is admitted. What
  the host reaches through a gateway (the internet, routed private networks), the Machine can. One table per
  subnet guards the links of every driver using it (the slot pool and its lock are host-wide).
* ``deny``: the namespace is never connected to the host. A veth pair with both ends inside it carries a
  default route so that connects fail fast, and an nftables ``output`` chain inside the namespace rejects
  everything but loopback (TCP reset / ICMP), so outbound connections are refused and no packet leaves.
  Loopback and the agent's Unix socket keep working.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
from collections.abc import AsyncIterator
from pathlib import Path

from vz_core.errors import RuntimeFailureError, UnavailableError
from vz_core.network import NETNS_DIR, NetworkTools, direct_table, ensure_direct_egress, remove_direct_egress

__all__ = [
    "NetworkConfig",
    "check_subnet",
    "host_routes",
    "host_table_name",
    "remove_host_link",
    "remove_host_table",
    "setup_network",
]

DENY_RULES = """
table inet vz_egress {
  chain output {
    type filter hook output priority 0; policy accept;
    oifname "lo" accept
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }
}
"""


class NetworkConfig:
    """Tools and the address pool used for ``allow`` Machines."""

    def __init__(self, *, ip: str, nsenter: str, nft: str, subnet: str) -> None:
        self.ip = ip
        self.nsenter = nsenter
        self.nft = nft
        self.subnet = ipaddress.IPv4Network(subnet)
        if self.subnet.prefixlen > 28:
            raise ValueError("the Machine subnet must be /28 or larger")
        check_subnet(self.subnet)

    @property
    def slots(self) -> int:
        return self.subnet.num_addresses // 4 - 1

    def addresses(self, index: int) -> tuple[str, str]:
        """(host end, Machine end) addresses of /30 slot ``index`` (slot 0 is never used)."""
        base = int(self.subnet.network_address) + 4 * (index + 1)
        return str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2))

    def missing_tools(self, egress: str) -> list[str]:
        missing = []
        if not self.ip:
            missing.append("ip (apt-get install iproute2)")
        if not self.nsenter:
            missing.append("nsenter (apt-get install util-linux)")
        if egress == "deny" and not self.nft:
            missing.append("nft (apt-get install nftables)")
        if egress == "allow" and not self.nft:
            missing.append("nft (apt-get install nftables)")
        return missing


_SPECIAL = (
    (ipaddress.IPv4Network("0.0.0.0/8"), "'this network' (0.0.0.0/8)"),
    (ipaddress.IPv4Network("127.0.0.0/8"), "loopback (127.0.0.0/8)"),
    (ipaddress.IPv4Network("169.254.0.0/16"), "link-local (169.254.0.0/16)"),
    (ipaddress.IPv4Network("224.0.0.0/4"), "multicast (224.0.0.0/4)"),
    (ipaddress.IPv4Network("240.0.0.0/4"), "reserved (240.0.0.0/4, broadcast included)"),
)


def host_routes(path: Path = Path("/proc/net/route")) -> list[tuple[str, ipaddress.IPv4Network]]:
    """The host's IPv4 routes as (interface, destination), the default route left out."""
    routes: list[tuple[str, ipaddress.IPv4Network]] = []
    try:
        lines = path.read_text().splitlines()[1:]
    except OSError:
        return routes
    for line in lines:
        parts = line.split()
        if len(parts) < 8:
            continue
        try:
            dest = ipaddress.IPv4Address(int(parts[1], 16).to_bytes(4, "little"))
            mask = ipaddress.IPv4Address(int(parts[7], 16).to_bytes(4, "little"))
            net = ipaddress.IPv4Network(f"{dest}/{mask}", strict=False)
        except ValueError:
            continue
        if net.prefixlen:
            routes.append((parts[0], net))
    return routes


def check_subnet(subnet: ipaddress.IPv4Network, routes: list[tuple[str, ipaddress.IPv4Network]] | None = None) -> None:
    """Refuse a Machine subnet that is special-purpose or that the host already routes elsewhere.

    Runs before anything is created (no table, no link). Routes through vz's own veth ends (``vz...``) are
    Machines of this or another state directory on the same subnet: those are fine.
    """
    for special, what in _SPECIAL:
        if subnet.overlaps(special):
            raise ValueError(f"it overlaps the {what} range; choose a private range such as 10.231.0.0/16")
    for dev, net in host_routes() if routes is None else routes:
        if dev.startswith("vz") or not subnet.overlaps(net):
            continue
        raise ValueError(
            f"it overlaps the host route {net} on {dev}; Machines would shadow it; choose an unused private range"
        )


def host_table_name(subnet: ipaddress.IPv4Network) -> str:
    """The host table of the subnet's Machine links (``inet vz_10_231_0_0_16``)."""
    return direct_table(subnet)


async def _run(argv: list[str], stdin: bytes = b"", what: str = "") -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate(stdin)
    if proc.returncode != 0:
        raise RuntimeFailureError(
            f"network setup failed: {what or argv[0]}", runtime_message=err.decode(errors="replace").strip()
        )


def _write_sysctl(path: str, value: str) -> None:
    p = Path(path)
    if p.read_text().strip() != value:
        p.write_text(value)


def _tools(cfg: NetworkConfig) -> NetworkTools:
    return NetworkTools(ip=cfg.ip, nft=cfg.nft, nsenter=cfg.nsenter, sysctl="")


async def ensure_host_guard(cfg: NetworkConfig) -> None:
    """Forwarding on and the subnet's host table written for the Machine links there now (under the host lock)."""
    try:
        _write_sysctl("/proc/sys/net/ipv4/ip_forward", "1")
    except OSError as exc:
        raise UnavailableError(f"cannot enable IPv4 forwarding for egress: {exc.strerror}") from None
    links = {name: ipaddress.IPv4Address(int(host) + 1) for name, (_, host) in (await _links(cfg)).items()}
    await ensure_direct_egress(cfg.subnet, links, tools=_tools(cfg))


async def remove_host_table(cfg: NetworkConfig) -> None:
    """Remove the masquerade table when no running Machine of any driver process uses the subnet.

    Taken under the host lock that every start takes to ensure the table and claim a slot, so a Machine
    being started by another driver process never loses its table.
    """
    if not cfg.nft or not cfg.ip:
        return
    table = host_table_name(cfg.subnet)
    async with _host_lock():
        if await _used_slots(cfg) or not (
            await _table_exists(cfg, "inet", table) or await _table_exists(cfg, "ip", table)
        ):
            return
        with contextlib.suppress(RuntimeFailureError):
            await remove_direct_egress(cfg.subnet, tools=_tools(cfg))


async def _table_exists(cfg: NetworkConfig, family: str, table: str) -> bool:
    proc = await asyncio.create_subprocess_exec(
        cfg.nft, "list", "table", family, table, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await proc.wait() == 0


async def remove_host_link(cfg: NetworkConfig, key: str) -> None:
    """Delete the host end of a Machine's veth now (idempotent).

    The kernel removes it by itself only when the Machine's network namespace is destroyed, which happens some
    time after the container's last process has exited; until then its address still counts as a used slot,
    and :func:`remove_host_table` would keep the masquerade table of a subnet that nothing uses any more.
    """
    host_if = f"vz{key[:12]}"
    if not cfg.ip:
        return
    present: bool = await asyncio.to_thread(os.path.lexists, f"/sys/class/net/{host_if}")
    if present:
        with contextlib.suppress(RuntimeFailureError):
            await _run([cfg.ip, "link", "del", host_if])


HOST_LOCK = Path("/run/lock/vz-linux-native-net.lock")


@contextlib.asynccontextmanager
async def _host_lock() -> AsyncIterator[None]:
    """Serialize address allocation between every driver process on this host (any state directory)."""
    HOST_LOCK.parent.mkdir(parents=True, exist_ok=True)
    from vz_core.platform.locks import lock_file

    fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT, 0o600)  # close-on-exec by default (PEP 446)
    try:
        await asyncio.to_thread(lock_file, fd)
        yield
    finally:
        os.close(fd)


async def _links(cfg: NetworkConfig) -> dict[str, tuple[int, ipaddress.IPv4Address]]:
    """The host's links holding an address of the subnet: name -> (slot, that address: the host end's)."""
    proc = await asyncio.create_subprocess_exec(
        cfg.ip, "-o", "-4", "addr", "show", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await proc.communicate()
    found: dict[str, tuple[int, ipaddress.IPv4Address]] = {}
    base = int(cfg.subnet.network_address)
    for line in out.decode(errors="replace").splitlines():
        parts = line.split()
        if "inet" in parts and len(parts) > 1:
            addr = ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).ip
            if addr in cfg.subnet:
                found[parts[1].split("@")[0]] = ((int(addr) - base) // 4 - 1, addr)
    return found


async def _used_slots(cfg: NetworkConfig) -> set[int]:
    return {slot for slot, _ in (await _links(cfg)).values()}


async def setup_network(cfg: NetworkConfig, *, key: str, egress: str, pid: int = 0, netns: str = "") -> None:
    """Configure a Machine's network namespace: that of the process ``pid`` (a created, not yet started
    container's init) or the named namespace ``netns`` (``ip netns add``; under ``/run/netns``).

    An ``allow`` Machine gets a free /30 of the subnet at each start: a slot is free when no interface of the
    host holds an address in it, so every driver process on the host (whatever its state directory) agrees,
    and a stopped Machine holds nothing.
    """
    if bool(pid) == bool(netns):
        raise ValueError("setup_network needs exactly one of pid and netns")
    inside = [cfg.nsenter, "-t", str(pid), "-n"] if pid else [cfg.nsenter, f"--net={NETNS_DIR}/{netns}"]
    target = str(pid) if pid else netns
    if egress == "deny":
        batch = (
            "link add vz0 type veth peer name vz1\n"
            "addr add 169.254.77.2/30 dev vz0\n"
            "link set vz0 up\n"
            "link set vz1 up\n"
            "route add default via 169.254.77.1 dev vz0 onlink\n"
        )
        await _run([*inside, cfg.ip, "-batch", "-"], batch.encode(), what="isolated namespace links")
        await _run([*inside, cfg.nft, "-f", "-"], DENY_RULES.encode(), what="egress deny rules")
        return
    host_if = f"vz{key[:12]}"
    # A stale host end (a crashed start) would make the add fail: remove it first.
    if await asyncio.to_thread(os.path.lexists, f"/sys/class/net/{host_if}"):
        with contextlib.suppress(RuntimeFailureError):
            await _run([cfg.ip, "link", "del", host_if])
    async with _host_lock():
        # Under the lock that removal takes too: the table exists whenever a Machine holds a slot, and lists the
        # new link before the Machine's process runs (it starts after this returns).
        used = await _used_slots(cfg)
        index = next((i for i in range(cfg.slots) if i not in used), None)
        if index is None:
            raise UnavailableError(f"no free address left in {cfg.subnet} for another Machine with egress allowed")
        host_addr, machine_addr = cfg.addresses(index)
        await _run(
            [cfg.ip, "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", target],
            what="veth pair",
        )
        for name, value in (("ipv6/conf/{}/disable_ipv6", "1"), ("ipv4/conf/{}/forwarding", "1")):
            with contextlib.suppress(OSError):
                _write_sysctl("/proc/sys/net/" + name.format(host_if), value)
        host_batch = f"addr add {host_addr}/30 dev {host_if}\nlink set {host_if} up\n"
        await _run([cfg.ip, "-batch", "-"], host_batch.encode(), what="veth pair")
        await ensure_host_guard(cfg)
    inner = f"addr add {machine_addr}/30 dev eth0\nlink set eth0 up\nroute add default via {host_addr}\n"
    await _run([*inside, cfg.ip, "-batch", "-"], inner.encode(), what="Machine interface")
