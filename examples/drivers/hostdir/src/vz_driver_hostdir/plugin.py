"""``vz-driver-hostdir [--state-dir DIR]``: the hostdir driver served as a Runtime Protocol plugin.

A host (vz, or any go-plugin host of the Runtime Protocol) starts this program; run by hand, it says that it is
a plugin and exits 1. Stdout belongs to the handshake line; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from vz_plugins import serve

from vz_driver_hostdir._driver import HostdirDriver

__all__ = ["default_state_dir", "main"]


def default_state_dir() -> Path:
    """``$VZ_HOME/drivers/hostdir`` when ``VZ_HOME`` is set (vz's state directory: the daemon and `vz` pass it to
    their plugins; ``drivers/`` is where vz keeps drivers' own state, private to the user), else
    ``$XDG_STATE_HOME/vz-driver-hostdir``, else ``~/.local/state/vz-driver-hostdir``."""
    home = os.environ.get("VZ_HOME")
    if home:
        return Path(home) / "drivers" / "hostdir"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "vz-driver-hostdir"


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Parse the command line, then serve the driver until the host stops the plugin (never returns)."""
    parser = argparse.ArgumentParser(
        prog="vz-driver-hostdir",
        description="The hostdir vz driver as a Runtime Protocol plugin (started by a host, not by hand).",
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="where Machines are kept")
    args = parser.parse_args(argv)
    state_dir: Path = args.state_dir or default_state_dir()
    # A factory, not a driver: serve() builds it only after checking the host's cookie and protocol versions.
    serve(lambda: HostdirDriver(state_dir))


if __name__ == "__main__":
    main()
