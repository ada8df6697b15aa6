"""The reference fake driver's one declaration, as the built-in driver "fake" (cheap to import).

Its plugin (``vz-driver-fake``), ``--help``, option checks, docs tables and capability-matrix row are generated
from ``DECLARATION``; the plugin-level fault modes live in ``vz_conformance.fake.plugin``.
"""

from __future__ import annotations

from vz_core.registry import DriverDeclaration, MatrixRow, Option, hookimpl

__all__ = ["DECLARATION", "vz_builtin_drivers"]

DECLARATION = DriverDeclaration(
    name="fake",
    summary="reference in-memory driver: Machines are directories, exec runs host processes",
    factory="vz_conformance.fake:FakeDriver",
    plugin_command=("vz-driver-fake",),
    targets=("linux",),
    options=(
        Option(
            "state_dir",
            "where Machines are kept (VZ_HOME moves the vz state dir)",
            kind="path",
            scope="host",
            default_text="<vz state>/drivers/fake",
        ),
        Option(
            "faults",
            "fault modes to enable (`vz-driver-fake --list-faults` shows them)",
            (),
            "list",
            flag="--fault",
            repeat=True,
        ),
    ),
    matrix=(MatrixRow("linux", "linux", "ACTIVE", "reference driver: directories + host processes, for tests"),),
    adapter="vz_conformance.adapters:FakeAdapter",
    plugin_hooks="vz_conformance.fake.plugin:HOOKS",
)


@hookimpl
def vz_builtin_drivers() -> list[DriverDeclaration]:
    return [DECLARATION]
