"""macos_vm's one declaration (cheap to import: no driver code is loaded here).

Its plugin (``vz-driver-macos-vm``), ``--help``, option checks, docs tables and capability-matrix rows are all
generated from ``DECLARATION``. macOS guests run only on Apple hardware, so the matrix has one row.
"""

from __future__ import annotations

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
            "<vz state>/drivers/macos_vm",
            "path",
            "host",
        ),
        Option("image_dir", "unused by macos_vm (bases are restore images, not OCI images)", "none", "path", "host"),
        Option("insecure_registries", "unused by macos_vm", "none", "list", "host"),
        Option("agent_binary", "the vz guest agent built for darwin/arm64 (Mach-O)", "none: required", "path", "host"),
        Option(
            "bases_file",
            "a base descriptor to use instead of the one vz ships (same schema)",
            "the shipped one",
            "path",
            "host",
        ),
        Option(
            "allow_unpinned",
            "allow restore images not pinned by SHA-256 (ipsw:PATH, macos:latest)",
            "false",
            "bool",
            "host",
        ),
        Option("allow_unpinned_in_ci", "also allow them when CI=true", "false", "bool", "host"),
        Option("disk_size", "bytes of a base's system disk (sparse; Machines clone it)", "68719476736", "int", "host"),
        Option(
            "python",
            "the interpreter that runs the VM helper (signed with the virtualization entitlement)",
            "the plugin's own",
            "path",
            "host",
        ),
        Option("stop_mode", "shutdown (the guest powers off) or save (the VM state is saved; macOS 14+)", "shutdown"),
        Option("stop_timeout", "seconds the guest gets to power off before the VM is stopped", "30", "float"),
        Option("boot_timeout", "seconds a boot may take until the guest agent answers", "300", "float"),
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


# The ``vz-driver-macos-vm`` console script and its parser: the shared built-in plugin main, generated
# from the declaration (``vz_core.registry.DriverDeclaration.serve_plugin``).
main = DECLARATION.serve_plugin
build_parser = DECLARATION.plugin_parser
