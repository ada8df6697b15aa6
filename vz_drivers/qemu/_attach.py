"""A version 2 Machine's attachment to its Environment's route domain: tap devices instead of user networking.

The Machine's slice of the topology plan arrives as the label ``vz.network`` (compact JSON; the slice is itself
a one-Machine plan, so ``vz_core.network.DomainSpec.from_plan`` checks every name and address in it). For each
attachment the host creates the domain end as a tap device named by the plan (``v<10 hex>``) *inside* the
domain's namespace (``TUNSETIFF`` from a thread joined to it: nothing appears in the host's namespace),
configures it exactly like a veth domain end (the gateway as /32, a /32 route to the Machine), and hands the
open descriptor to QEMU (``-netdev tap,fd=N,vhost=off``). The tap is not persistent: it lives as long as QEMU
holds it, so a stopped or killed Machine leaves no link behind; ``remove_taps`` removes a leftover one.

Inside the guest, the init (``vz_network`` of ``vz_drivers._guest._initramfs``) reads ``vz.net=IFNAME,MAC,ADDRESS,
GATEWAY,SUBNET`` words from the kernel command line, gives the interface with that MAC its name and address
(/32, link route to the gateway, the subnet via the gateway, the default route via the first gateway) and, from
``vz.dns=``/``vz.search=``, writes the Machine's ``/etc/resolv.conf``. Every value there was checked here.

At every start the Machine is attached with its **current** slice (``vz_core.network.label.current_slice``: the
one ``vz up`` recorded when the Machine's attachments changed after its creation, else the label's): new taps
and new kernel arguments, so a changed attachment is taken at the next boot; ``open_taps`` notes it for ``vz up``
(``note_attached``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import os
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vz_core.errors import FailedPreconditionError, RuntimeFailureError, UnavailableError
from vz_core.network import NETNS_DIR, AttachmentSpec, NetworkTools
from vz_core.network.label import LABEL, MachineSlice, current_slice, note_attached

__all__ = [
    "NETWORK_LABEL",
    "TOPOLOGY_FACT",
    "GuestNetwork",
    "open_taps",
    "parse_network_label",
    "remove_taps",
]

NETWORK_LABEL = LABEL
TOPOLOGY_FACT = (
    "route-domain attachment: a RunImage label vz.network=<the Machine's topology plan slice as JSON> joins the "
    "Machine to the Environment's route domain through a tap device (vz_core.network; the domain is created by the "
    "caller before RunImage) instead of QEMU user networking; resolv.conf names the plan's DNS server "
    "(docs/network.md)"
)
_ENV_LABEL = "dev.vz.environment"
_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class GuestNetwork:
    """What a Machine's route-domain attachment needs on the host (taps) and in the guest (kernel arguments)."""

    environment_id: str
    domain: str
    machine: str
    attachments: tuple[AttachmentSpec, ...]
    dns_server: str
    search: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    source: MachineSlice | None = field(default=None, compare=False, repr=False)

    def mac(self, attachment: AttachmentSpec) -> str:
        """A stable, locally administered MAC per attachment: 02 + the 10 hex digits of its domain end's name."""
        digits = attachment.domain_ifname[1:]
        return "02:" + ":".join(digits[i : i + 2] for i in range(0, 10, 2))

    def kernel_args(self) -> tuple[str, ...]:
        args = [f"vz.net={a.machine_ifname},{self.mac(a)},{a.address},{a.gateway},{a.subnet}" for a in self.attachments]
        if self.dns_server and self.attachments:
            args.append(f"vz.dns={self.dns_server}")
            if self.search:
                args.append("vz.search=" + ",".join(self.search))
        return tuple(args)


def parse_network_label(labels: Mapping[str, str]) -> GuestNetwork | None:
    """The Machine's route-domain attachment: its current slice (``vz_core.network.label.current_slice``: the
    one ``vz up`` recorded, else the ``vz.network`` label's); None without either (version 1) or when it is
    attached to no network now (QEMU user networking under the Machine's ``deny``).

    Read with ``vz_core.network.label.parse_machine_slice``, the same checks (and messages) as linux_native's:
    InvalidArgumentError naming what is wrong, before anything is touched."""
    found = current_slice(labels)
    if found is None:
        return None
    return GuestNetwork(
        environment_id=found.spec.environment_id,
        domain=found.spec.name,
        machine=found.machine,
        attachments=found.attachments,
        dns_server=found.dns_server,
        search=found.search,
        labels=dict(labels),
        source=found,
    )


