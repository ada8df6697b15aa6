"""``vz-driver-hyperv``: the hyperv driver served as a plugin, through the shared built-in plugin main (see
``vz_core.registry.DriverDeclaration.serve_plugin``); its command line is generated from the declaration."""

from __future__ import annotations

from vz_drivers.hyperv.registration import DECLARATION

__all__ = ["build_parser", "main"]

main = DECLARATION.serve_plugin
build_parser = DECLARATION.plugin_parser

if __name__ == "__main__":
    main()
