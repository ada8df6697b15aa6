"""The vfkit driver's options: parsed and checked once, before anything else happens."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vz_core.errors import InvalidArgumentError
from vz_core.paths import state_dir as default_state_root

__all__ = ["DRIVER_NAME", "VfkitOptions", "parse_options"]

DRIVER_NAME = "vfkit"


@dataclass(frozen=True)
class VfkitOptions:
    state_root: Path
    image_dir: Path | None
    vfkit: str
    vfkit_sha256: str
    guest: str
    guest_sha256: str
    rosetta: str
    nested: bool
    stop_timeout: float
    boot_timeout: float
    insecure_registries: tuple[str, ...] = ()


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidArgumentError(
            f"{name}={value!r} is unknown; use one of {', '.join(allowed)}", details={"option": name}
        )
    return value


def _seconds(name: str, value: float | str, *, positive: bool) -> float:
    try:
        number = float(value)
    except ValueError:
        raise InvalidArgumentError(f"{name}={value!r} is not a number of seconds", details={"option": name}) from None
    if number < 0 or (positive and number == 0):
        raise InvalidArgumentError(f"{name} must be {'> 0' if positive else '>= 0'}", details={"option": name})
    return number


def _abs(name: str, value: str) -> str:
    if value and not os.path.isabs(value):
        raise InvalidArgumentError(f"{name}={value!r} must be an absolute path", details={"option": name})
    return value


def _guest(value: str) -> str:
    if value and not value.startswith("https://") and not os.path.isabs(value):
        raise InvalidArgumentError(
            f"guest={value!r} must be an absolute path of a guest bundle (its directory or manifest.json) or an "
            "https:// URL of its manifest.json",
            details={"option": "guest"},
        )
    return value


def _sha256(name: str, value: str) -> str:
    if value and (len(value) != 64 or any(c not in "0123456789abcdef" for c in value)):
        raise InvalidArgumentError(
            f"{name}={value!r} is not a SHA-256 (64 lowercase hex digits)", details={"option": name}
        )
    return value


def parse_options(
    *,
    state_dir: str | os.PathLike[str] | None = None,
    image_dir: str | os.PathLike[str] | None = None,
    vfkit: str = "",
    vfkit_sha256: str = "",
    guest: str = "",
    guest_sha256: str = "",
    rosetta: str = "auto",
    nested: str | bool = "off",
    stop_timeout: float | str = 30.0,
    boot_timeout: float | str = 120.0,
    insecure_registries: str | tuple[str, ...] | list[str] = (),
    **unknown: Any,
) -> VfkitOptions:
    """Every option checked; ``InvalidArgumentError`` naming the culprit (unknown keys included)."""
    if unknown:
        from vz_drivers.vfkit.registration import DECLARATION

        raise InvalidArgumentError(DECLARATION.unknown_keys_message(unknown))
    nested_text = ("on" if nested else "off") if isinstance(nested, bool) else nested
    root = Path(state_dir) if state_dir else default_state_root() / "drivers" / DRIVER_NAME
    return VfkitOptions(
        state_root=root.absolute(),
        image_dir=Path(image_dir).absolute() if image_dir else None,
        vfkit=_abs("vfkit", vfkit),
        vfkit_sha256=vfkit_sha256,
        guest=_guest(guest),
        guest_sha256=_sha256("guest_sha256", guest_sha256),
        rosetta=_choice("rosetta", rosetta, ("auto", "on", "off")),
        nested=_choice("nested", nested_text, ("on", "off")) == "on",
        stop_timeout=_seconds("stop_timeout", stop_timeout, positive=False),
        boot_timeout=_seconds("boot_timeout", boot_timeout, positive=True),
        insecure_registries=tuple(
            r
            for r in (insecure_registries.split(",") if isinstance(insecure_registries, str) else insecure_registries)
            if r
        ),
    )
