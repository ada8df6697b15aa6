"""The capability matrix is assembled from the drivers' declarations (plus the drivers without a package yet)
and docs/capability-matrix.md holds exactly the generated tables."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from vz_core import capability_matrix as cm
from vz_core.registry import DriverDeclaration, DriverRegistry, MatrixRow, Option, hookimpl

DOC = Path(__file__).resolve().parents[2] / "docs" / "capability-matrix.md"
REGENERATE = "run: python -m vz_core.capability_matrix --write docs/capability-matrix.md"


def test_doc_tables_match_the_declarations() -> None:
    text = DOC.read_text()
    assert cm.sync_doc(text) == text, REGENERATE
    table = text.split("<!-- matrix:start -->\n", 1)[1].split("<!-- matrix:end -->", 1)[0]
    assert table == cm.render_markdown(cm.shipped_registry())
    for name in ("fake", "linux_native", "qemu"):
        assert f"### {name}\n" in text


def test_the_doc_generator_rewrites_a_stale_doc(tmp_path: Path) -> None:
    stale = tmp_path / "matrix.md"
    stale.write_text(
        DOC.read_text().replace("| linux_native | linux | linux | ACTIVE |", "| linux_native | linux | linux | DEV |")
    )
    assert cm.sync_doc(stale.read_text()) != stale.read_text()
    subprocess.run([sys.executable, "-m", "vz_core.capability_matrix", "--write", str(stale)], check=True, timeout=60)
    assert stale.read_text() == DOC.read_text()
    with pytest.raises(ValueError, match="no <!-- options:start -->"):
        cm.sync_doc("<!-- matrix:start -->\n<!-- matrix:end -->\n")


def test_each_triple_is_listed_once() -> None:
    triples = [(e.driver, e.host_os, e.target_os) for e in cm.entries()]
    assert len(triples) == len(set(triples))
    assert triples == [(e.driver, e.host_os, e.target_os) for e in cm.MATRIX]


def test_rows_come_from_declarations_and_planned_drivers() -> None:
    registry = DriverRegistry(distribution="vz")
    declared = {(d.name, r.host_os, r.target_os, r.status) for d in registry.declarations() for r in d.matrix}
    rows = {(e.driver, e.host_os, e.target_os, e.status) for e in cm.entries(registry)}
    assert declared <= rows
    planned = {(p.name, r.host_os, r.target_os, r.status) for p in cm.PLANNED_WITHOUT_PACKAGE for r in p.matrix}
    assert rows == declared | planned
    assert cm.PLANNED_WITHOUT_PACKAGE == ()  # every built-in driver has its package now
    assert not {p.name for p in cm.PLANNED_WITHOUT_PACKAGE} & {d.name for d in registry.declarations()}
    assert all(r.status == "PLANNED" for p in cm.PLANNED_WITHOUT_PACKAGE for r in p.matrix)


def test_a_new_driver_package_adds_its_rows_and_takes_over_a_planned_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = cm.PlannedDriver("acme_os", "acme Machines", (MatrixRow("darwin", "darwin", "PLANNED", "planned"),))
    monkeypatch.setattr(cm, "PLANNED_WITHOUT_PACKAGE", (planned,))

    @hookimpl
    def vz_builtin_drivers() -> list[DriverDeclaration]:
        return [
            DriverDeclaration(
                name="acme_os",
                summary="acme Machines",
                factory="acme_macos:Driver",
                targets=("darwin",),
                options=(
                    Option("vmtool", "path of the VM tool", kind="path", scope="host", default_text="found on PATH"),
                    Option("boot_timeout", "seconds a boot may take", 60.0, "duration", minimum=1, maximum=600),
                ),
                matrix=(MatrixRow("darwin", "darwin", "DEV", "macOS guests"),),
            )
        ]

    registry = DriverRegistry(load_entry_points=False)
    module = types.ModuleType("acme_macos_registration")
    module.vz_builtin_drivers = vz_builtin_drivers  # type: ignore[attr-defined]
    registry.register(module)
    assert cm.lookup("acme_os", "darwin", "darwin", registry=DriverRegistry(load_entry_points=False)) is not None
    macos = [e for e in cm.entries(registry) if e.driver == "acme_os"]
    assert macos == [cm.Entry("acme_os", "darwin", "darwin", "DEV", "macOS guests")]  # the PLANNED row is gone
    assert cm.lookup("acme_os", "darwin", "darwin", registry=registry) == macos[0]
    table = cm.render_options_markdown(registry)
    assert "| `vmtool` | host | path | `found on PATH` | a path | path of the VM tool |" in table
    assert "| `boot_timeout` | project | duration | `60` | a number of seconds in [1, 600] | seconds a boot" in table


def test_lookup() -> None:
    entry = cm.lookup("qemu", "linux", "linux")
    assert entry is not None and entry.status in ("ACTIVE", "DEV")
    assert cm.lookup("qemu", "linux", "windows") is None
    hyperv = cm.lookup("hyperv", "windows", "windows")
    assert hyperv is not None and hyperv.status == "PLANNED"
    assert cm.current_host_os() == "linux"


def test_this_module_names_no_registered_driver() -> None:
    source = Path(cm.__file__).read_text()
    for name in ("fake", "hyperv", "linux_native", "macos_vm", "qemu", "vfkit"):
        assert f'"{name}"' not in source, f"capability_matrix.py names {name}; it belongs in its declaration"
