"""The bottom of route domains: the host tools they run (``NetworkTools``), running one of them (``run``), the
root check, and running code inside a network namespace (``in_namespace``). Every other module of
``vz_core.network`` builds on these; this one imports none of them."""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from vz_core.errors import RuntimeFailureError, UnavailableError

__all__ = ["CLONE_NEWNET", "NETNS_DIR", "NetworkTools", "in_namespace", "require_root", "run"]

T = TypeVar("T")
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
_SEARCH = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


@dataclass(frozen=True)
class NetworkTools:
    """Paths of the host tools the realization runs."""

    ip: str
    nft: str
    nsenter: str
    sysctl: str

    @classmethod
    def find(cls) -> NetworkTools:
        """The tools from PATH (then the sbin directories); UnavailableError naming the package of each missing."""
        path = os.pathsep.join([os.environ.get("PATH", ""), *_SEARCH])
        found = {name: shutil.which(name, path=path) for name in ("ip", "nft", "nsenter", "sysctl")}
        packages = {"ip": "iproute2", "nft": "nftables", "nsenter": "util-linux", "sysctl": "procps"}
        missing = [f"{name} (apt-get install {packages[name]})" for name, where in found.items() if not where]
        if missing:
            raise UnavailableError(f"route domains need {', '.join(missing)}")
        return cls(**{name: str(where) for name, where in found.items()})


async def run(argv: Sequence[str], stdin: bytes = b"", what: str = "") -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin)
    if proc.returncode != 0:
        raise RuntimeFailureError(
            f"route domain: {what or argv[0]} failed", runtime_message=err.decode(errors="replace").strip()
        )
    return out.decode(errors="replace")


def require_root() -> None:
    if os.geteuid() != 0:
        raise UnavailableError("route domains need root (network namespaces, veth pairs, nftables)")


_libc = ctypes.CDLL(None, use_errno=True)


def in_namespace(path: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a fresh thread joined to the network namespace at ``path`` (sockets it makes keep it)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {path}: {os.strerror(err)}")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="vz-netns")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value
