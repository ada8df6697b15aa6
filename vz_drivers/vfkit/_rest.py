"""A client for vfkit's RESTful API over its private Unix socket (asyncio, HTTP/1.1, no dependency).

Documented API (crc-org/vfkit ``doc/usage.md``, "RESTful API"; served by ``pkg/rest``):

* ``GET /vm/state`` -> ``{"state": "VirtualMachineStateRunning" | ...Stopped | ...Paused | ...Error |
  ...Starting | ...Pausing | ...Resuming | ...Stopping | ...Saving | ...Restoring, "canStart": bool,
  "canPause": bool, "canResume": bool, "canStop": bool, "canHardStop": bool}``
* ``POST /vm/state`` with ``{"state": "Stop" | "HardStop" | "Pause" | "Resume"}`` -> 2xx (the docs say 200,
  the server answers 202 Accepted); 400 for a body it cannot bind, 500 ``{"error": "..."}`` when the
  Virtualization.framework call fails.
* ``GET /vm/inspect`` -> the VM description. The docs show ``{"cpus", "memory", "devices"}``; vfkit 0.6
  serves its configuration object (``{"vcpus", "memoryBytes", "bootloader", "devices"}``). Both are read.

Errors, mapped once here: ``RestUnreachable`` (no socket, refused, reset: vfkit is not serving) and
``RestError`` (vfkit answered, but not with success). Callers decide what either means for a Machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "STATE_CHANGES",
    "Inspect",
    "RestError",
    "RestUnreachable",
    "VfkitRest",
    "VmState",
]

STATE_CHANGES = ("Stop", "HardStop", "Pause", "Resume")
_MAX_BODY = 1 << 20


class RestUnreachable(Exception):
    """vfkit's REST socket does not answer (missing, refused, closed mid-request, timed out)."""


class RestError(Exception):
    """vfkit answered with a non-success status (``status``) or an unreadable body; ``message`` is vfkit's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"vfkit answered HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class VmState:
    """``GET /vm/state``."""

    state: str
    can_start: bool = False
    can_pause: bool = False
    can_resume: bool = False
    can_stop: bool = False
    can_hard_stop: bool = False

    @property
    def running(self) -> bool:
        return self.state == "VirtualMachineStateRunning"

    @property
    def stopped(self) -> bool:
        return self.state in ("VirtualMachineStateStopped", "VirtualMachineStateError")


@dataclass(frozen=True)
class Inspect:
    """``GET /vm/inspect`` (either spelling): CPUs, memory in bytes, the raw device list."""

    cpus: int
    memory_bytes: int
    devices: tuple[Any, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)


class VfkitRest:
    """One vfkit's REST API at ``socket_path``; every call is one short connection (vfkit keeps no session)."""

    def __init__(self, socket_path: str, *, timeout: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    async def state(self) -> VmState:
        data = await self._json("GET", "/vm/state")
        state = data.get("state")
        if not isinstance(state, str) or not state:
            raise RestError(200, f"GET /vm/state has no state: {data!r:.200}")
        return VmState(
            state=state,
            can_start=bool(data.get("canStart", False)),
            can_pause=bool(data.get("canPause", False)),
            can_resume=bool(data.get("canResume", False)),
            can_stop=bool(data.get("canStop", False)),
            can_hard_stop=bool(data.get("canHardStop", False)),
        )

    async def change_state(self, new_state: str) -> None:
        """``POST /vm/state``; ``ValueError`` for a state vfkit does not document."""
        if new_state not in STATE_CHANGES:
            raise ValueError(f"{new_state!r} is not one of {', '.join(STATE_CHANGES)}")
        await self._request("POST", "/vm/state", {"state": new_state})

    async def inspect(self) -> Inspect:
        data = await self._json("GET", "/vm/inspect")
        cpus = data.get("vcpus", data.get("cpus", 0))
        memory = data.get("memoryBytes", data.get("memory", 0))
        devices = data.get("devices") or ()
        if not isinstance(cpus, int) or not isinstance(memory, int) or not isinstance(devices, list | tuple):
            raise RestError(200, f"GET /vm/inspect is not a VM description: {data!r:.200}")
        return Inspect(cpus=cpus, memory_bytes=memory, devices=tuple(devices), raw=data)

    async def _json(self, method: str, path: str) -> dict[str, Any]:
        status, body = await self._request(method, path, None)
        try:
            data = json.loads(body)
        except ValueError:
            raise RestError(status, f"{method} {path} answered a body that is not JSON: {body[:200]!r}") from None
        if not isinstance(data, dict):
            raise RestError(status, f"{method} {path} answered {type(data).__name__}, not an object")
        return data

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(self.timeout):
                return await self._exchange(method, path, payload)
        except TimeoutError:
            raise RestUnreachable(
                f"vfkit's REST API did not answer {method} {path} within {self.timeout:g} s"
            ) from None

    async def _exchange(self, method: str, path: str, payload: dict[str, Any] | None) -> tuple[int, bytes]:
        body = b"" if payload is None else json.dumps(payload).encode()
        head = [f"{method} {path} HTTP/1.1", "Host: vfkit", "Connection: close", "Accept: application/json"]
        if payload is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError as exc:
            raise RestUnreachable(
                f"cannot connect to vfkit's REST socket {self.socket_path}: {exc.strerror or exc}"
            ) from None
        try:
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            status, headers = await _read_head(reader)
            data = await _read_body(reader, headers)
        except (OSError, asyncio.IncompleteReadError, EOFError) as exc:
            raise RestUnreachable(f"vfkit's REST socket closed during {method} {path}: {exc}") from None
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if not 200 <= status < 300:
            raise RestError(status, _error_text(data))
        return status, data


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    line = await reader.readuntil(b"\r\n")
    parts = line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise RestError(0, f"not an HTTP response: {line[:100]!r}")
    headers: dict[str, str] = {}
    while True:
        line = await reader.readuntil(b"\r\n")
        if line == b"\r\n":
            return int(parts[1]), headers
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise RestError(int(parts[1]), f"malformed header line {line[:100]!r}")
        headers[name.strip().lower()] = value.strip()
        if len(headers) > 100:
            raise RestError(int(parts[1]), "too many response headers")


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                with contextlib.suppress(asyncio.IncompleteReadError):
                    await reader.readuntil(b"\r\n")
                return bytes(out)
            if len(out) + size > _MAX_BODY:
                raise RestError(0, "response body too large")
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) > _MAX_BODY:
            raise RestError(0, f"bad Content-Length {length!r}")
        return await reader.readexactly(int(length))
    data = await reader.read(_MAX_BODY + 1)
    if len(data) > _MAX_BODY:
        raise RestError(0, "response body too large")
    return data


def _error_text(body: bytes) -> str:
    with contextlib.suppress(ValueError):
        data = json.loads(body)
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            return str(data["error"])
    return body.decode(errors="replace").strip()[:500] or "(no body)"
