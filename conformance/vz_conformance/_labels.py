"""The catalogue's labels, in catalogue order: a module that imports nothing, so the pytest plugin can register
one marker per label without loading the suite."""

from __future__ import annotations

__all__ = ["LABELS"]

LABELS: tuple[str, ...] = (
    "discovery",
    "lifecycle",
    "exec",
    "cancel",
    "pty",
    "malformed",
    "logs",
    "mounts",
    "storage",
    "resources",
    "identity",
    "recreate",
    "egress",
    "network",
    "services",
    "crash",
    "checkpoint",
)
