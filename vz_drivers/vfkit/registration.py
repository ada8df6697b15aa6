"""vfkit's one declaration (cheap to import: no driver code is loaded here).

Its plugin (``vz-driver-vfkit``), ``--help``, option checks, docs tables and capability-matrix rows are all
generated from ``DECLARATION``. Status DEV: written to vfkit 0.6's documented interface, tested on Linux
against that interface, not yet verified on a Mac (the macOS CI lane turns it ACTIVE).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from vz_core.options import timeout
from vz_core.registry import DriverDeclaration, MatrixRow, Option, hookimpl

__all__ = ["DECLARATION", "build_parser", "main", "vz_builtin_drivers"]

DECLARATION = DriverDeclaration(
    name="vfkit",
    summary="Linux Machines on macOS through vfkit (Virtualization.framework); guest agent over virtio-vsock",
    factory="vz_drivers.vfkit:VfkitDriver",
    plugin_command=("vz-driver-vfkit",),
    targets=("linux",),
    options=(
        Option(
            "state_dir",
            "where Machines are recorded",
            kind="path",
            scope="host",
            default_text="<vz state>/drivers/vfkit",
        ),
        Option("image_dir", "image store root", kind="path", scope="host", default_text="the shared vz image cache"),
        Option(
            "vfkit", "absolute path of vfkit", kind="path", scope="host", absolute=True, default_text="found on PATH"
        ),
        Option(
            "vfkit_sha256",
            "SHA-256 vfkit must have",
            scope="host",
            default_text="recorded on first use in <state>/trust.json",
        ),
        Option(
            "guest",
            "the vz guest bundle (format vfkit, the host's architecture): its directory or an https:// URL of its "
            "manifest.json; verified and cached by digest (vz guest build / the release's bundle)",
            scope="host",
            default_text="none: required",
        ),
        Option("guest_sha256", "SHA-256 the bundle's manifest.json must have", scope="host", default_text="none"),
        Option(
            "rosetta",
            "auto (when installed), on (required) or off: amd64 binaries in arm64 guests",
            "auto",
            "choice",
            choices=("auto", "on", "off"),
        ),
        Option("nested", "nested virtualization (macOS 15+, M3 or newer, vfkit 0.6.2+); on/off", False, "bool", "host"),
        timeout("stop_timeout", "seconds the main process gets after SIGTERM on Stop, then HardStop", 30.0),
        timeout("boot_timeout", "seconds a boot may take until the guest agent reports ready", 120.0),
        Option("insecure_registries", "registry hosts reached over plain HTTP (comma-separated)", (), "list"),
    ),
    matrix=(
        MatrixRow(
            "darwin",
            "linux",
            "DEV",
            "vfkit (Virtualization.framework), vsock agent; not verified on a Mac yet (the macOS CI lane makes it "
            "ACTIVE)",
        ),
    ),
    # The same vz guest image and busybox userland as qemu: the qemu adapter's commands apply unchanged.
    adapter="vz_conformance.adapters.qemu:ADAPTER",
)


@hookimpl
def vz_builtin_drivers() -> list[DriverDeclaration]:
    return [DECLARATION]


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``vz-driver-vfkit`` console script: the plugin SDK serves this declaration (its command line is
    generated from the options; the SDK is imported only now, registration stays cheap)."""
    from vz_plugins import serve_declaration

    serve_declaration(DECLARATION, argv)


build_parser = DECLARATION.plugin_parser
