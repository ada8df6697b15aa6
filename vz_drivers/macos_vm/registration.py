"""macos_vm's one declaration (cheap to import: no driver code is loaded here).

Its plugin (``vz-driver-macos-vm``), ``--help``, option checks, docs tables and capability-matrix rows are all
generated from ``DECLARATION``. macOS guests run only on Apple hardware, so the matrix has one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from vz_core.options import timeout
from vz_core.registry import DriverDeclaration, MatrixRow, Option, hookimpl

__all__ = ["DECLARATION", "build_parser", "main", "vz_builtin_drivers"]

DECLARATION = DriverDeclaration(
    name="macos_vm",
    summary="macOS Machines on Apple silicon through Virtualization.framework: APFS clones of pinned bases",
    factory="vz_drivers.macos_vm:MacosVmDriver",
    plugin_command=("vz-driver-macos-vm",),
    targets=("darwin",),
    options=(
        Option(
            "state_dir",
            "where bases and Machines are kept (one APFS volume)",
            kind="path",
            scope="host",
            default_text="<vz state>/drivers/macos_vm",
        ),
        Option("image_dir", "unused by macos_vm (bases are restore images, not OCI images)", kind="path", scope="host"),
        Option("insecure_registries", "unused by macos_vm", (), "list", "host"),
        Option(
            "agent_binary",
            "the vz guest agent built for darwin/arm64 (Mach-O)",
            kind="path",
            scope="host",
            default_text="none: required",
        ),
        Option(
            "bases_file",
            "a base descriptor to use instead of the one vz ships (same schema)",
            kind="path",
            scope="host",
            default_text="the shipped one",
        ),
        Option(
            "allow_unpinned",
            "allow restore images not pinned by SHA-256 (ipsw:PATH, macos:latest)",
            False,
            "bool",
            "host",
        ),
        Option("allow_unpinned_in_ci", "also allow them when CI=true", False, "bool", "host"),
        Option(
            "disk_size",
            "bytes of a base's system disk (sparse; Machines clone it; at least a macOS install)",
            64 * 1024**3,
            "size",
            "host",
            minimum=32 * 1024**3,
            maximum=16 * 1024**4,
        ),
        Option(
            "python",
            "the interpreter that runs the VM helper (signed with the virtualization entitlement)",
            kind="path",
            scope="host",
            default_text="the plugin's own",
        ),
        Option(
            "stop_mode",
            "shutdown (the guest powers off) or save (the VM state is saved; macOS 14+)",
            "shutdown",
            "choice",
            choices=("shutdown", "save"),
        ),
        timeout("stop_timeout", "seconds the guest gets to power off before the VM is stopped", 30.0),
        timeout("boot_timeout", "seconds a boot may take until the guest agent answers", 300.0),
    ),
    matrix=(
        MatrixRow(
            "darwin", "darwin", "DEV", "Virtualization.framework macOS guests (Apple silicon); not verified on a Mac"
        ),
    ),
    adapter="vz_conformance.adapters.macos_vm:ADAPTER",
)


@hookimpl
def vz_builtin_drivers() -> list[DriverDeclaration]:
    return [DECLARATION]


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``vz-driver-macos-vm`` console script: the plugin SDK serves this declaration (its command line is
    generated from the options; the SDK is imported only now, registration stays cheap)."""
    from vz_plugins import serve_declaration

    serve_declaration(DECLARATION, argv)


build_parser = DECLARATION.plugin_parser
