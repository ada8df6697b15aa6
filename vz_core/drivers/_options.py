"""Driver options: the project's (a Machine's ``driver_options`` in vz.json, project-scoped keys only) and the
host's (``<state dir>/config/drivers.json``, ``HostConfig``), validated against the declaration and merged;
``driver_key`` names one (driver, options) pair wherever drivers are pooled."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vz_core.drivers._launch import resolve
from vz_core.drivers._manifests import ManifestStore
from vz_core.errors import UserError
from vz_core.paths import state_dir
from vz_core.registry import DriverDeclaration, DriverRegistry, check_driver_name

__all__ = [
    "HOST_CONFIG_FILE",
    "HostConfig",
    "OptionValue",
    "builtin_or_refuse",
    "check_value",
    "driver_key",
    "effective_options",
    "host_config_path",
    "validate_project_options",
]

HOST_CONFIG_FILE = "drivers.json"


_MAX_HOST_CONFIG = 1 << 20


def host_config_path() -> Path:
    """The user's host configuration of drivers: ``<state dir>/config/drivers.json`` (``VZ_HOME`` moves it)."""
    return state_dir() / "config" / HOST_CONFIG_FILE


OptionValue = str | int | float | bool | list[str]


def check_value(value: Any, where: str) -> OptionValue:
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return list(value)
    raise UserError(f"{where}: must be a string, number, boolean or list of strings, not {type(value).__name__}")


class HostConfig:
    """The host configuration of drivers: driver name -> {option: value}, in one JSON file owned by the user.

    It may set any declared option of a built-in driver (host- and project-scoped ones); it is the only place
    host-scoped options come from. Written atomically; never read from a project directory.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else host_config_path()

    def load(self) -> dict[str, dict[str, OptionValue]]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise UserError(f"cannot read the driver host configuration {self.path}: {exc.strerror}") from None
        try:
            if len(data) > _MAX_HOST_CONFIG:
                raise ValueError(f"it is larger than {_MAX_HOST_CONFIG} bytes")
            raw = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise UserError(
                f"the driver host configuration {self.path} is not valid JSON ({exc}); fix or remove it"
            ) from None
        if not isinstance(raw, dict):
            raise UserError(f"the driver host configuration {self.path} must be a JSON object of driver names")
        config: dict[str, dict[str, OptionValue]] = {}
        for name, options in raw.items():
            where = f"{self.path}: {name!r}"
            check_driver_name(name, where=f"{self.path}")
            if not isinstance(options, dict):
                raise UserError(f"{where} must map option names to values")
            config[name] = {str(k): check_value(v, f"{where}.{k}") for k, v in options.items()}
        return config

    def options_for(self, name: str) -> dict[str, OptionValue]:
        return dict(self.load().get(name, {}))

    def save(self, config: dict[str, dict[str, OptionValue]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        kept = {name: options for name, options in sorted(config.items()) if options}
        tmp.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)


def builtin_or_refuse(
    name: str, registry: DriverRegistry, store: ManifestStore | None, where: str
) -> DriverDeclaration:
    resolved = resolve(name, registry=registry, store=store)
    if resolved.builtin is None:
        raise UserError(
            f"{where}: driver {name!r} is external; vz passes it no options (use the driver's own configuration)"
        )
    return resolved.builtin


def validate_project_options(
    name: str,
    options: Mapping[str, Any] | None,
    *,
    where: str = "driver_options",
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    recorded: bool = False,
) -> dict[str, Any]:
    """Check a Machine's ``driver_options`` from a project file (vz.json) before anything is mutated.

    Returns the options (a copy). Raises ``UserError`` naming ``where`` and the key: for a name that is not a
    driver name, options for an external driver, an unknown key (listing the valid ones), a key whose scope
    is ``"host"`` (saying where to set it instead), or a value the option's declaration refuses (its type and
    bounds: ``$.machines[0].driver_options.stop_timeout: must be a number of seconds in (0, 3600], got -1``).
    ``NotFoundError`` for an unknown driver. The plugin checks the same values again with the same code.

    ``recorded=True`` is for the options vz stored with an existing Machine (stop, delete, status): host-scoped
    keys an earlier vz accepted from a vz.json are then allowed, and a value today's declaration refuses is
    left out (its default applies), so that Machine stays reachable where it is; unknown keys are refused the
    same way. ``vz up`` never passes it.
    """
    check_driver_name(name, where=where.rpartition(".")[0] + ".driver" if "." in where else "driver")
    options = dict(options or {})
    registry = registry if registry is not None else DriverRegistry()
    if not options:
        resolve(name, registry=registry, store=store)
        return options
    declaration = builtin_or_refuse(name, registry, store, where)
    declaration.check_option_keys(options, where=where)
    for key in sorted(options):
        option = declaration.declared_options.get(key)
        if option is not None and option.scope == "host" and not recorded:
            raise UserError(
                f"{where}.{key}: {name}'s option {key!r} ({option.help}) belongs to the host configuration, not to "
                f"a project file: set it with `vz driver configure {name} {key}=VALUE` (stored in "
                f"{host_config_path()}) and remove it from vz.json"
            )
    if recorded:
        return {key: value for key, value in options.items() if _accepted(declaration, key, value)}
    declaration.check_options(
        options, where=where, fix="correct it in vz.json, or remove it to use the default ({default})"
    )
    return options


def _accepted(declaration: DriverDeclaration, key: str, value: Any) -> bool:
    try:
        declaration.declared_options[key].parse(value)
    except ValueError:
        return False
    return True


def effective_options(
    name: str,
    project_options: Mapping[str, Any] | None = None,
    *,
    where: str = "driver_options",
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    host_config: HostConfig | None = None,
    recorded: bool = False,
) -> dict[str, Any]:
    """The options driver ``name`` is built with: its host configuration, then the project's (validated by
    ``validate_project_options``; a project value wins for a project-scoped option, a recorded one for any)."""
    registry = registry if registry is not None else DriverRegistry()
    project = validate_project_options(
        name, project_options, where=where, registry=registry, store=store, recorded=recorded
    )
    resolved = resolve(name, registry=registry, store=store)
    if resolved.builtin is None:
        return {}
    host = (host_config if host_config is not None else HostConfig()).options_for(name)
    resolved.builtin.check_options(
        host,
        where=f"{host_config_path()}: {name}",
        fix=f"change it with `vz driver configure {name} {{key}}=VALUE`, or remove it with "
        f"`vz driver configure {name} --unset {{key}}` (default: {{default}})",
    )
    return {**host, **project}


def driver_key(name: str, options: Mapping[str, Any] | None) -> tuple[str, str]:
    """The one key of driver ``name`` built with ``options``: equal options (in any order) give equal keys. The
    command's ``DriverPool`` keys it by a Machine's options, the daemon's session pool by the effective ones."""
    return name, json.dumps(dict(options or {}), sort_keys=True, default=str)
