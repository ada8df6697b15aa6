"""Each module of ``vz_core.env`` stays small enough to read as one job: at most 600 lines, no function over 80."""

from __future__ import annotations

import ast
from pathlib import Path

ENV = Path(__file__).resolve().parents[3] / "vz_core" / "env"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def oversized(source: str, name: str) -> list[str]:
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES}): split it by job")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    return found


def test_the_size_check_catches_a_long_function() -> None:
    long = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert oversized(long, "m.py") == [f"m.py:1 f: {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})"]
    assert oversized("def f():\n    return 1\n", "m.py") == []


def test_every_env_module_is_small() -> None:
    found = [line for path in sorted(ENV.glob("*.py")) for line in oversized(path.read_text(), path.name)]
    assert not found, "\n".join(found)
