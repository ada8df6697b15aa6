"""The capability matrix: which driver runs which target on which host, and how far along it is.

Statuses: ACTIVE (implemented and verified by the conformance suite on that host), DEV (implemented, not yet
passing the whole catalogue there, or not verifiable on the hosts we test on), PLANNED (not implemented).

The rows are assembled from the drivers' declarations (``DriverDeclaration.matrix``, see ``vz_core.registry``):
this module names no driver except those in ``PLANNED_WITHOUT_PACKAGE``, the drivers that have no package yet.
When such a driver's package is installed, its declaration takes over its rows.

``vz status`` prints the row of each Machine's driver, ``vz up`` refuses a PLANNED pair, and
``docs/capability-matrix.md`` holds the generated tables (``python -m vz_core.capability_matrix --write``
regenerates them; a test keeps the doc in sync).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vz_core.registry import DriverDeclaration, MatrixRow, Status

if TYPE_CHECKING:
    from vz_core.registry import DriverRegistry

__all__ = [
    "PLANNED_WITHOUT_PACKAGE",
    "Entry",
    "PlannedDriver",
    "Status",
    "current_host_os",
    "entries",
    "lookup",
    "render_markdown",
    "render_options_markdown",
    "shipped_registry",
    "sync_doc",
]


@dataclass(frozen=True)
class Entry:
    driver: str
    host_os: str
    target_os: str
    status: Status
    note: str = ""


@dataclass(frozen=True)
class PlannedDriver:
    """A driver that has no package yet: only its name, what it will be, and its (PLANNED) matrix rows."""

    name: str
    summary: str
    matrix: tuple[MatrixRow, ...]


PLANNED_WITHOUT_PACKAGE: tuple[PlannedDriver, ...] = ()
"""The one place drivers without a package are listed; delete an entry when its package declares it."""


def _registry(registry: DriverRegistry | None) -> DriverRegistry:
    if registry is not None:
        return registry
    from vz_core.registry import DriverRegistry

    return DriverRegistry()


def entries(registry: DriverRegistry | None = None) -> tuple[Entry, ...]:
    """Every row: registered drivers (by name, rows as declared), then the planned drivers without a package."""
    reg = _registry(registry)
    declared = reg.declarations()
    rows = [Entry(d.name, row.host_os, row.target_os, row.status, row.note) for d in declared for row in d.matrix]
    names = {d.name for d in declared}
    rows += [
        Entry(p.name, row.host_os, row.target_os, row.status, row.note)
        for p in PLANNED_WITHOUT_PACKAGE
        if p.name not in names
        for row in p.matrix
    ]
    return tuple(rows)


def __getattr__(name: str) -> Any:
    if name == "MATRIX":  # the former constant, now assembled from the declarations
        return entries()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def current_host_os() -> str:
    """This host's OS in matrix terms: "linux", "darwin" or "windows"."""
    return {"win32": "windows"}.get(sys.platform, sys.platform if sys.platform != "linux2" else "linux")


def lookup(
    driver: str, host_os: str | None = None, target_os: str = "linux", *, registry: DriverRegistry | None = None
) -> Entry | None:
    """The matrix entry for a driver/host/target triple, or ``None`` when the pair is not in the matrix."""
    host = host_os or current_host_os()
    for entry in entries(registry):
        if (entry.driver, entry.host_os, entry.target_os) == (driver, host, target_os):
            return entry
    return None


def render_markdown(registry: DriverRegistry | None = None) -> str:
    """The matrix as the Markdown table used in docs/capability-matrix.md."""
    lines = [
        "| driver | host OS | target OS | status | backend |",
        "|---|---|---|---|---|",
    ]
    for e in entries(registry):
        lines.append(f"| {e.driver} | {e.host_os} | {e.target_os} | {e.status} | {e.note} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{_cell(text)}`" if text else "-"


def _options_table(declaration: DriverDeclaration) -> list[str]:
    lines = [
        f"### {declaration.name}",
        "",
        f"{declaration.summary}. Plugin: `{' '.join(declaration.plugin_command) or '-'}`.",
        "",
    ]
    if declaration.options is None:
        return [*lines, "Options are not described by this driver's declaration.", ""]
    if not declaration.declared_options:
        return [*lines, "No options.", ""]
    lines += ["| option | scope | type | default | accepts | description |", "|---|---|---|---|---|---|"]
    for option in declaration.declared_options.values():
        lines.append(
            f"| `{option.name}` | {option.scope} | {option.kind} | {_code(option.shown_default())} "
            f"| {_cell(option.expects())} "
            f"| {_cell(option.help)} |"
        )
    return [*lines, ""]


def render_options_markdown(registry: DriverRegistry | None = None) -> str:
    """One options table per registered driver, generated from the declarations."""
    lines: list[str] = []
    for declaration in _registry(registry).declarations():
        lines += _options_table(declaration)
    return "\n".join(lines)


_BLOCKS = {
    "matrix": render_markdown,
    "options": render_options_markdown,
}


def shipped_registry() -> DriverRegistry:
    """The drivers shipped with vz (entry points of the ``vz`` distribution only): what its docs describe."""
    from vz_core.registry import DriverRegistry

    return DriverRegistry(distribution="vz")


def sync_doc(text: str, registry: DriverRegistry | None = None) -> str:
    """``text`` (docs/capability-matrix.md) with every generated block between its markers regenerated
    (default: from the drivers shipped with vz)."""
    reg = registry if registry is not None else shipped_registry()
    for name, render in _BLOCKS.items():
        start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
        head, sep, rest = text.partition(start)
        if not sep or end not in rest:
            raise ValueError(f"the document has no {start.strip()} ... {end} block")
        text = head + start + render(reg) + rest[rest.index(end) :]
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vz_core.capability_matrix", description=__doc__.split("\n")[0])
    parser.add_argument("--write", type=Path, metavar="DOC", help="regenerate the tables of DOC in place")
    args = parser.parse_args(argv)
    if args.write is None:
        reg = shipped_registry()
        sys.stdout.write(render_markdown(reg) + "\n" + render_options_markdown(reg))
        return 0
    args.write.write_text(sync_doc(args.write.read_text()))
    return 0


if __name__ == "__main__":  # pragma: no cover - used to regenerate the doc tables
    sys.exit(main())
