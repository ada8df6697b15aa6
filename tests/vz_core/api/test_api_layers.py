"""The wire package is below both the API client and the daemon: ``vz_core.api`` never imports
``vz_core.daemon``, and ``vz_core.wire`` imports neither (nor grpc, protobuf or asyncio at module level)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RULES = {
    "vz_core/api": ("vz_core.daemon",),
    "vz_core/wire": ("vz_core.daemon", "vz_core.api", "vz_core.env", "grpc", "google.protobuf"),
}


def forbidden_imports(source: str, banned: tuple[str, ...]) -> list[str]:
    """Every import of a banned package in ``source`` (at any depth: a lazy import counts too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if any(name == b or name.startswith(b + ".") for b in banned):
                found.append(f"line {node.lineno}: {name}")
    return found


def test_the_api_client_and_the_wire_import_nothing_above_them() -> None:
    problems = []
    for folder, banned in RULES.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            for hit in forbidden_imports(path.read_text(), banned):
                problems.append(f"{path.relative_to(ROOT)} {hit}")
    assert not problems, "\n".join(problems)


def test_a_planted_violation_is_found() -> None:
    assert forbidden_imports("def f():\n    from vz_core.daemon import connect\n", ("vz_core.daemon",)) == [
        "line 2: vz_core.daemon"
    ]
    assert forbidden_imports("import vz_core.daemonic\n", ("vz_core.daemon",)) == []
