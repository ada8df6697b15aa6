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


# --- the layer table of docs/architecture.md, and no import cycles -------------------------------------------
#
# A module graph read with ``ast``: an edge for each import a module executes (imports under ``if
# TYPE_CHECKING:`` are types only and left out). ``from P import N`` is an edge to module ``P.N`` when that is a
# module of ours, else to ``P`` (for a package: its ``__init__``). Importing ``P.M`` runs ``P``'s ``__init__``
# too, but that is no edge: a package's ``__init__`` re-exporting its own modules is a cycle only when one of
# them imports the package back (by name).

GRAPHED = ("vz_core", "vz_drivers", "vz_plugins", "vz_conformance", "benchmarks")


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                skip.update(id(inner) for child in node.body for inner in ast.walk(child))
    return skip


def module_graph(roots: dict[str, Path]) -> dict[str, set[str]]:
    """Module name -> the modules of ours it imports, for every ``*.py`` of the packages in ``roots`` (package
    name -> the directory holding it); generated code (``_proto``) is left out."""
    files: dict[str, tuple[Path, bool]] = {}
    for top, base in roots.items():
        for path in sorted((base / top).rglob("*.py")):
            parts, is_package = _module_of(path, base)
            if "_proto" not in parts:
                files[".".join(parts)] = (path, is_package)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, (path, is_package) in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        package = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = package[: len(package) - (node.level - 1)]
                    origin = ".".join(anchor + (node.module.split(".") if node.module else []))
                else:
                    origin = node.module or ""
                targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in files else origin for a in node.names]
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other around a circle (strongly connected, two or more), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


# Each rule of the layer table: (importer, imported, why). A module is "in" a prefix when its dotted name is the
# prefix or starts with it and a dot; ``imported`` lists what no module of ``importer`` may import.
_CORE_LAYERS = (  # vz_core, bottom first: a layer imports only the layers below it
    ("vz_core.platform",),
    (
        "vz_core.errors",
        "vz_core.redact",
        "vz_core.paths",
        "vz_core.rules",
        "vz_core.secrets",
        "vz_core.trust",
        "vz_core._types",
        "vz_core._driver",
        "vz_core.negotiate",
    ),
    ("vz_core.transport",),
    ("vz_core.rpc",),
    ("vz_core.options", "vz_core._declaration", "vz_core.registry", "vz_core._registry", "vz_core.capability_matrix"),
    ("vz_core.drivers",),
    ("vz_core.network",),
    ("vz_core.env",),
    ("vz_core.daemon",),
    ("vz_core.api",),
    ("vz_core.cli",),
)
_DRIVER_PACKAGES = ("qemu", "vfkit", "hyperv", "linux_native", "macos_vm")


def _layer_rules() -> list[tuple[tuple[str, ...], tuple[str, ...], str]]:
    rules: list[tuple[tuple[str, ...], tuple[str, ...], str]] = [
        (("vz_core",), ("vz_drivers", "vz_conformance", "benchmarks"), "the core finds drivers by declaration"),
        (("vz_core",), ("vz_plugins",), "the core never imports the plugin SDK (it is the SDK's foundation)"),
        (("vz_plugins",), ("vz_drivers", "vz_conformance", "benchmarks"), "the SDK serves any driver"),
        (("vz_drivers",), ("vz_conformance", "benchmarks"), "a declaration names its adapter by string"),
        (("vz_conformance",), ("vz_drivers", "benchmarks"), "the suite reaches drivers through the registry"),
        (("vz_core.api",), ("vz_core.daemon",), "the API client never imports the daemon"),
    ]
    shared = tuple(f"vz_drivers.{name}" for name in _DRIVER_PACKAGES)
    rules.append(
        (
            (
                "vz_drivers._machine",
                "vz_drivers._guest",
                "vz_drivers._agent",
                "vz_drivers._images",
                "vz_drivers._files",
                "vz_drivers._lazy",
            ),
            shared,
            "the shared layers sit below every driver",
        )
    )
    for name in _DRIVER_PACKAGES:
        others = tuple(p for p in shared if p != f"vz_drivers.{name}")
        rules.append(((f"vz_drivers.{name}",), others, "no driver imports another driver's modules"))
    for i, layer in enumerate(_CORE_LAYERS):
        above = tuple(p for upper in _CORE_LAYERS[i + 1 :] for p in upper)
        if above:
            rules.append((layer, above, f"{layer[0]} is below {', '.join(u[0] for u in _CORE_LAYERS[i + 1 :])}"))
    return rules


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer_violations(
    graph: dict[str, set[str]], rules: list[tuple[tuple[str, ...], tuple[str, ...], str]]
) -> list[str]:
    found = []
    for module, imported in sorted(graph.items()):
        for importer, forbidden, why in rules:
            if _in(module, importer):
                found += [f"{module} imports {t}: {why}" for t in sorted(imported) if _in(t, forbidden)]
    return found


