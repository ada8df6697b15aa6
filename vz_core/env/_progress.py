"""How the Environment layer reports what it is doing (the CLI renders it as rich progress, lines or JSON)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Progress"]


class Progress:
    """Receives progress from Environment operations. This base class shows nothing.

    ``step`` wraps a long step (image preparation, boot, stop, delete); ``note`` is a one-line remark
    (waiting for a lock, an interrupted operation found). ``fields`` are JSON values naming what the step is
    about (``environment``, ``machine``, ``machine_id`` ...); they become the stable ``--json`` events.
    """

    @contextmanager
    def step(self, action: str, message: str, **fields: Any) -> Iterator[None]:
        yield

    def note(self, kind: str, message: str, **fields: Any) -> None:
        return None
