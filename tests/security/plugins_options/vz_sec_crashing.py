"""Test-only driver whose factory fails with an unexpected exception (a bug, not a refusal), before its plugin
prints its handshake line: what the user sees must be one line, never the plugin's traceback."""

from __future__ import annotations

from vz_core.registry import BuiltinDriver, hookimpl


def crashing_factory() -> None:
    secret_frame_local = {"where": "/srv/plugin/internals"}
    raise KeyError(secret_frame_local["missing"])


@hookimpl
def vz_builtin_drivers() -> list[BuiltinDriver]:
    return [
        BuiltinDriver(
            name="sec_crashing",
            summary="test only: the factory raises KeyError",
            factory="vz_sec_crashing:crashing_factory",
        )
    ]