# Edges the layer table forbids that the code still has, each to be removed (then deleted here): the API client
# and the daemon share the local wire through each other today; they move to one package below both.
PENDING = frozenset(
    {
        "vz_core.api._errors imports vz_core.daemon: the API client never imports the daemon",
        "vz_core.api._grpc_transport imports vz_core.daemon: the API client never imports the daemon",
        "vz_core.api._transport imports vz_core.daemon: the API client never imports the daemon",
        "vz_core.api.pb imports vz_core.daemon: the API client never imports the daemon",
        "vz_core.daemon._grpc imports vz_core.api.pb: vz_core.daemon is below vz_core.api, vz_core.cli",
    }
)
PENDING_CYCLES = [["vz_core.api._client", "vz_core.api._types"]]


def _graph_roots() -> dict[str, Path]:
    return {top: SOURCES[top] for top in GRAPHED}


def _plant(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"vz_core": root, "vz_plugins": root}


def test_the_layer_rules_catch_a_planted_violation(tmp_path: Path) -> None:
    roots = _plant(
        tmp_path,
        {
            "vz_core/__init__.py": "",
            "vz_core/transport/__init__.py": "",
            "vz_core/transport/_launcher.py": "from vz_core.rpc import CHANNEL_OPTIONS\n",
            "vz_core/rpc/__init__.py": "from vz_core.transport import PluginLauncher\n",
            "vz_core/registry.py": "def main():\n    from vz_plugins import serve\n",
            "vz_core/env/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import vz_core.cli\n",
            "vz_core/cli/__init__.py": "",
            "vz_plugins/__init__.py": "import vz_core.rpc\n",
        },
    )
    found = layer_violations(module_graph(roots), _layer_rules())
    assert found == [
        "vz_core.registry imports vz_plugins: the core never imports the plugin SDK (it is the SDK's foundation)",
        "vz_core.transport._launcher imports vz_core.rpc: vz_core.transport is below vz_core.rpc, "
        "vz_core.options, vz_core.drivers, vz_core.network, vz_core.env, vz_core.daemon, vz_core.api, vz_core.cli",
    ]


def test_the_cycle_finder_finds_a_planted_cycle(tmp_path: Path) -> None:
    roots = _plant(
        tmp_path,
        {
            # a package re-exporting its modules is no cycle; a module importing its package back is
            "vz_core/__init__.py": "",
            "vz_core/env/__init__.py": "from vz_core.env._up import up\nfrom vz_core.env._store import Store\n",
            "vz_core/env/_up.py": "from vz_core.env._store import Store\n",
            "vz_core/env/_store.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._up import up\n",
            "vz_core/net/__init__.py": "from vz_core.net._a import a\n",
            "vz_core/net/_a.py": "def a():\n    from vz_core.net import _b\n",
            "vz_core/net/_b.py": "from vz_core import net\n",
            "vz_plugins/__init__.py": "",
        },
    )
    assert import_cycles(module_graph(roots)) == [["vz_core.net", "vz_core.net._a", "vz_core.net._b"]]


def test_every_rule_of_the_layer_table_holds() -> None:
    found = set(layer_violations(module_graph(_graph_roots()), _layer_rules()))
    assert not found - PENDING, "imports across the layer table (docs/architecture.md):\n  " + "\n  ".join(
        sorted(found - PENDING)
    )
    assert not PENDING - found, "gone, delete from PENDING:\n  " + "\n  ".join(sorted(PENDING - found))


def test_no_import_cycles() -> None:
    assert import_cycles(module_graph(_graph_roots())) == PENDING_CYCLES
