"""Where vz keeps its state and caches. ``VZ_HOME`` overrides everything (tests set it)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "state_dir"]


def state_dir() -> Path:
    """The state directory: ``$VZ_HOME``, else ``$XDG_STATE_HOME/vz``, else ``~/.local/state/vz``."""
    home = os.environ.get("VZ_HOME")
    if home:
        return Path(home)
    xdg = os.environ.get("XDG_STATE_HOME")
    return Path(xdg) / "vz" if xdg else Path.home() / ".local" / "state" / "vz"


def cache_dir() -> Path:
    """Content-addressed caches (images, built artifacts): ``$VZ_HOME/cache``, else the XDG cache dir."""
    home = os.environ.get("VZ_HOME")
    if home:
        return Path(home) / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "vz" if xdg else Path.home() / ".cache" / "vz"
