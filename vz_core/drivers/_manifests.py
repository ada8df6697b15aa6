"""The records of the external drivers the user added (``vz driver add``): one JSON file each under
``<state dir>/driver-manifests``, found by exact name among the recorded files, never through a symlink."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vz_core.errors import TrustError
from vz_core.paths import state_dir
from vz_core.registry import check_driver_name, is_driver_name

if TYPE_CHECKING:
    from vz_core.trust import Manifest

__all__ = ["ExternalRecord", "ManifestStore"]

_MAX_RECORD = 1 << 20  # a record is a small JSON file; a larger one is not ours


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

    def _recorded(self) -> dict[str, str]:
        """Recorded driver name -> the record's file name, from the directory listing (regular files only)."""
        try:
            entries = list(os.scandir(self.root))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as exc:
            raise TrustError(f"cannot list the recorded drivers in {self.root}: {exc.strerror}") from None
        found: dict[str, str] = {}
        for entry in entries:
            stem, dot, suffix = entry.name.rpartition(".")
            if dot and suffix == "json" and is_driver_name(stem) and entry.is_file(follow_symlinks=False):
                found[stem] = entry.name
        return found

    def names(self) -> list[str]:
        return sorted(self._recorded())

    def get(self, name: str) -> ExternalRecord | None:
        """The record of the added driver ``name``, or ``None``. ``name`` is never joined into a path: it is looked
        up among the recorded files, which are opened without following symlinks."""
        if not is_driver_name(name):
            return None
        file_name = self._recorded().get(name)
        if file_name is None:
            return None
        path = self.root / file_name
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                data = f.read(_MAX_RECORD + 1)
            if len(data) > _MAX_RECORD:
                raise ValueError("larger than a record can be")
            raw = json.loads(data)
            manifest, driver_dir = raw["manifest"], Path(raw["driver_dir"])
            manifest_path, added_at = str(raw["manifest_path"]), str(raw["added_at"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise TrustError(
                f"the record of driver {name!r} ({path}) is unreadable ({type(exc).__name__}); add it again"
            ) from None
        from vz_core.trust import parse_manifest

        parsed = parse_manifest(manifest, source=f"recorded manifest of {name!r}")
        if parsed.name != name or not driver_dir.is_absolute():
            raise TrustError(
                f"the record of driver {name!r} ({path}) does not describe driver {name!r}; add it again with "
                "`vz driver add <manifest>`"
            )
        return ExternalRecord(manifest=parsed, driver_dir=driver_dir, manifest_path=manifest_path, added_at=added_at)

    def put(self, record: ExternalRecord) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {
            "manifest": record.manifest.model_dump(mode="json", exclude_none=True),
            "driver_dir": str(record.driver_dir),
            "manifest_path": record.manifest_path,
            "added_at": record.added_at,
        }
        path = self.root / f"{check_driver_name(record.manifest.name, where='manifest name')}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
