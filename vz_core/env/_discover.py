"""Finding vz.json and reading the little the hot paths need from it, without pydantic.

``vz exec`` must start fast, so it reads only the project id (and checks its shape) with the json module; any
problem falls back to the full validation of ``vz_core.env._definition`` so the user still gets the complete
error with JSON paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vz_core.env._errors import DefinitionError, DefinitionNotFoundError
from vz_core.env._ids import PROJECT_ID_RE
from vz_core.env._json import MAX_DEPTH, MAX_SIZE, decode_json, load_json

__all__ = [
    "DEFINITION_FILE",
    "MAX_DEPTH",
    "MAX_SIZE",
    "DefinitionHeader",
    "decode_json",
    "find_definition",
    "load_json",
    "read_header",
]

DEFINITION_FILE = "vz.json"


@dataclass(frozen=True)
class DefinitionHeader:
    """Where a vz.json is and the id of the project it declares."""

    path: Path
    project_id: str

    @property
    def worktree(self) -> Path:
        """The project directory: the one holding vz.json (what the workspace projection shows)."""
        return self.path.parent


def find_definition(start: Path, explicit: Path | None = None) -> Path:
    """The nearest vz.json in ``start`` or a parent directory (or ``explicit`` when given).

    Raises ``DefinitionNotFoundError`` naming every directory that was searched.
    """
    if explicit is not None:
        path = explicit if explicit.is_absolute() else start / explicit
        if path.is_dir():
            path = path / DEFINITION_FILE
        if not path.is_file():
            raise DefinitionNotFoundError(f"no project definition at {path} (given with --file)", [str(path)])
        return path.resolve()
    here = start.resolve()
    searched: list[str] = []
    for directory in (here, *here.parents):
        searched.append(str(directory))
        candidate = directory / DEFINITION_FILE
        if candidate.is_file():
            return candidate
    shown = searched if len(searched) <= 4 else [*searched[:2], "…", searched[-1]]
    raise DefinitionNotFoundError(
        f"no {DEFINITION_FILE} found in {here} or any parent directory (searched {', '.join(shown)}); "
        f"create one (see examples/) or run vz from your project directory",
        searched,
    )


def read_header(path: Path) -> DefinitionHeader:
    """The project id of ``path``, fast. A malformed file gets the full validation error instead."""
    try:
        data = load_json(path)
        project_id = data["project_id"]
        if isinstance(project_id, str) and PROJECT_ID_RE.fullmatch(project_id) and data.get("version") in (1, 2):
            return DefinitionHeader(path=path, project_id=project_id)
    except (DefinitionError, KeyError, TypeError, AttributeError):
        pass
    from vz_core.env._definition import load_definition

    definition = load_definition(path)  # raises DefinitionError with every problem
    return DefinitionHeader(path=path, project_id=definition.project_id)
