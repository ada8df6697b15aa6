"""Validation rules vz and its built-in drivers share (one definition each; no third-party imports).

* ``RESERVED_TARGETS``: Machine paths no workspace, mount or volume may cover (they belong to the Machine
  runtime: vz's own directory and the kernel's filesystems).
* The pieces of the image reference grammar (docs/images.md): tag, repository path component, registry host,
  digest, and Docker's rule for when a reference's first component names a registry host.
* The resource limits every Machine gets by default, and the bounds of ``resources.pids``
  (docs/security.md, "Resource limits"): computed from this host's kernel settings at run time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

__all__ = [
    "DEFAULT_PIDS",
    "DIGEST_RE",
    "DRIVER_NAME_PATTERN",
    "EMBEDDED_IMAGES",
    "HOST_RE",
    "MAX_PIDS",
    "MIN_PIDS",
    "PATH_COMPONENT_RE",
    "RESERVED_TARGETS",
    "TAG_RE",
    "default_memory_bytes",
    "default_pids",
    "host_task_limit",
    "is_driver_name",
    "max_pids",
    "names_registry_host",
    "reserved_target",
]

RESERVED_TARGETS: Final = ("/.vz", "/proc", "/sys", "/dev")
"""Machine paths no workspace, mount or volume may cover (they belong to the Machine runtime)."""

EMBEDDED_IMAGES: Final = ("default",)
"""The names of the images built into vz (``vz:NAME``, docs/images.md): every other ``vz:`` name is a mistake
that the built-in drivers' image store refuses, and `vz up` refuses it before anything is compared or changed."""
TAG_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
"""An image tag (use ``fullmatch``)."""
PATH_COMPONENT_RE: Final = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
"""One component of a repository path (use ``fullmatch``)."""
HOST_RE: Final = re.compile(
    r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*)"
    r"(?::[0-9]{1,5})?"
)
"""A registry ``host[:port]``, IPv6 in brackets (use ``fullmatch``)."""
DIGEST_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")
"""A content digest (use ``fullmatch``)."""


def names_registry_host(first: str) -> bool:
    """Docker's rule: the first component of a reference is a registry host when it contains ``.`` or ``:``, is
    ``localhost`` or is a bracketed IPv6 address; otherwise the whole name is a repository."""
    return "." in first or ":" in first or first == "localhost" or first.startswith("[")


def reserved_target(norm: str) -> str | None:
    """The entry of ``RESERVED_TARGETS`` a normalized absolute Machine path is or lies under, else None."""
    for reserved in RESERVED_TARGETS:
        if norm == reserved or norm.startswith(reserved + "/"):
            return reserved
    return None


MIN_PIDS: Final = 32
"""The fewest tasks ``resources.pids`` may allow: the guest agent, a command and its shell need a few."""
MAX_PIDS: Final = 4_194_304
"""Linux's ``PID_MAX_LIMIT``: no host has more PIDs than this (the schema's upper bound)."""
DEFAULT_PIDS: Final = 4096
"""A Machine's pids limit when it declares none, unless an eighth of the host's task limit is smaller."""


def host_task_limit(proc: Path = Path("/proc/sys/kernel")) -> int | None:
    """How many tasks (processes and threads) this host can have at once: the smaller of ``kernel.pid_max`` and
    ``kernel.threads-max``; None where neither can be read (not Linux)."""
    values = []
    for name in ("pid_max", "threads-max"):
        try:
            values.append(int((proc / name).read_text().strip()))
        except (OSError, ValueError):
            continue
    return min(values) if values else None


def default_pids(host_limit: int | None) -> int:
    """A Machine's default pids limit: ``DEFAULT_PIDS``, or an eighth of the host's task limit when that is
    smaller (at least ``MIN_PIDS``), so that a fork bomb in one Machine leaves the host seven eighths."""
    if host_limit is None:
        return DEFAULT_PIDS
    return max(MIN_PIDS, min(DEFAULT_PIDS, host_limit // 8))


def max_pids(host_limit: int | None) -> int:
    """The most ``resources.pids`` may ask for on this host: half its task limit (``MAX_PIDS`` when unknown)."""
    if host_limit is None:
        return MAX_PIDS
    return max(MIN_PIDS, host_limit // 2)


def default_memory_bytes(host_memory: int) -> int:
    """A Machine's default memory limit (swap included) when it declares none: half of the host's memory, in
    whole MiB. It is a ceiling, not a reservation: what a Machine does not use stays the host's."""
    mib = 1024 * 1024
    return max(mib, (host_memory // 2) // mib * mib)


DRIVER_NAME_PATTERN = "^[a-z][a-z0-9_-]{0,62}$"
"""The one grammar of driver names (built-in, external, and a Machine's ``driver`` in vz.json), in JSON Schema
(ECMA-262) syntax, where ``$`` matches only at the very end. Python code uses ``check_driver_name``."""
_DRIVER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")


def is_driver_name(name: object) -> bool:
    """Whether ``name`` follows the driver-name grammar (``DRIVER_NAME_PATTERN``)."""
    return isinstance(name, str) and _DRIVER_NAME.fullmatch(name) is not None
