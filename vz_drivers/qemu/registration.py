"""qemu's one declaration (cheap to import: no driver code is loaded here).

Its plugin (``vz-driver-qemu``), ``--help``, option checks, docs tables and capability-matrix rows are all
generated from ``DECLARATION``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from vz_core.options import timeout
from vz_core.registry import DriverDeclaration, MatrixRow, Option, hookimpl

__all__ = ["DECLARATION", "build_parser", "main", "vz_builtin_drivers"]

DECLARATION = DriverDeclaration(
    name="qemu",
    summary="Linux Machines as QEMU virtual machines: KVM where usable, otherwise TCG; guest agent as init",
    factory="vz_drivers.qemu:QemuDriver",
    plugin_command=("vz-driver-qemu",),
    targets=("linux",),
    options=(
        Option(
            "state_dir",
            "where Machines are recorded",
            kind="path",
            scope="host",
            default_text="<vz state>/drivers/qemu",
        ),
        Option("image_dir", "image store root", kind="path", scope="host", default_text="the shared vz image cache"),
        Option("qemu", "path of qemu-system-x86_64", kind="path", scope="host", default_text="found on PATH"),
        Option(
            "kernel",
            "guest kernel image",
            kind="path",
            scope="host",
            default_text="the newest /boot/vmlinuz-* with a module tree",
        ),
        Option(
            "modules", "module tree of that kernel", kind="path", scope="host", default_text="/lib/modules/<release>"
        ),
        Option(
            "busybox",
            "statically linked busybox for the initramfs",
            kind="path",
            scope="host",
            default_text="/bin/busybox",
        ),
        Option(
            "accelerator",
            "auto (KVM when it can run the guest, else TCG), kvm (required) or tcg",
            "auto",
            "choice",
            choices=("auto", "kvm", "tcg"),
        ),
        Option(
            "sessions",
            "agent ports per Machine: host processes that can talk to it at once",
            3,
            "int",
            minimum=1,
            maximum=7,
        ),
        timeout("stop_timeout", "seconds between SIGTERM and SIGKILL of the main process on Stop", 10.0),
        timeout("boot_timeout", "seconds a boot may take until the guest agent answers (TCG is slow)", 300.0),
        Option(
            "subnet",
            "IPv4 range of the links of Machines with egress allowed over user networking (version 1)",
            "10.231.0.0/16",
            scope="host",
        ),
        Option("insecure_registries", "registry hosts reached over plain HTTP (comma-separated)", (), "list"),
        Option(
            "agent_binary",
            "a prebuilt guest agent",
            kind="path",
            scope="host",
            default_text="built from the bundled sources",
        ),
    ),
    matrix=(
        MatrixRow("linux", "linux", "ACTIVE", "QEMU + guest agent; KVM where usable, else TCG"),
        MatrixRow("darwin", "linux", "PLANNED", "QEMU with HVF"),
        MatrixRow("windows", "linux", "PLANNED", "QEMU with WHPX"),
    ),
    adapter="vz_conformance.adapters.qemu:ADAPTER",
)


@hookimpl
def vz_builtin_drivers() -> list[DriverDeclaration]:
    return [DECLARATION]


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``vz-driver-qemu`` console script: the plugin SDK serves this declaration (its command line is
    generated from the options; the SDK is imported only now, registration stays cheap)."""
    from vz_plugins import serve_declaration

    serve_declaration(DECLARATION, argv)


build_parser = DECLARATION.plugin_parser
