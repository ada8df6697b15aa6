"""Every cross-package import uses public names.

A dotted module path whose component starts with ``_`` (``vz_core.env._engine``, ``vz_drivers._machine``) is
private to the package that contains that component: only modules inside that package (or its subpackages)
may import it. Everything else goes through a package's public names (its ``__init__`` and its ``__all__``).
The rule covers the shipped packages, the benchmarks and the example external driver; tests are exempt
(they mirror the tree and may look inside what they test).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# source root -> directory holding importable top-level packages
SOURCES = {
    "vz_core": ROOT,
    "vz_drivers": ROOT,
    "benchmarks": ROOT,
    "vz_plugins": ROOT / "plugins",
    "vz_conformance": ROOT / "conformance",
    "vz_driver_hostdir": ROOT / "examples/drivers/hostdir/src",
    "api": ROOT / "examples",  # examples/api: scripts on the public Python client
}
OURS = frozenset(SOURCES)


def _module_of(path: Path, base: Path) -> tuple[list[str], bool]:
    """The dotted name of a source file and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        return parts[:-1], True
    return parts, False


def _is_module(parts: list[str]) -> bool:
    """Whether ``parts`` names a module file (not a package) of ours."""
    base = SOURCES.get(parts[0])
    return base is not None and base.joinpath(*parts).with_suffix(".py").is_file()


def _private_index(parts: list[str]) -> list[int]:
    return [i for i, part in enumerate(parts) if part.startswith("_") and not part.startswith("__")]


def violations_in(source: str, module: list[str], is_package: bool) -> list[str]:
    """The imports in ``source`` (the module named ``module``) that reach into another package's privates."""
    package = module if is_package else module[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[list[str]] = []
        if isinstance(node, ast.Import):
            targets = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                base = anchor + (node.module.split(".") if node.module else [])
            else:
                base = (node.module or "").split(".")
            targets = [[*base, alias.name] for alias in node.names if alias.name != "*"] or [base]
        for target in targets:
            if not target or target[0] not in OURS:
                continue
            for i in _private_index(target):
                container = target[:i]
                if _is_module(container):
                    container = container[:-1]  # a module's private name is its package's
                if package[: len(container)] != container:
                    found.append(f"line {node.lineno}: {'.'.join(target)} is private to {'.'.join(container)}")
                    break
    return found


def _sources() -> list[object]:
    out = []
    for top, base in SOURCES.items():
        for path in sorted((base / top).rglob("*.py")):
            if "_proto" in path.relative_to(base).parts:
                continue  # generated code imports its own package
            out.append(pytest.param(path, base, id=str(path.relative_to(ROOT))))
    return out


def test_the_rule_catches_what_it_names() -> None:
    bad = "from vz_core.env._engine import Engine\nimport vz_plugins._servicer\nfrom vz_core.env import _store\n"
    assert len(violations_in(bad, ["vz_core", "cli", "_main"], False)) == 3
    ok = "from vz_core.env._store import Store\nfrom ._plan import plan\nfrom vz_core.env import Engine\n"
    assert violations_in(ok, ["vz_core", "env", "_up"], False) == []
    # a subpackage may use its parent's private subpackage through that subpackage's public names
    assert violations_in("from vz_drivers._machine import X\n", ["vz_drivers", "qemu", "_driver"], False) == []
    assert violations_in("from vz_drivers._machine._book import X\n", ["vz_drivers", "qemu", "_d"], False) != []
    # a private name of a sibling module is the package's own; of another package's module it is not
    assert violations_in("from vz_core.env._up import _plan\n", ["vz_core", "env", "_status"], False) == []
    assert violations_in("from vz_core.env._up import _plan\n", ["vz_core", "cli", "_main"], False) != []
    assert violations_in("from vz_core.errors import _table\n", ["vz_core", "cli", "_main"], False) == []
    assert violations_in("from vz_core.errors import _table\n", ["vz_plugins", "_serve"], False) != []


@pytest.mark.parametrize(("path", "base"), _sources())
def test_no_private_import_across_packages(path: Path, base: Path) -> None:
    module, is_package = _module_of(path, base)
    problems = violations_in(path.read_text(encoding="utf-8"), module, is_package)
    assert not problems, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(problems)
