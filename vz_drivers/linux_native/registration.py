"""linux_native's one declaration (cheap to import: no driver code is loaded here).

Its plugin (``vz-driver-linux-native``), ``--help``, option checks, docs tables and capability-matrix rows are
all generated from ``DECLARATION``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from vz_core.options import timeout
from vz_core.registry import DriverDeclaration, MatrixRow, Option, hookimpl

__all__ = ["DECLARATION", "build_parser", "main", "vz_builtin_drivers"]

DECLARATION = DriverDeclaration(
    name="linux_native",
    summary="Linux Machines as runc containers: own namespaces, cgroup limits, overlay root layer",
    factory="vz_drivers.linux_native:LinuxNativeDriver",
    plugin_command=("vz-driver-linux-native",),
    targets=("linux",),
    options=(
        Option(
            "state_dir",
            "where Machines are recorded",
            kind="path",
            scope="host",
            default_text="<vz state>/drivers/linux_native",
        ),
        Option("image_dir", "image store root", kind="path", scope="host", default_text="the shared vz image cache"),
        Option("runc", "path of runc", kind="path", scope="host", default_text="found on PATH"),
        Option("runc_sha256", "pinned SHA-256 of runc", scope="host", default_text="trust on first use"),
        Option("cgroup_parent", "cgroup directory of all Machines", "vz", scope="host"),
        Option("subnet", "IPv4 range for Machines with egress allowed", "10.231.0.0/16", scope="host"),
        timeout("stop_timeout", "seconds between SIGTERM and SIGKILL on Stop", 10.0),
        Option("insecure_registries", "registry hosts reached over plain HTTP (comma-separated)", (), "list"),
        Option(
            "agent_binary",
            "a prebuilt guest agent",
            kind="path",
            scope="host",
            default_text="built from the bundled sources",
        ),
    ),
    matrix=(MatrixRow("linux", "linux", "ACTIVE", "runc + namespaces/cgroups, OCI images"),),
    adapter="vz_conformance.adapters.linux_native:ADAPTER",
)


@hookimpl
def vz_builtin_drivers() -> list[DriverDeclaration]:
    return [DECLARATION]


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``vz-driver-linux-native`` console script: the plugin SDK serves this declaration (its command line is
    generated from the options; the SDK is imported only now, registration stays cheap)."""
    from vz_plugins import serve_declaration

    serve_declaration(DECLARATION, argv)


build_parser = DECLARATION.plugin_parser
