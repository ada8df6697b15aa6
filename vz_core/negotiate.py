"""Info negotiation: what a host checks in a driver's Info before any other call (PROTOCOL.md §2).

* ``api_major`` must be 1 (any minor is accepted);
* ``driver_name``, ``driver_version`` and ``runtime_name`` are non-empty (``runtime_version`` may be empty);
* ``capabilities`` is present;
* ``recreate_mode`` and every mount type are known values; UNSPECIFIED counts as unknown, because these steer
  host behaviour and a host never guesses;
* ``reuse_preflight`` needs minor ≥ 2; ``RECREATE_MODE_ON_RUN`` needs minor ≥ 3 **and** a request that offered
  ``supports_recreate_on_run``.

Every failure is an ``IncompatibleVersionError`` naming the driver, the field, what it holds and what is
expected; ``details`` carries ``field`` and ``value`` for machines.
"""

from __future__ import annotations

from vz_core._driver import Driver
from vz_core._types import API_MAJOR, API_MINOR, DriverInfo, MountType, RecreateMode
from vz_core.errors import IncompatibleVersionError

__all__ = ["KNOWN_MOUNT_TYPES", "KNOWN_RECREATE_MODES", "negotiate", "validate_info"]

KNOWN_RECREATE_MODES = frozenset({RecreateMode.DELETE, RecreateMode.STOP, RecreateMode.ON_RUN})
KNOWN_MOUNT_TYPES = frozenset({MountType.BIND, MountType.VOLUME, MountType.TMPFS})


def _fail(who: str, field: str, value: object, problem: str) -> IncompatibleVersionError:
    return IncompatibleVersionError(
        f"driver {who} answered an unusable Info: {problem}",
        details={"field": field, "value": str(value)},
    )


def _name(value: object) -> str:
    if isinstance(value, RecreateMode | MountType):
        return f"{value.name} ({int(value)})"
    return f"unknown value {value!r}"


def validate_info(info: DriverInfo, *, offered_recreate_on_run: bool) -> DriverInfo:
    """Return ``info`` unchanged when this host can work with it; else raise ``IncompatibleVersionError``."""
    who = repr(info.driver_name) if info.driver_name else "(unnamed)"
    if info.api_major != API_MAJOR:
        raise IncompatibleVersionError(
            f"driver {who} speaks Runtime Protocol {info.api_major}.{info.api_minor}, but this host speaks "
            f"{API_MAJOR}.x (up to {API_MAJOR}.{API_MINOR}); install a release of the driver for API "
            f"{API_MAJOR}, or a vz release that speaks API {info.api_major}",
            details={"field": "api_major", "value": str(info.api_major)},
        )
    for field in ("driver_name", "driver_version", "runtime_name"):
        if not getattr(info, field):
            raise _fail(who, field, "", f"{field} is empty (it must name the driver/runtime)")
    caps = info.capabilities
    if caps is None:
        raise _fail(who, "capabilities", None, "capabilities are missing")
    if caps.recreate_mode not in KNOWN_RECREATE_MODES:
        raise _fail(
            who,
            "capabilities.recreate_mode",
            int(caps.recreate_mode),
            f"recreate_mode is {_name(caps.recreate_mode)}; expected DELETE, STOP or ON_RUN",
        )
    for mount in caps.mount_types:
        if mount not in KNOWN_MOUNT_TYPES:
            raise _fail(
                who,
                "capabilities.mount_types",
                int(mount),
                f"mount type {_name(mount)} is not one this host knows (BIND, VOLUME, TMPFS)",
            )
    if caps.reuse_preflight and info.api_minor < 2:
        raise _fail(
            who,
            "capabilities.reuse_preflight",
            True,
            f"reuse_preflight is advertised by API {info.api_major}.{info.api_minor}; it needs 1.2 or newer",
        )
    if caps.recreate_mode == RecreateMode.ON_RUN:
        if info.api_minor < 3:
            raise _fail(
                who,
                "capabilities.recreate_mode",
                int(caps.recreate_mode),
                f"RECREATE_MODE_ON_RUN is advertised by API {info.api_major}.{info.api_minor}; it needs 1.3 or newer",
            )
        if not offered_recreate_on_run:
            raise _fail(
                who,
                "capabilities.recreate_mode",
                int(caps.recreate_mode),
                "RECREATE_MODE_ON_RUN was answered although the host did not offer supports_recreate_on_run",
            )
    return info


async def negotiate(driver: Driver, *, supports_recreate_on_run: bool = True) -> DriverInfo:
    """Ask ``driver`` for its Info (offering recreate-on-run) and validate the answer."""
    info = await driver.info(supports_recreate_on_run=supports_recreate_on_run)
    return validate_info(info, offered_recreate_on_run=supports_recreate_on_run)
