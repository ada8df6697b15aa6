"""Driver resolution and the library behind ``vz driver list | add <manifest> | verify [NAME]``.

A name resolves to exactly one driver:

* **built-in** (``vz.drivers`` entry points, ``vz_core.registry``): Python code of this vz installation. Its
  plugin runs as ``<this interpreter> -m vz_plugins MODULE:FACTORY`` (options in ``VZ_DRIVER_OPTIONS``), i.e.
  the same code the host would import in-process, launched through the same door (supervisor, handshake,
  AutoMTLS) as any external driver. It is not checksummed: a checksum would be taken from the very
  installation it is meant to protect, so it would prove nothing the host does not already trust by running.
  ``builtin_manifest()`` writes a manifest for a built-in's console script (with its SHA-256 now) for use by
  other hosts or to run a built-in through the external path.
* **external**: added from a manifest (``vz_core.trust``) with ``add_manifest``; the validated manifest is
  recorded under ``<state dir>/driver-manifests/<name>.json`` together with its directory (where relative
  binary paths live). Its binary is verified before **every** launch.

The functions return plain data (dicts of str/bool/list) for the CLI and ``--json``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vz_core.errors import NotFoundError, TrustError, UserError
from vz_core.paths import state_dir
from vz_core.redact import Redactor
from vz_core.registry import BuiltinDriver, DriverRegistry
from vz_core.remote import Mode, RemoteDriver
from vz_core.transport._launcher import LaunchSpec, PluginLauncher
from vz_core.trust import Manifest, host_platform, load_manifest, parse_manifest, sha256_of, verify_binary

__all__ = [
    "ManifestStore",
    "ResolvedDriver",
    "add_manifest",
    "builtin_manifest",
    "launcher_for",
    "list_drivers",
    "remote_driver",
    "resolve",
    "verify",
]

OPTIONS_ENV = "VZ_DRIVER_OPTIONS"


@dataclass(frozen=True)
class ExternalRecord:
    """An added external driver: its validated manifest and the directory its relative paths start from."""

    manifest: Manifest
    driver_dir: Path
    manifest_path: str
    added_at: str


class ManifestStore:
    """Recorded external drivers, one JSON file each under ``<root>`` (default ``<state dir>/driver-manifests``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else state_dir() / "driver-manifests"

    def _path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.json"))

    def get(self, name: str) -> ExternalRecord | None:
        path = self._path(name)
        try:
            raw = json.loads(path.read_text())
            manifest, driver_dir = raw["manifest"], Path(raw["driver_dir"])
            manifest_path, added_at = str(raw["manifest_path"]), str(raw["added_at"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TrustError(f"the record of driver {name!r} ({path}) is unreadable ({exc!r}); add it again") from None
        return ExternalRecord(
            manifest=parse_manifest(manifest, source=f"recorded manifest of {name!r}"),
            driver_dir=driver_dir,
            manifest_path=manifest_path,
            added_at=added_at,
        )

    def put(self, record: ExternalRecord) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {
            "manifest": record.manifest.model_dump(mode="json", exclude_none=True),
            "driver_dir": str(record.driver_dir),
            "manifest_path": record.manifest_path,
            "added_at": record.added_at,
        }
        path = self._path(record.manifest.name)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)


@dataclass(frozen=True)
class ResolvedDriver:
    """What a name stands for: exactly one of ``builtin`` or ``external``."""

    name: str
    builtin: BuiltinDriver | None = None
    external: ExternalRecord | None = None

    def launch_spec(self, options: dict[str, Any] | None = None) -> Callable[[], LaunchSpec]:
        """A ``prepare`` callable for ``PluginLauncher``: external binaries are verified on every call."""
        if self.builtin is not None:
            builtin = self.builtin
            env = {OPTIONS_ENV: json.dumps(options)} if options else {}

            def prepare_builtin() -> LaunchSpec:
                return LaunchSpec(self.name, [sys.executable, "-m", "vz_plugins", builtin.factory], env=env)

            return prepare_builtin
        record = self.external
        assert record is not None
        if options:
            raise UserError(f"driver {self.name!r} is external: pass its options through its own configuration")

        def prepare_external() -> LaunchSpec:
            manifest = record.manifest
            path = manifest.binary_path(record.driver_dir)
            entry = manifest.entry_for()
            home = manifest.binary_home(record.driver_dir)
            binary = verify_binary(path, entry.sha256, driver_dir=home, name=self.name)
            return LaunchSpec(
                self.name,
                [str(path), *manifest.args],
                binary=binary,
                plaintext=manifest.plaintext,
                cwd=str(record.driver_dir),
            )

        return prepare_external


def resolve(name: str, *, registry: DriverRegistry | None = None, store: ManifestStore | None = None) -> ResolvedDriver:
    """The one driver ``name`` stands for; an unknown name lists what is installed."""
    registry = registry if registry is not None else DriverRegistry()
    store = store if store is not None else ManifestStore()
    if name in registry.names():
        return ResolvedDriver(name, builtin=registry.get(name))
    record = store.get(name)
    if record is not None:
        return ResolvedDriver(name, external=record)
    builtins = ", ".join(registry.names()) or "none"
    externals = ", ".join(store.names()) or "none"
    raise NotFoundError(
        f"unknown driver {name!r}; built-in: {builtins}; external: {externals} "
        "(add an external driver with `vz driver add <manifest>`)"
    )


def launcher_for(
    name: str,
    *,
    options: dict[str, Any] | None = None,
    handshake_timeout: float = 15.0,
    supervised: bool = True,
    redactor: Redactor | None = None,
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
) -> PluginLauncher:
    """A launcher for driver ``name`` (resolved now; external binaries verified at each launch)."""
    resolved = resolve(name, registry=registry, store=store)
    return PluginLauncher(
        resolved.launch_spec(options),
        name=name,
        handshake_timeout=handshake_timeout,
        supervised=supervised,
        redactor=redactor,
    )


def remote_driver(
    name: str,
    *,
    options: dict[str, Any] | None = None,
    mode: Mode = "warm",
    idle_timeout: float | None = 300.0,
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
) -> RemoteDriver:
    """Driver ``name`` as an out-of-process ``RemoteDriver`` (nothing is launched until the first call)."""
    launcher = launcher_for(name, options=options, registry=registry, store=store)
    return RemoteDriver(launcher, mode=mode, idle_timeout=idle_timeout, name=name)


def _external_row(name: str, record: ExternalRecord) -> dict[str, Any]:
    m = record.manifest
    plat = host_platform()
    row: dict[str, Any] = {
        "name": name,
        "origin": "external",
        "version": m.version,
        "api_version": m.api_version,
        "platforms": sorted(m.binaries),
        "plaintext": m.plaintext,
        "manifest": record.manifest_path,
        "added_at": record.added_at,
    }
    if plat in m.binaries:
        row["binary"] = str(m.binary_path(record.driver_dir))
        row["sha256"] = m.binaries[plat].sha256
    return row


def list_drivers(*, registry: DriverRegistry | None = None, store: ManifestStore | None = None) -> list[dict[str, Any]]:
    """Every driver by name: built-in ones first, then external ones."""
    registry = registry if registry is not None else DriverRegistry()
    store = store if store is not None else ManifestStore()
    rows: list[dict[str, Any]] = []
    for name in registry.names():
        spec = registry.get(name)
        rows.append(
            {
                "name": name,
                "origin": "builtin",
                "summary": spec.summary,
                "targets": list(spec.targets),
                "plugin_command": list(spec.plugin_command),
            }
        )
    for name in store.names():
        record = store.get(name)
        if record is not None:
            rows.append(_external_row(name, record))
    return rows


def add_manifest(
    path: str | os.PathLike[str], *, registry: DriverRegistry | None = None, store: ManifestStore | None = None
) -> dict[str, Any]:
    """Validate a manifest, verify this host's binary now, and record it (replacing an older record).

    ``TrustError`` (nothing recorded) for an invalid manifest, a missing or malformed checksum, no binary for
    this host, or a binary that fails verification; ``UserError`` when the name is a built-in driver's.
    """
    registry = registry if registry is not None else DriverRegistry()
    store = store if store is not None else ManifestStore()
    manifest_path = Path(path).absolute()
    manifest = load_manifest(manifest_path)
    if manifest.name in registry.names():
        raise UserError(f"driver name {manifest.name!r} belongs to a built-in driver; give the manifest another name")
    driver_dir = manifest_path.parent
    binary = manifest.binary_path(driver_dir)
    entry = manifest.entry_for()
    actual = sha256_of(binary, driver_dir=manifest.binary_home(driver_dir))
    if actual != entry.sha256:
        raise TrustError(
            f"driver {manifest.name!r}: SHA-256 mismatch for {binary}: the manifest says {entry.sha256}, "
            f"the file has {actual}; nothing was recorded"
        )
    previous = store.get(manifest.name)
    record = ExternalRecord(
        manifest=manifest,
        driver_dir=driver_dir,
        manifest_path=str(manifest_path),
        added_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    store.put(record)
    row = _external_row(manifest.name, record)
    row["status"] = "updated" if previous is not None else "added"
    return row


def _verify_one(name: str, registry: DriverRegistry, store: ManifestStore) -> dict[str, Any]:
    resolved = resolve(name, registry=registry, store=store)
    if resolved.builtin is not None:
        return {
            "name": name,
            "origin": "builtin",
            "ok": True,
            "detail": "part of this vz installation (runs with this interpreter); not checksummed",
        }
    record = resolved.external
    assert record is not None
    result: dict[str, Any] = {"name": name, "origin": "external"}
    try:
        entry = record.manifest.entry_for()
        binary = record.manifest.binary_path(record.driver_dir)
        result.update(binary=str(binary), expected=entry.sha256)
        actual = sha256_of(binary, driver_dir=record.manifest.binary_home(record.driver_dir))
        result["actual"] = actual
    except TrustError as exc:
        result.update(ok=False, detail=str(exc))
        return result
    if actual != entry.sha256:
        result.update(ok=False, detail=f"SHA-256 mismatch: the manifest says {entry.sha256}, the file has {actual}")
    else:
        result.update(ok=True, detail="checksum matches")
    return result


def verify(
    name: str | None = None, *, registry: DriverRegistry | None = None, store: ManifestStore | None = None
) -> list[dict[str, Any]]:
    """Re-check driver ``name`` (or every driver): one result row each with ``ok`` and ``detail``.

    Nothing is cached, downloaded, run or deleted. An unknown name raises ``NotFoundError``.
    """
    registry = registry if registry is not None else DriverRegistry()
    store = store if store is not None else ManifestStore()
    names = [name] if name is not None else [*registry.names(), *store.names()]
    return [_verify_one(n, registry, store) for n in names]


def builtin_manifest(
    name: str, destination: str | os.PathLike[str], *, registry: DriverRegistry | None = None
) -> dict[str, Any]:
    """Write a manifest for built-in ``name``'s installed console script, with the script's SHA-256 now.

    The manifest pins this installation's script (whose ``#!`` line names this interpreter); it is meant for
    other Runtime Protocol hosts, or to run a built-in through the external, checksummed path. ``path`` is
    absolute, so the manifest file may live anywhere. Returns the manifest as a dict.
    """
    registry = registry if registry is not None else DriverRegistry()
    spec = registry.get(name)
    if not spec.plugin_command:
        raise UserError(f"built-in driver {name!r} declares no plugin command")
    script = Path(sysconfig.get_path("scripts")) / spec.plugin_command[0]
    if not script.is_file():
        raise UserError(f"the console script {script} of built-in driver {name!r} is not installed")
    script = script.absolute()
    manifest = {
        "manifest_version": 1,
        "name": name,
        "version": _vz_version(),
        "api_version": "1.3",
        "binaries": {host_platform(): {"path": str(script), "sha256": sha256_of(script)}},
        "args": list(spec.plugin_command[1:]),
    }
    parse_manifest(manifest, source=f"generated manifest of {name!r}")
    Path(destination).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _vz_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("vz")
    except metadata.PackageNotFoundError:
        return "0"