def _require_root() -> None:
    if os.geteuid() != 0:
        raise UnavailableError("a version 2 Machine on qemu joins its route domain through taps, which needs root")


async def _run(argv: list[str], stdin: bytes = b"", what: str = "") -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate(stdin)
    if proc.returncode != 0:
        raise RuntimeFailureError(f"route domain: {what} failed", runtime_message=err.decode(errors="replace").strip())
    return out.decode(errors="replace")


async def _links(tools: NetworkTools, netns: str) -> dict[str, dict[str, Any]]:
    out = await _run([tools.nsenter, f"--net={netns}", "--", tools.ip, "-j", "-d", "link", "show"], what="list links")
    return {d["ifname"]: d for d in json.loads(out or "[]") if isinstance(d, dict) and "ifname" in d}


def _create_tap(netns: str, ifname: str) -> int:
    """A non-persistent tap named ``ifname`` created in the namespace at ``netns``; its descriptor (close-on-exec)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            ns = os.open(netns, os.O_RDONLY)
            try:
                if _libc.setns(ns, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {netns}: {os.strerror(err)}")
            finally:
                os.close(ns)
            fd = os.open("/dev/net/tun", os.O_RDWR)
            try:
                fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", ifname.encode(), _IFF_TAP | _IFF_NO_PI))
            except BaseException:
                os.close(fd)
                raise
            box["fd"] = fd
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    # A thread of its own: setns changes only this thread's namespace, and it ends right after.
    thread = threading.Thread(target=target, name=f"tap-{ifname}")
    thread.start()
    thread.join()
    if "error" in box:
        exc = box["error"]
        raise RuntimeFailureError(f"route domain: creating the tap {ifname} failed: {exc}") from None
    fd: int = box["fd"]
    return fd


async def open_taps(network: GuestNetwork, *, tools: NetworkTools | None = None) -> list[int]:
    """Create and configure the Machine's tap devices in its route domain; their descriptors, in attachment order.

    The domain must exist (the Environment's ``ensure_domain``). A stale link of the same name (a previous boot's,
    or anything else there under that name) is removed first. The caller owns the descriptors."""
    _require_root()
    tools = tools or NetworkTools.find()
    netns = str(NETNS_DIR / network.domain)
    if not await asyncio.to_thread(os.path.lexists, netns):
        raise FailedPreconditionError(
            f"the route domain {network.domain} of Machine {network.machine!r} does not exist; `vz up` creates it "
            "before the Machine starts"
        )
    present = await _links(tools, netns)
    fds: list[int] = []
    try:
        for att in network.attachments:
            if att.domain_ifname in present:
                await _run(
                    [tools.nsenter, f"--net={netns}", "--", tools.ip, "link", "del", att.domain_ifname],
                    what=f"remove the stale {att.domain_ifname}",
                )
            fds.append(await asyncio.to_thread(_create_tap, netns, att.domain_ifname))
            batch = (
                f"link set {att.domain_ifname} up\n"
                f"addr replace {att.gateway}/32 dev {att.domain_ifname}\n"
                f"route replace {att.address}/32 dev {att.domain_ifname} scope link src {att.gateway}\n"
            )
            await _run(
                [tools.nsenter, f"--net={netns}", "--", tools.ip, "-batch", "-"],
                batch.encode(),
                what=f"domain end {att.domain_ifname} of {network.machine}",
            )
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    if network.source is not None:
        note_attached(network.labels, network.source)
    return fds


async def remove_taps(network: GuestNetwork, *, tools: NetworkTools | None = None) -> list[str]:
    """Remove the Machine's tap devices still present in its domain (QEMU normally takes them along); only taps
    named by its attachments, nothing else. Returns the names removed."""
    netns = str(NETNS_DIR / network.domain)
    if os.geteuid() != 0 or not await asyncio.to_thread(os.path.lexists, netns):
        return []
    tools = tools or NetworkTools.find()
    present = await _links(tools, netns)
    removed = []
    for att in network.attachments:
        link = present.get(att.domain_ifname)
        if link is None or (link.get("linkinfo") or {}).get("info_kind") != "tun":
            continue
        with contextlib.suppress(RuntimeFailureError):
            await _run(
                [tools.nsenter, f"--net={netns}", "--", tools.ip, "link", "del", att.domain_ifname],
                what=f"remove {att.domain_ifname}",
            )
            removed.append(att.domain_ifname)
    return removed
