"""``vz-driver-vfkit``: the vfkit driver served as a plugin, through the shared built-in plugin main (see
``vz_core.registry.DriverDeclaration.serve_plugin``); its command line is generated from the declaration.

Each Machine's vfkit runs detached in its own session: it deliberately outlives the plugin process, and a
relaunched plugin finds it through its record (pid and start time), its REST socket and its agent socket.
"""

from __future__ import annotations

from vz_drivers.vfkit.registration import DECLARATION

__all__ = ["build_parser", "main"]

main = DECLARATION.serve_plugin
build_parser = DECLARATION.plugin_parser

if __name__ == "__main__":
    main()
