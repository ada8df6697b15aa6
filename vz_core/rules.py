"""Validation rules vz and its built-in drivers share (one definition each; no third-party imports).

* ``RESERVED_TARGETS``: Machine paths no workspace, mount or volume may cover (they belong to the Machine
  runtime: vz's own directory and the kernel's filesystems).
* The pieces of the image reference grammar (docs/images.md): tag, repository path component, registry host,
  digest, and Docker's rule for when a reference's first component names a registry host.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "DIGEST_RE",
    "HOST_RE",
    "PATH_COMPONENT_RE",
    "RESERVED_TARGETS",
    "TAG_RE",
    "names_registry_host",
    "reserved_target",
]

RESERVED_TARGETS: Final = ("/.vz", "/proc", "/sys", "/dev")
"""Machine paths no workspace, mount or volume may cover (they belong to the Machine runtime)."""

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
