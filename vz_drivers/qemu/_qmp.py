"""A small asyncio client of the QEMU Machine Protocol (QMP): JSON lines over a Unix socket.

The driver keeps QMP connections short (connect, a command or two, close): a QMP socket serves one client at a
time, and a relaunched plugin or a second vz process must be able to reach the monitor too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any

from vz_core.errors import UnavailableError
from vz_core.platform.files import long_socket_path, open_directory

__all__ = ["QmpClient", "QmpError", "open_unix"]

_SUN_PATH_MAX = 107


class QmpError(Exception):
    """QEMU answered a command with an error (``class`` and ``desc`` from the reply)."""

    def __init__(self, error_class: str, desc: str) -> None:
        super().__init__(f"{error_class}: {desc}")
        self.error_class = error_class
        self.desc = desc


async def open_unix(path: Path, *, limit: int = 1 << 16) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to a Unix socket, also when its path is longer than ``sun_path`` allows."""
    raw = os.fsencode(path)
    if len(raw) <= _SUN_PATH_MAX:
        return await asyncio.open_unix_connection(str(path), limit=limit)
    dirfd = open_directory(path.parent)
    try:
        return await asyncio.open_unix_connection(long_socket_path(dirfd, path.name), limit=limit)
    finally:
        os.close(dirfd)


class QmpClient:
    """One QMP session. Use ``async with await QmpClient.connect(path):`` and ``execute``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, greeting: dict[str, Any]) -> None:
        self._reader = reader
        self._writer = writer
        self.greeting = greeting
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def connect(cls, path: Path, timeout: float = 10.0) -> QmpClient:  # noqa: ASYNC109 - one bounded step
        """Connect, read the greeting and leave capabilities negotiation mode.

        Raises ``UnavailableError`` when nothing answers at ``path`` within ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await open_unix(path)
                try:
                    greeting = json.loads(await reader.readline() or b"null")
                    if not isinstance(greeting, dict) or "QMP" not in greeting:
                        raise UnavailableError(f"the socket {path} does not speak QMP (greeting {greeting!r})")
                    client = cls(reader, writer, greeting)
                    await client.execute("qmp_capabilities")
                except BaseException:
                    writer.close()
                    raise
        except TimeoutError:
            raise UnavailableError(f"the QEMU monitor at {path} did not answer within {timeout} s") from None
        except OSError as exc:
            raise UnavailableError(f"cannot reach the QEMU monitor at {path}: {exc.strerror or exc}") from None
        return client

    async def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run ``command``; return its ``return`` value. ``QmpError`` for an error reply, ``UnavailableError``
        when the connection ends first (``quit`` ends it by design: use ``quit()``)."""
        async with self._lock:
            ident = next(self._ids)
            message: dict[str, Any] = {"execute": command, "id": ident}
            if arguments:
                message["arguments"] = arguments
            try:
                self._writer.write(json.dumps(message).encode() + b"\n")
                await self._writer.drain()
                while True:
                    line = await self._reader.readline()
                    if not line:
                        raise UnavailableError(f"the QEMU monitor closed the connection during {command}")
                    reply = json.loads(line)
                    if "event" in reply:
                        self.events.append(reply)
                        continue
                    if reply.get("id") != ident:
                        continue
                    if "error" in reply:
                        err = reply["error"]
                        raise QmpError(str(err.get("class", "GenericError")), str(err.get("desc", "")))
                    return reply.get("return")
            except (ConnectionError, OSError) as exc:
                raise UnavailableError(f"the QEMU monitor connection failed during {command}: {exc}") from None

    async def quit(self) -> None:
        """Ask QEMU to exit at once (no guest shutdown). Returns when the request was sent and answered or
        the connection closed."""
        with contextlib.suppress(UnavailableError, QmpError):
            await self.execute("quit")

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    async def __aenter__(self) -> QmpClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
