"""Registers the reference fake driver as the built-in driver "fake" (cheap to import)."""

from __future__ import annotations

from vz_core.registry import BuiltinDriver, hookimpl


@hookimpl
def vz_builtin_drivers() -> list[BuiltinDriver]:
    return [
        BuiltinDriver(
            name="fake",
            summary="reference in-memory driver: Machines are directories, exec runs host processes",
            factory="vz_conformance.fake:FakeDriver",
            plugin_command=("vz-driver-fake",),
            targets=("linux",),
        )
    ]
