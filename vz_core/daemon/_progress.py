"""Progress of an Environment operation, sent to the client as ``progress`` messages.

Each message is exactly the JSON line `vz <command> --json` printed for it before the daemon existed, minus
``"command"`` (the client knows which command it runs):

* a step: ``{"event": "step", "action": A, "status": "started" | "succeeded" | "failed", "message": M,
  "seconds": S (when finished), **fields}``;
* a note: ``{"event": "note", "kind": K, "message": M, **fields}``; the plan: ``{"event": "plan", "kind":
  "plan", "message": M, "plan": {...}, **fields}``.

The Environment layer reports synchronously; messages are queued in order and a pump awaits the connection
(``flush`` sends everything queued before the call's result). Each message is redacted with the call's
secrets when it is sent (secrets learned meanwhile apply too).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from vz_core.env import Progress
from vz_core.redact import Redactor

__all__ = ["CallProgress", "StepListener"]

StepListener = Callable[[dict[str, Any]], None]
"""Called with every message, in order, before it is queued (the service derives events from them)."""


class CallProgress(Progress):
    """A ``vz_core.env.Progress`` that forwards every step and note through ``send`` (``call.progress``)."""

    def __init__(
        self,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        redactor: Redactor,
        listener: StepListener | None = None,
    ) -> None:
        self._send = send
        self.redactor = redactor
        self._listener = listener
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None

    def start(self) -> None:
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._run(), name="vz-call-progress")

    async def _run(self) -> None:
        while True:
            message = await self._queue.get()
            if message is None:
                return
            data = self.redactor.redact_data(message)
            if self._failed is not None:
                continue  # the client is gone: the operation carries on (or is cancelled by the service)
            try:
                await self._send(data)
            except Exception as exc:
                self._failed = exc

    def _emit(self, message: dict[str, Any]) -> None:
        if self._listener is not None:
            with suppress(Exception):  # accounting never breaks the operation
                self._listener(message)
        self._queue.put_nowait(message)
        if self._pump is None:
            with suppress(RuntimeError):  # no running loop: queued until start()
                self.start()

    @contextmanager
    def step(self, action: str, message: str, **fields: Any) -> Iterator[None]:
        started = time.monotonic()
        self._emit({"event": "step", "action": action, "status": "started", "message": message, **fields})
        try:
            yield
        except BaseException:
            seconds = round(time.monotonic() - started, 3)
            self._emit(
                {
                    "event": "step",
                    "action": action,
                    "status": "failed",
                    "message": message,
                    "seconds": seconds,
                    **fields,
                }
            )
            raise
        seconds = round(time.monotonic() - started, 3)
        self._emit(
            {"event": "step", "action": action, "status": "succeeded", "message": message, "seconds": seconds, **fields}
        )

    def note(self, kind: str, message: str, **fields: Any) -> None:
        self._emit({"event": kind if kind == "plan" else "note", "kind": kind, "message": message, **fields})

    async def flush(self) -> None:
        """Send everything queued, then stop the pump (call once, before the result)."""
        self._queue.put_nowait(None)
        if self._pump is not None:
            await asyncio.shield(self._pump)

    def abandon(self) -> None:
        """Stop sending (the call is over without a result)."""
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
