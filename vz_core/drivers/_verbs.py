"""The library behind ``vz driver list | add | verify | configure`` and ``builtin_manifest``: plain data (dicts
of str/bool/list) for the CLI and ``--json``."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any, Literal

from vz_core.drivers._launch import resolve
from vz_core.drivers._manifests import ExternalRecord, ManifestStore
from vz_core.drivers._options import HostConfig, builtin_or_refuse, check_value
from vz_core.drivers._pinning import console_script, pin_builtin
from vz_core.errors import TrustError, UserError
from vz_core.registry import DriverRegistry, check_driver_name

__all__ = ["add_manifest", "builtin_manifest", "configure", "list_drivers", "verify"]


def _external_row(name: str, record: ExternalRecord) -> dict[str, Any]:
    from vz_core.trust import host_platform

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
    from vz_core._provenance import provenance_of

    row.update(provenance_of(name))
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
    path: str | os.PathLike[str],
    *,
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    origin: Literal["url", "file"] = "file",
    source: str | None = None,
) -> dict[str, Any]:
    """Validate a manifest, check its signature against the trust roots (``vz_core._trustroots``, policy for
    ``origin``), verify this host's binary now, and record it (replacing an older record, which is kept for
    ``vz driver rollback``) with its provenance (``source``: where it came from, default the manifest's path).

    ``TrustError`` (nothing recorded) for an invalid manifest, a signature the trust roots refuse, a missing or
    malformed checksum, no binary for this host, or a binary that fails verification; ``UserError`` when the
    name is a built-in driver's.
    """
    registry = registry if registry is not None else DriverRegistry()
    store = store if store is not None else ManifestStore()
    manifest_path = Path(path).absolute()
    from vz_core.trust import load_manifest, sha256_of

    manifest = load_manifest(manifest_path)
    if manifest.name in registry.names():
        raise UserError(f"driver name {manifest.name!r} belongs to a built-in driver; give the manifest another name")
    from vz_core._provenance import check_signature, record_installed

    signer = check_signature(manifest_path, manifest, origin=origin)
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
    record_installed(manifest.name, signer, previous, record, origin=origin, source=source or str(manifest_path))
    row = _external_row(manifest.name, record)
    row["status"] = "updated" if previous is not None else "added"
    return row


def _verify_one(name: str, registry: DriverRegistry, store: ManifestStore) -> dict[str, Any]:
    from vz_core.trust import sha256_of

    resolved = resolve(name, registry=registry, store=store)
    if resolved.builtin is not None:
        row: dict[str, Any] = {"name": name, "origin": "builtin"}
        if not resolved.builtin.plugin_command:
            row.update(
                ok=True,
                detail="declares no console script: the vz daemon runs it through a launcher script it writes "
                "and pins at start (with the registration module)",
            )
            return row
        try:
            pinned = pin_builtin(name, registry=registry).pinned
        except (TrustError, UserError) as exc:
            row.update(ok=False, detail=str(exc))
            return row
        assert pinned is not None
        row.update(binary=str(pinned.script), actual=pinned.sha256, ok=True)
        if pinned.anchor == "installation RECORD":
            row.update(expected=pinned.sha256, detail="console script matches the hash its installation recorded")
        else:
            row["detail"] = "console script found; its installation recorded no hash for it to compare with"
        return row
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
    absolute, so the manifest file may live anywhere. Its ``options`` is the declaration's options as a JSON
    Schema (types, defaults, bounds, choices). Returns the manifest as a dict.
    """
    from vz_core.trust import host_platform, parse_manifest, sha256_of

    registry = registry if registry is not None else DriverRegistry()
    spec = registry.get(name)
    script = console_script(name, spec)
    manifest = {
        "manifest_version": 1,
        "name": name,
        "version": _vz_version(),
        "api_version": "1.3",
        "binaries": {host_platform(): {"path": str(script), "sha256": sha256_of(script)}},
        "args": list(spec.plugin_command[1:]),
    }
    if spec.options is not None:  # the declaration's options, typed: what another host may check values against
        manifest["options"] = spec.options_schema()
    parse_manifest(manifest, source=f"generated manifest of {name!r}")
    Path(destination).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _vz_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("vz")
    except metadata.PackageNotFoundError:
        return "0"


def configure(
    name: str,
    assignments: list[str] | None = None,
    unset: list[str] | None = None,
    *,
    registry: DriverRegistry | None = None,
    store: ManifestStore | None = None,
    host_config: HostConfig | None = None,
) -> dict[str, Any]:
    """``vz driver configure NAME [KEY=VALUE ...] [--unset KEY ...]``: change and show a built-in driver's host
    configuration. Values are parsed by the option's declared kind. Returns ``{"name", "path", "options"}``."""
    registry = registry if registry is not None else DriverRegistry()
    declaration = builtin_or_refuse(check_driver_name(name), registry, store, "vz driver configure")
    config_store = host_config if host_config is not None else HostConfig()
    config = config_store.load()
    current = dict(config.get(name, {}))
    changed = False
    for item in assignments or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"vz driver configure: {item!r} must look like KEY=VALUE")
        declaration.check_option_keys({key: text}, where="vz driver configure")
        option = declaration.declared_options.get(key)
        try:
            value = option.parse(text) if option is not None else text
        except ValueError as exc:
            raise UserError(f"vz driver configure: {exc}") from None
        current[key] = check_value(list(value) if isinstance(value, tuple) else value, key)
        changed = True
    for key in unset or []:
        if key not in current:
            raise UserError(f"vz driver configure: {name} has no {key!r} in {config_store.path}")
        del current[key]
        changed = True
    if changed:
        config[name] = current
        config_store.save(config)
    return {"name": name, "path": str(config_store.path), "options": current}
