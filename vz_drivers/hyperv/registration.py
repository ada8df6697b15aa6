"""hyperv's one declaration (cheap to import: no driver code is loaded here).

Its plugin (``vz-driver-hyperv = "vz_drivers.hyperv.registration:main"``), ``--help``, option checks, docs tables
and capability-matrix rows are all generated from ``DECLARATION``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from vz_core.options import timeout
from vz_core.registry import DriverDeclaration, MatrixRow, Option, hookimpl

__all__ = ["DECLARATION", "build_parser", "main", "vz_builtin_drivers"]

DECLARATION = DriverDeclaration(
    name="hyperv",
    summary="Linux Machines on Windows as Hyper-V Generation 2 VMs booting the vz guest from a VHDX (DEV)",
    factory="vz_drivers.hyperv:HypervDriver",
    plugin_command=("vz-driver-hyperv",),
    targets=("linux", "windows"),  # windows: PLANNED (RunImage of a windows/* platform is UNSUPPORTED)
    options=(
        Option(
            "state_dir",
            "where Machines are recorded (their VHDX and Hyper-V files too)",
            kind="path",
            scope="host",
            default_text="<vz state>/drivers/hyperv",
        ),
        Option("image_dir", "image store root", kind="path", scope="host", default_text="the shared vz image cache"),
        Option(
            "switch",
            "the Hyper-V virtual switch Machines are connected to (egress allow)",
            "Default Switch",
            scope="host",
        ),
        Option(
            "secure_boot_template",
            "Secure Boot template for a signed boot image (MicrosoftUEFICertificateAuthority); empty: Secure Boot off",
            "",
            scope="host",
        ),
        Option(
            "guest",
            "the vz guest bundle (amd64, format hyperv: its unified kernel image): its directory or an https:// URL "
            "of its manifest.json; verified and cached by digest (vz guest build / the release's bundle)",
            scope="host",
            default_text="none: required",
        ),
        Option("guest_sha256", "SHA-256 the bundle's manifest.json must have", scope="host", default_text="none"),
        Option("powershell", "Windows PowerShell", "powershell.exe", "path", "host"),
        timeout("stop_timeout", "seconds a graceful Stop-VM may take before the VM is turned off", 10.0),
        timeout("boot_timeout", "seconds a boot may take until the guest agent answers", 180.0),
        Option("insecure_registries", "registry hosts reached over plain HTTP (comma-separated)", (), "list"),
    ),
    matrix=(
        MatrixRow(
            "windows",
            "linux",
            "DEV",
            "Hyper-V Gen 2 VM, EFI VHDX guest, hvsocket agent, SMB shares (ro host-enforced); not verified on Windows",
        ),
        MatrixRow("windows", "windows", "PLANNED", "Windows guests: agent as a service, exec over ConPTY"),
    ),
)


@hookimpl
def vz_builtin_drivers() -> list[DriverDeclaration]:
    return [DECLARATION]


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``vz-driver-hyperv`` console script: the plugin SDK serves this declaration (its command line is
    generated from the options; the SDK is imported only now, registration stays cheap)."""
    from vz_plugins import serve_declaration

    serve_declaration(DECLARATION, argv)


build_parser = DECLARATION.plugin_parser
