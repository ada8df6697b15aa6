"""What vz records of every added external driver, beside its manifest record: its provenance (where the
manifest came from, its version, who signed it, when it was added), the previous version kept for rollback,
and the signature check ``vz_core.drivers.add_manifest`` runs before anything is recorded. State lives in
``<state dir>/driver-installs/<name>/state.json`` (``vz_core._install`` describes the layout and installs from
URLs on top of this module)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vz_core._download import redact_url
from vz_core._trustroots import Origin, SignerCheck, TrustRoots
from vz_core.errors import TrustError
from vz_core.paths import state_dir
from vz_core.registry import check_driver_name

if TYPE_CHECKING:
    from vz_core.drivers import ExternalRecord
    from vz_core.trust import Manifest

__all__ = [
    "check_signature",
    "installs_root",
    "load_state",
    "provenance_of",
    "record_installed",
    "record_json",
    "save_state",
]

_MAX_STATE = 1 << 20


def installs_root() -> Path:
    return state_dir() / "driver-installs"


# -- state.json ----------------------------------------------------------------------------------------------
def _state_path(name: str, root: Path | None = None) -> Path:
    return (root if root is not None else installs_root()) / check_driver_name(name) / "state.json"


def load_state(name: str) -> dict[str, Any]:
    path = _state_path(name)
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_STATE + 1)
        raw = json.loads(data)
        if len(data) > _MAX_STATE or not isinstance(raw, dict):
            raise ValueError("not an install state")
        return raw
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:
        raise TrustError(f"the install state of driver {name!r} ({path}) is unreadable ({exc}); add it again") from None


def save_state(name: str, state: dict[str, Any]) -> None:
    path = _state_path(name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".state.json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def record_json(record: ExternalRecord) -> dict[str, Any]:
    return {
        "manifest": record.manifest.model_dump(mode="json", exclude_none=True),
        "driver_dir": str(record.driver_dir),
        "manifest_path": record.manifest_path,
        "added_at": record.added_at,
    }


def provenance_of(name: str) -> dict[str, Any]:
    """The provenance of added driver ``name`` (empty when none was recorded: added by an older vz)."""
    try:
        current = load_state(name).get("current")
    except TrustError:
        return {}
    return {"provenance": current} if isinstance(current, dict) else {}


# -- the hooks add_manifest calls ----------------------------------------------------------------------------
def check_signature(
    manifest_path: Path, manifest: Manifest, *, origin: Origin, roots: TrustRoots | None = None
) -> SignerCheck:
    """Check the signature of the manifest file ``manifest_path`` (already parsed as ``manifest``) under the
    policy for ``origin``; ``TrustError`` before anything is written."""
    from vz_core.trust import MAX_MANIFEST_BYTES, parse_manifest

    source = f"manifest {manifest_path}"
    try:
        with open(manifest_path, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
        raw = json.loads(data)
    except (OSError, ValueError, RecursionError) as exc:
        raise TrustError(f"cannot read {source} again to check its signature: {exc}") from None
    if not isinstance(raw, dict) or parse_manifest(raw, source=source) != manifest:
        raise TrustError(f"{source} changed while it was being added; nothing was recorded")
    return (roots if roots is not None else TrustRoots()).check(raw, origin=origin, source=source)


def record_installed(
    name: str,
    signer: SignerCheck,
    previous: ExternalRecord | None,
    current: ExternalRecord,
    *,
    origin: Origin,
    source: str,
    roots: TrustRoots | None = None,
) -> dict[str, Any]:
    """After ``current`` was recorded: keep ``previous`` for rollback, write the provenance, accept a rotated
    key, prune version directories no longer referenced. Returns the provenance."""
    state = load_state(name)
    provenance = {
        "origin": origin,
        "source": redact_url(source) if origin == "url" else source,
        "version": current.manifest.version,
        "added_at": current.added_at,
        **signer.describe(),
    }
    if previous is not None and (previous.driver_dir != current.driver_dir or previous.manifest != current.manifest):
        state["previous"] = {"record": record_json(previous), "provenance": state.get("current") or {}}
    state["current"] = provenance
    save_state(name, state)
    (roots if roots is not None else TrustRoots()).accept(signer)
    _prune(name, state, current)
    return provenance


def _prune(name: str, state: dict[str, Any], current: ExternalRecord) -> None:
    base = installs_root() / name
    keep = {current.driver_dir}
    previous = state.get("previous")
    if isinstance(previous, dict):
        keep.add(Path(previous["record"]["driver_dir"]))
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith("v") and entry.is_dir(follow_symlinks=False) and Path(entry.path) not in keep:
            shutil.rmtree(entry.path, ignore_errors=True)
