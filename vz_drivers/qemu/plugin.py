"""``vz-driver-qemu``: the qemu driver served as a Runtime Protocol plugin.

Usage: ``vz-driver-qemu [--state-dir DIR] [--image-dir DIR] [--option KEY=VALUE ...]`` (launched by a host,
never by hand). Stdout belongs to the handshake line; diagnostics go to stderr.

Each Machine's QEMU runs detached in its own session: it deliberately outlives the plugin process (runtime state
lives in the backend), and a relaunched plugin finds it through its state directory, its QMP socket and its
guest agent sockets.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from vz_core import Driver

__all__ = ["build_parser", "main"]

PROG = "vz-driver-qemu"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The vz qemu driver as a Runtime Protocol plugin (started by a host, not by hand).",
    )
    parser.add_argument("--state-dir", metavar="DIR", default=None, help="where Machines are recorded")
    parser.add_argument("--image-dir", metavar="DIR", default=None, help="image store root")
    parser.add_argument(
        "--option",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a driver option (qemu, kernel, modules, busybox, accelerator, sessions, stop_timeout, boot_timeout, "
        "insecure_registries, agent_binary); repeatable",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Parse the arguments and serve ``QemuDriver`` through the plugin SDK."""
    parser = build_parser()
    args = parser.parse_args(argv)
    options: dict[str, str] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--option {item!r} must look like KEY=VALUE")
        options[key.replace("-", "_")] = value
    if args.state_dir:
        options["state_dir"] = args.state_dir
    if args.image_dir:
        options["image_dir"] = args.image_dir

    from vz_plugins import serve

    def build() -> Driver:
        # Imported only after the plugin cookie and versions were checked (fast handshake, clean refusal).
        from vz_drivers.qemu._driver import QemuDriver

        return QemuDriver(**options)

    serve(build)


if __name__ == "__main__":
    main()
