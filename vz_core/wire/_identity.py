"""Who a vz daemon is: the wire protocol number, the vz version and the fingerprint both sides compare at hello.

The fingerprint is the SHA-256 over the vz version, ``sys.executable`` and the values of the environment
variables that change what a daemon does (``DAEMON_ENV``). A CLI and a daemon that agree on it behave the
same; when they differ the CLI decides (``vz_core.wire._connect``): a newer CLI replaces an idle daemon.

Imported on the CLI's hot path: standard library only, and nothing is computed at import time.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # `typing` itself costs milliseconds on the CLI's hot path
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["DAEMON_ENV", "PROTOCOL", "compare_versions", "fingerprint", "version"]

PROTOCOL = 1
"""The local wire's protocol number (``hello.protocol``); a daemon refuses any other."""

DAEMON_ENV = (
    "VZ_DAEMON_IDLE_TIMEOUT",
    "VZ_DAEMON_PLUGIN_IDLE",
    "VZ_PLUGIN_RPC_TIMEOUT",
    "VZ_PLUGIN_OPERATION_TIMEOUT",
    "VZ_PLUGIN_LOG_LEVEL",
    "VZ_AGENT_BINARY",
    "VZ_BUSYBOX",
    "VZ_DOCKER_DAEMON_CONFIG",
    "VZ_NETWORK_UPLINK_POOL",
    "VZ_NETWORK_DNS_UPSTREAMS",
    "VZ_NETWORK_DNS_MIN_TTL",
    "VZ_NETWORK_DNS_MAX_TTL",
)
"""Variables read by the daemon process itself or by the drivers it launches (which inherit its environment).

Per-command variables (``VZ_ENVIRONMENT_ID``, ``VZ_PLAIN``, ...) travel with each call's context instead;
``VZ_HOME`` and ``VZ_DAEMON_SOCKET`` choose which daemon is asked, ``VZ_DAEMON_AUTOSTART`` only the CLI reads.
"""

_version: str | None = None


def version() -> str:
    """The installed vz version, from its ``vz-<version>.dist-info`` directory on ``sys.path``.

    ``importlib.metadata`` would cost ~50 ms on the CLI's hot path; the directory name holds the same string.
    """
    global _version  # a cache of a fact about the installation, computed once per process
    if _version is None:
        _version = _find_version()
    return _version


def _find_version() -> str:
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("vz-") and name.endswith(".dist-info"):
                return name[3 : -len(".dist-info")]
    return "0+unknown"


def fingerprint(environ: Mapping[str, str] | None = None, of_version: str | None = None) -> str:
    """SHA-256 (hex) over the version (default: this installation's), the interpreter and the ``DAEMON_ENV``
    values of ``environ``."""
    try:  # the builtin module loads in well under a millisecond; hashlib pulls in OpenSSL (5-30 ms here)
        from _sha256 import sha256  # type: ignore[import-not-found, unused-ignore]
    except ImportError:  # pragma: no cover - an interpreter built without it
        from hashlib import sha256

    env = os.environ if environ is None else environ
    parts = [of_version or version(), sys.executable] + [f"{name}={env.get(name, '')}" for name in DAEMON_ENV]
    return str(sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest())


def _release(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split("+", 1)[0].split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        out.append(int(digits) if digits else 0)
        if digits != part:  # a pre-release or dev suffix ends the release segment
            break
    return tuple(out)


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as version ``a`` is older than, the same release as, or newer than ``b`` (release segment)."""
    ra, rb = _release(a), _release(b)
    width = max(len(ra), len(rb))
    ra, rb = ra + (0,) * (width - len(ra)), rb + (0,) * (width - len(rb))
    return (ra > rb) - (ra < rb)
