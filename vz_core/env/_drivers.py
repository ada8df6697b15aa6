"""Getting a Driver for a Machine, and what it said about itself.

``acquire_driver`` is the single place the Environment layer and the CLI obtain a driver. A command's
``Context.drivers`` names where drivers come from: inside the vz daemon it is the daemon's ``SessionPool`` (every
driver, built-in ones included, is then a shared, supervised, checksum-verified plugin session, and the handle
returned here does not stop it when closed). Without a source (tests, benchmarks) ``vz_core.drivers.open_driver``
builds built-in drivers in-process and serves external ones out-of-process.

``DriverPool`` negotiates each driver once per command (Info with the 1.3 recreate opt-in, Extensions,
Preflight) and closes them all at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vz_core._driver import Driver
from vz_core._types import DriverInfo, Extensions, RecreateMode
from vz_core.drivers import DriverSource, driver_key
from vz_core.errors import NotFoundError, UnsupportedError
from vz_core.redact import Redactor

__all__ = ["DriverFacts", "DriverPool", "acquire_driver", "installed_driver_names"]


def installed_driver_names() -> list[str]:
    """Names of every driver a Machine may use."""
    from vz_core.registry import DriverRegistry

    return DriverRegistry().names()


def acquire_driver(
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    where: str = "driver_options",
    recorded: bool = False,
    redactor: Redactor | None = None,
    source: DriverSource | None = None,
) -> Driver:
    """A ready-to-use Driver named ``name`` for a Machine whose vz.json gave ``options`` (its ``driver_options``).

    ``vz_core.drivers.open_driver`` does the work: project options are validated (unknown and host-scoped keys
    refused naming ``where``), merged over the user's host configuration (``vz driver configure``); built-in
    drivers run in-process, external ones (``vz driver add``) out-of-process with their binary verified at each
    launch. When a driver ``source`` is given (a command's ``Context.drivers``: the daemon's ``SessionPool``) it
    answers instead, with the same validation: a handle on the shared plugin session for ``(name, effective
    options)``.
    ``recorded=True`` for options read from an existing Machine's record (an earlier vz may have accepted
    host-scoped keys there; they stay, so the Machine is found where it is). ``redactor`` masks what a plugin
    writes to stderr and its error texts. Raises ``NotFoundError`` for an unknown name (listing what is
    installed) and ``UserError`` for a bad name or options. The caller closes the driver (``await
    driver.close()``).
    """
    if source is not None:
        return source.driver(name, dict(options or {}), where=where, recorded=recorded, redactor=redactor)
    from vz_core import drivers

    return drivers.open_driver(name, dict(options or {}), where=where, recorded=recorded, redactor=redactor)


@dataclass(frozen=True)
class DriverFacts:
    """What a driver said about itself during negotiation."""

    name: str
    info: DriverInfo
    extensions: Extensions | None

    @property
    def target_os(self) -> tuple[str, ...]:
        # A driver without the extension service is a plain Runtime Protocol driver: Linux Machines.
        return self.extensions.target_os if self.extensions else ("linux",)

    @property
    def profiles(self) -> tuple[str, ...]:
        return self.extensions.profiles if self.extensions else ()

    @property
    def recreate_mode(self) -> RecreateMode:
        caps = self.info.capabilities
        return caps.recreate_mode if caps else RecreateMode.DELETE

    def describe(self) -> dict[str, Any]:
        """The stable JSON shape used by ``vz status --json`` (see docs/cli.md)."""
        info = self.info
        caps = info.capabilities
        ext = self.extensions
        return {
            "name": self.name,
            "driver_name": info.driver_name,
            "version": info.driver_version,
            "api": f"{info.api_major}.{info.api_minor}",
            "runtime": {"name": info.runtime_name, "version": info.runtime_version},
            "capabilities": {
                "mount_types": [m.label if hasattr(m, "label") else str(m) for m in caps.mount_types] if caps else [],
                "requires_mount_streaming": bool(caps and caps.requires_mount_streaming),
                "requires_workspace_chown": bool(caps and caps.requires_workspace_chown),
                "recreate_mode": self.recreate_mode.name.lower(),
                "provisioning_preflight": bool(caps and caps.provisioning_preflight),
                "reprovision": bool(caps and caps.reprovision),
                "logs": bool(caps and caps.logs),
                "reuse_preflight": bool(caps and caps.reuse_preflight),
            },
            "extensions": None
            if ext is None
            else {
                "version": ext.extensions_version,
                "target_os": list(ext.target_os),
                "profiles": list(ext.profiles),
                # Exec with tty=true works: the driver serves terminal sessions (ext.tty alone is the Runtime
                # Protocol's own Exec tty, which vz drivers never accept).
                "tty": ext.tty or ext.terminal,
                "snapshots": ext.snapshots,
                "egress_policies": [p.name.lower() for p in ext.egress_policies],
                "resource_limits": ext.resource_limits,
                "storage_limits": ext.storage_limits,
                "pids_limits": ext.pids_limits,
                "facts": dict(ext.facts),
            },
            "accelerator": {
                "name": ext.accelerator if ext else "",
                "reason": ext.accelerator_reason if ext else "",
            },
        }


class DriverPool:
    """The drivers one command uses, each acquired (from ``source`` when given) and negotiated once per
    ``driver_key``, all closed by ``aclose``."""

    def __init__(self, redactor: Redactor | None = None, source: DriverSource | None = None) -> None:
        self._redactor = redactor
        self._source = source
        self._drivers: dict[tuple[str, str], tuple[Driver, DriverFacts]] = {}
        self._preflighted: set[tuple[str, str]] = set()

    async def get(
        self, name: str, options: Mapping[str, Any] | None = None, *, recorded: bool = False
    ) -> tuple[Driver, DriverFacts]:
        """The driver and its negotiated facts (Info, then Extensions); ``recorded`` as for ``acquire_driver``."""
        options = options or {}
        key = driver_key(name, options)
        if key not in self._drivers:
            driver = acquire_driver(name, options, recorded=recorded, redactor=self._redactor, source=self._source)
            try:
                facts = await _negotiate(name, driver)
            except BaseException:
                await driver.close()
                raise
            self._drivers[key] = (driver, facts)
        return self._drivers[key]

    async def preflight(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        """Preflight once per driver and command."""
        driver, _ = await self.get(name, options)
        key = driver_key(name, options)
        if key not in self._preflighted:
            await driver.preflight()
            self._preflighted.add(key)

    async def aclose(self) -> None:
        drivers, self._drivers = self._drivers, {}
        for driver, _ in drivers.values():
            try:
                await driver.close()
            except Exception:  # closing is best effort; the command's own outcome matters more
                pass


async def _negotiate(name: str, driver: Driver) -> DriverFacts:
    info = await driver.info(supports_recreate_on_run=True)
    _validate_info(name, info)
    try:
        extensions = await driver.extensions()
    except (UnsupportedError, NotFoundError):
        extensions = None
    return DriverFacts(name=name, info=info, extensions=extensions)


def _validate_info(name: str, info: DriverInfo) -> None:
    """The host's Info checks (PROTOCOL.md §2), before any other call."""
    from vz_core.negotiate import validate_info

    validate_info(info, offered_recreate_on_run=True)
