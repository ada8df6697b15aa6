"""What the conformance suite needs to know about hostdir Machines.

``vz-conformance run --plugin PATH --sha256 HEX --adapter vz_driver_hostdir.adapter:ADAPTER``. Only the
conformance run imports this module (it needs ``vz_conformance``, which comes with vz); the plugin never does.
"""

from __future__ import annotations

from pathlib import Path

from vz_conformance import Adapter

__all__ = ["ADAPTER", "HostdirAdapter"]


class HostdirAdapter(Adapter):
    """The POSIX defaults, with hostdir's image, its Machine-local directory and host-visible processes."""

    image = "host"
    local_dir = '"$HOSTDIR_ROOT"'  # the Machine's own directory; it survives Stop/Start, not recreation
    processes_visible_on_host = True  # commands are host processes: cancel checks use psutil directly

    def driver_options(self, state_dir: Path) -> dict[str, object]:
        return {"state_dir": state_dir}

    def plugin_args(self, state_dir: Path) -> list[str]:
        return ["--state-dir", str(state_dir)]


ADAPTER = HostdirAdapter()
