"""Validation errors as (JSON path, message) lines: ``$.machines[0].profile: ...``."""

from __future__ import annotations

import json
import re
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


class LocatedProblems(ValueError):
    """Several problems, each at its own JSON path (cross-references that one field's validator cannot see)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{path}: {message}" for path, message in problems))
        self.problems = problems


_MESSAGES = {
    "missing": "required field is missing",
    "extra_forbidden": "unknown field",
}


_TAGS = ("literal", "secret", "policy", "allowlist")  # discriminator tags pydantic puts in error locations


def _json_path(loc: tuple[int | str, ...], data: object) -> str:
    out = "$"
    node: object = data
    for part in loc:
        if part in _TAGS and not (isinstance(node, dict) and part in node):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
        else:
            shown = part if len(part) <= 64 else part[:61] + "..."  # one readable line, whatever the key
            out += f".{shown}" if re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_]*", shown) else f"[{json.dumps(shown)}]"
            node = node.get(part) if isinstance(node, dict) else None
    return out


def _step(tp: Any, part: int | str) -> Any:
    """The annotation reached from ``tp`` by one location part, or None."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _step(get_args(tp)[0], part)
    if origin in (Union, UnionType):
        for arg in get_args(tp):
            found = _step(arg, part)
            if found is not None:
                return found
        return None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if isinstance(part, str):
            for name, field in tp.model_fields.items():
                if (field.alias or name) == part:
                    return field.annotation
        return None
    if origin is list and isinstance(part, int):
        return get_args(tp)[0]
    if origin is dict and isinstance(part, str):
        return get_args(tp)[1]
    return None


def _model_in(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    if get_origin(tp) in (Annotated, Union, UnionType):
        for arg in get_args(tp):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _allowed_fields(root: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Field names allowed in the object holding the unknown field ``loc[-1]``."""
    tp: Any = root
    for part in loc[:-1]:
        found = _step(tp, part)
        if found is None:
            if part in _TAGS:
                continue
            return []
        tp = found
    model = _model_in(tp)
    return [field.alias or name for name, field in model.model_fields.items()] if model else []


def _machine_label(loc: tuple[int | str, ...], data: object) -> str:
    if len(loc) >= 2 and loc[0] == "machines" and isinstance(loc[1], int) and isinstance(data, dict):
        machines = data.get("machines")
        if isinstance(machines, list) and 0 <= loc[1] < len(machines) and isinstance(machines[loc[1]], dict):
            name = machines[loc[1]].get("name")
            if isinstance(name, str) and name:
                return f" (machine {name!r})"
    return ""


def located_problems(root: type[BaseModel], error: ValidationError, data: object) -> list[tuple[str, str]]:
    """Every problem of ``error`` (raised validating ``data`` as ``root``), each once, in order."""
    problems: list[tuple[str, str]] = []
    for item in error.errors(include_url=False):
        located = (item.get("ctx") or {}).get("error")
        if isinstance(located, LocatedProblems) and not item["loc"]:
            problems.extend(line for line in located.problems if line not in problems)
            continue
        loc = tuple(item["loc"])
        kind = item["type"]
        message = _MESSAGES.get(kind, item["msg"])
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if kind == "extra_forbidden":
            allowed = _allowed_fields(root, loc)
            if allowed:
                message += f" (allowed: {', '.join(allowed)})"
        elif kind == "string_pattern_mismatch" and loc and loc[-1] in ("name", "default_machine"):
            message = "must be lowercase letters, digits and inner dashes, 1..40 characters"
        elif kind == "string_pattern_mismatch" and loc == ("project_id",):
            message = "must be lowercase letters, digits, '.', '_' or '-', 1..64 characters"
        elif kind == "string_pattern_mismatch" and loc and loc[-1] == "target":
            message = "must be an absolute path (starting with '/')"
        elif kind == "string_pattern_mismatch" and loc and loc[-1] == "driver":
            message = "must be a driver name: lowercase letters, digits, '_' or '-', at most 63 (see `vz driver list`)"
        path = _json_path(loc, data)
        line = (path, message + _machine_label(loc, data))
        if line not in problems:
            problems.append(line)
    return problems
