"""Whether a Machine can have its own Docker engine: the drivers' declaration and what `vz up` makes of it.

A driver declares in its Extensions facts, under ``FACT_KEY``, whether it runs a Docker engine inside its
Developer Linux Machines: ``"yes"``, or ``"no: <reason>"``. A driver that says nothing runs none. A Machine asks
with its ``docker`` field in vz.json (docs/user-guide.md, "Docker in a Machine"):

* ``"auto"`` (the default): an engine where the profile, driver and image allow one; `vz up` says why not when
  the image carries an engine the Machine cannot run;
* ``"required"``: `vz up` refuses the Machine, before anything changes, when it cannot have one;
* ``"off"``: no engine.

Hardened Machines and Machines that are not Linux never have an engine.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "ENGINE_IMAGES",
    "FACT_KEY",
    "NO_ENGINE_IMAGES",
    "declare",
    "driver_refusal",
    "engine_status",
    "image_refusal",
    "machine_refusal",
]

FACT_KEY = "docker_engine"
ENGINE_IMAGES = frozenset({"vz:developer"})
"""Built-in images known to carry an engine (``vz_drivers._images._developer``)."""
NO_ENGINE_IMAGES = frozenset({"vz:default"})
"""Built-in images known to carry none."""


def declare(reason: str = "") -> str:
    """The fact's value: ``"yes"`` when ``reason`` is empty, else ``"no: <reason>"``."""
    return f"no: {reason}" if reason else "yes"


def driver_refusal(driver: str, facts: Mapping[str, str]) -> str | None:
    """Why ``driver`` runs no engine (None when it declares it does)."""
    value = facts.get(FACT_KEY, "")
    if value == "yes":
        return None
    if value.startswith("no:") and value[3:].strip():
        return f"driver {driver!r} runs no Docker engine: {value[3:].strip()}"
    return f"driver {driver!r} does not declare a Docker engine (Extensions fact {FACT_KEY!r})"


def machine_refusal(profile: str, target_os: str) -> str | None:
    """Why a Machine of this profile and OS has no engine whatever its driver (None when it may have one)."""
    if profile == "hardened":
        return "hardened Machines have no Docker engine; use profile 'developer' for a Machine that runs Docker"
    if target_os != "linux":
        return f"{target_os} Machines have no Docker engine; Docker belongs to Developer Linux Machines"
    return None


def image_refusal(image: str) -> str | None:
    """Why the image ``image`` has no engine, when vz knows without unpacking it (built-in images)."""
    if image in NO_ENGINE_IMAGES:
        return (
            f"the image {image} has no Docker engine (no dockerd); use vz:developer, or an image with Debian's "
            "docker.io, containerd, runc and iptables (docs/images.md)"
        )
    return None


def engine_status(
    setting: str, profile: str, target_os: str, image: str, driver: str, facts: Mapping[str, str] | None
) -> dict[str, str | None]:
    """The ``docker`` row of a Machine in `vz status --json`: ``setting`` (from vz.json), ``state``, ``reason``,
    ``socket`` and ``context``.

    ``state`` is ``off`` (the Machine asked for none), ``none`` (it cannot have one: ``reason`` says why),
    ``unknown`` (the driver could not be asked: ``facts`` is None) or ``unmanaged`` (the driver declares an
    engine, but vz relays no engine socket and creates no Docker context yet, so ``socket`` and ``context`` are
    None).
    """
    row: dict[str, str | None] = {"setting": setting, "state": "", "reason": None, "socket": None, "context": None}
    if setting == "off":
        row["state"] = "off"
        return row
    if facts is None:
        row["state"], row["reason"] = "unknown", f"driver {driver!r} could not be asked"
        return row
    why = machine_refusal(profile, target_os) or driver_refusal(driver, facts) or image_refusal(image)
    if why:
        row["state"], row["reason"] = "none", why
    else:
        row["state"] = "unmanaged"
        row["reason"] = f"driver {driver!r} declares an engine; vz relays no engine socket and makes no context yet"
    return row
