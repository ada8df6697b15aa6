"""Strict JSON for vz.json: duplicate keys, NaN/Infinity, deep nesting and oversized files are refused with a
``DefinitionError`` naming the JSON path. The bottom of the definition modules: both the fast header read
(``_discover``) and the full validation (``_definition``) read files through it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from vz_core.env._errors import DefinitionError

__all__ = ["MAX_DEPTH", "MAX_SIZE", "decode_json", "load_json"]

MAX_DEPTH = 32
"""Deepest nesting of objects and arrays a vz.json may have (a valid one needs 5)."""
MAX_SIZE = 4 * 1024 * 1024
"""Largest vz.json read, in bytes."""

_KEY_RE = re.compile(r"[A-Za-z_$][A-Za-z0-9_]*\Z")


def _path_part(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    key = key if len(key) <= 64 else key[:61] + "..."  # a message stays one readable line
    return f"{parent}.{key}" if _KEY_RE.match(key) else f"{parent}[{json.dumps(key)}]"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode_json(text: str, source: str) -> Any:
    """Decode a vz.json text strictly: duplicate keys, NaN/Infinity, nesting deeper than ``MAX_DEPTH`` and
    integers too long to convert are refused with ``DefinitionError`` (with the JSON path where it applies)."""
    duplicates: dict[int, list[str]] = {}

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                duplicates.setdefault(id(out), []).append(key)
            out[key] = value
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise DefinitionError(
            f"{source}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}", [("$", f"invalid JSON: {exc.msg}")]
        ) from None
    except RecursionError:
        problem = ("$", f"nested deeper than {MAX_DEPTH} levels")
        raise DefinitionError(f"{source}: {problem[0]}: {problem[1]}", [problem]) from None
    except ValueError:  # an integer longer than Python converts (4,300 digits), NaN, Infinity
        problem = ("$", "invalid JSON: a number that cannot be read (too many digits, NaN or Infinity)")
        raise DefinitionError(f"{source}: {problem[0]}: {problem[1]}", [problem]) from None
    # One iterative walk: depth and duplicates, each reported with its JSON path.
    stack: list[tuple[Any, str, int]] = [(data, "$", 0)]
    while stack:
        node, path, depth = stack.pop()
        if not isinstance(node, dict | list):
            continue
        if depth >= MAX_DEPTH:
            problem = (path, f"nested deeper than {MAX_DEPTH} levels")
            raise DefinitionError(f"{source}: {problem[0]}: {problem[1]}", [problem])
        if isinstance(node, dict):
            dupes = duplicates.get(id(node))
            if dupes:
                where = _path_part(path, dupes[0])
                problem = (where, "duplicate key (JSON objects must not repeat a key)")
                raise DefinitionError(f"{source}: {problem[0]}: {problem[1]}", [problem])
            stack.extend((value, _path_part(path, key), depth + 1) for key, value in node.items())
        else:
            stack.extend((value, _path_part(path, i), depth + 1) for i, value in enumerate(node))
    return data


def load_json(path: Path) -> Any:
    """Read and strictly decode a vz.json (see ``decode_json``); every problem is a ``DefinitionError``."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_SIZE + 1)
    except OSError as exc:
        raise DefinitionError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_SIZE:
        raise DefinitionError(f"{path}: larger than {MAX_SIZE // (1024 * 1024)} MiB; this is not a vz.json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DefinitionError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return decode_json(text, str(path))
