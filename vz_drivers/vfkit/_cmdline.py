"""The vfkit command line of one Machine, written to vfkit's documented flag grammar.

Targeted interface: vfkit 0.6 (crc-org/vfkit ``doc/usage.md``, ``pkg/config`` and ``pkg/cmdline``). The grammar
facts this module relies on, and which ``tests/vz_drivers/vfkit`` re-checks with a parser written from them:

* ``--device TYPE,item,item...``: vfkit splits the value on **every** comma (no quoting exists for devices),
  each item is ``key`` or ``key=value`` split at the **first** ``=``, empty items are ignored. So a device
  value may contain ``=`` but never ``,``.
* ``--bootloader linux,kernel=...,initrd=...,cmdline="..."``: split on commas **outside** double quotes; the
  quotes stay in the item; ``cmdline``'s value has its surrounding quotes trimmed. ``kernel`` and ``initrd``
  values are taken verbatim (a quote would become part of the path), so they may contain neither ``,`` nor
  ``"``; the command line may contain commas (it is always quoted here) but never ``"``.
* ``--restful-uri unix:///abs/path``: parsed as a URI (scheme ``unix``, no host, non-empty path); the path is
  percent-encoded here so spaces, ``#`` or ``?`` survive.
* ``--cpus N``, ``--memory MiB`` (integers), ``--nested`` (boolean, pkg/cmdline), ``--device rosetta,mountTag=T``.

Values the grammar cannot carry are refused with ``InvalidArgumentError`` naming the value, before anything is
created: nothing is ever "escaped" into a different meaning.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from vz_core.errors import InvalidArgumentError

__all__ = [
    "AGENT_VSOCK_PORT",
    "MAX_TAG_BYTES",
    "READY_VSOCK_PORT",
    "Share",
    "VfkitSpec",
    "build_argv",
    "restful_uri",
]

AGENT_VSOCK_PORT = 1024
"""Guest vsock port the agent listens on; the host reaches it through vfkit (``connect`` mode)."""
READY_VSOCK_PORT = 1025
"""Host vsock port the guest connects to once the agent serves (``listen`` mode): the readiness signal."""
MAX_TAG_BYTES = 36
"""Virtualization.framework's limit for a virtio-fs tag (VZVirtioFileSystemDeviceConfiguration)."""

_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Share:
    """A host directory shared over virtio-fs under ``tag``.

    virtio-fs on Virtualization.framework shares read-write; ``read_only`` is enforced by the guest, which
    mounts the tag with ``-o ro`` (recorded here so the guest configuration and the docs say so).
    """

    tag: str
    path: str
    read_only: bool = False


@dataclass(frozen=True)
class VfkitSpec:
    """Everything one Machine's vfkit command line depends on (all paths absolute)."""

    cpus: int
    memory_mib: int
    kernel: str
    initrd: str
    cmdline: tuple[str, ...]
    disk: str
    console_log: str
    rest_socket: str
    agent_socket: str
    ready_socket: str
    shares: tuple[Share, ...] = ()
    mac: str = ""
    rosetta_tag: str = ""
    nested: bool = False
    rng: bool = True
    network: bool = True
    """A virtio-net device; without it nothing leaves the guest (egress deny)."""
    network_socket: str = ""
    """Attach the NIC to this host Unix datagram socket instead of NAT (``unixSocketPath``): the seam for a
    user-space network stack that realizes exports, imports and allowlists (the network topology work)."""
    extra_devices: tuple[str, ...] = field(default_factory=tuple)
    """Further ``--device`` values, already in vfkit syntax (validated like the others)."""


def _check_path(what: str, value: str, *, bootloader: bool = False) -> str:
    if not value or not PurePosixPath(value).is_absolute():
        raise InvalidArgumentError(f"{what} must be an absolute path, got {value!r}", details={"field": what})
    if "," in value:
        raise InvalidArgumentError(
            f"{what} {value!r} contains a comma, which vfkit's option syntax cannot carry; use a path without ','",
            details={"field": what},
        )
    if bootloader and '"' in value:
        raise InvalidArgumentError(
            f"{what} {value!r} contains a double quote, which vfkit's --bootloader syntax cannot carry",
            details={"field": what},
        )
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise InvalidArgumentError(f"{what} {value!r} contains a control character", details={"field": what})
    return value


def _check_tag(what: str, tag: str) -> str:
    if not _TAG.match(tag) or len(tag.encode()) > MAX_TAG_BYTES:
        raise InvalidArgumentError(
            f"{what} {tag!r} is not a usable virtio-fs tag (1..{MAX_TAG_BYTES} bytes of letters, digits, '.', '_', "
            "'-', starting with a letter or digit)",
            details={"field": what},
        )
    return tag


def restful_uri(socket_path: str) -> str:
    """``unix://`` URI of the REST socket; the path is percent-encoded (vfkit decodes it)."""
    _check_path("rest socket", socket_path)
    return "unix://" + urllib.parse.quote(socket_path, safe="/-._~")


def _kernel_cmdline(args: tuple[str, ...]) -> str:
    line = " ".join(args)
    if not line.strip():
        raise InvalidArgumentError("the kernel command line is empty (vfkit refuses a missing cmdline)")
    if '"' in line:
        raise InvalidArgumentError(
            f"the kernel command line {line!r} contains a double quote, which vfkit's --bootloader syntax cannot carry"
        )
    if any(ord(c) < 0x20 or c == "\x7f" for c in line):
        raise InvalidArgumentError("the kernel command line contains a control character")
    return line


def _check_device(value: str) -> str:
    kind = value.split(",", 1)[0]
    if not kind or any(ord(c) < 0x20 for c in value):
        raise InvalidArgumentError(f"extra device {value!r} is not a vfkit --device value")
    return value


def build_argv(vfkit: str, spec: VfkitSpec) -> list[str]:
    """The complete argv (``vfkit`` path first) for ``spec``; ``InvalidArgumentError`` for unrepresentable values."""
    if spec.cpus < 1:
        raise InvalidArgumentError(f"cpus must be at least 1, got {spec.cpus}", details={"field": "cpus"})
    if spec.memory_mib < 1:
        raise InvalidArgumentError(f"memory must be at least 1 MiB, got {spec.memory_mib}", details={"field": "memory"})
    kernel = _check_path("kernel", spec.kernel, bootloader=True)
    initrd = _check_path("initrd", spec.initrd, bootloader=True)
    cmdline = _kernel_cmdline(spec.cmdline)
    argv = [
        vfkit,
        "--cpus",
        str(spec.cpus),
        "--memory",
        str(spec.memory_mib),
        "--bootloader",
        f'linux,kernel={kernel},initrd={initrd},cmdline="{cmdline}"',
        "--restful-uri",
        restful_uri(spec.rest_socket),
        "--device",
        f"virtio-blk,path={_check_path('disk', spec.disk)}",
        "--device",
        f"virtio-serial,logFilePath={_check_path('console log', spec.console_log)}",
    ]
    if spec.network_socket:
        net = f"virtio-net,unixSocketPath={_check_path('network socket', spec.network_socket)}"
    else:
        net = "virtio-net,nat"
    if spec.mac:
        if not _MAC.match(spec.mac):
            raise InvalidArgumentError(f"mac {spec.mac!r} is not a MAC address (xx:xx:xx:xx:xx:xx)")
        net += f",mac={spec.mac.lower()}"
    if spec.network:
        argv += ["--device", net]
    if spec.rng:
        argv += ["--device", "virtio-rng"]
    argv += [
        "--device",
        f"virtio-vsock,port={AGENT_VSOCK_PORT},socketURL={_check_path('agent socket', spec.agent_socket)},connect",
        "--device",
        f"virtio-vsock,port={READY_VSOCK_PORT},socketURL={_check_path('ready socket', spec.ready_socket)},listen",
    ]
    tags: set[str] = set()
    for share in spec.shares:
        tag = _check_tag("share tag", share.tag)
        if tag in tags or tag == spec.rosetta_tag:
            raise InvalidArgumentError(f"share tag {tag!r} is used twice")
        tags.add(tag)
        argv += ["--device", f"virtio-fs,sharedDir={_check_path('shared directory', share.path)},mountTag={tag}"]
    if spec.rosetta_tag:
        argv += ["--device", f"rosetta,mountTag={_check_tag('rosetta tag', spec.rosetta_tag)}"]
    for extra in spec.extra_devices:
        argv += ["--device", _check_device(extra)]
    if spec.nested:
        argv.append("--nested")
    return argv
