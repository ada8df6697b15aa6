"""Where the Driver under test comes from: built in-process, or launched as a plugin through the supervisor.

A provider makes connected ``Driver`` objects (each ``connect()`` is a new instance; externally a new plugin
process) and opens a raw gRPC channel to the same driver for the wire-level cases (frames a ``Driver`` cannot
express). The same checks run against both.

In-process the raw channel goes to the Runtime Protocol server every Python driver is served with
(``vz_core.rpc.serve_in_process``: the plugin server's servicers on a private Unix socket inside this
process), so malformed frames are judged by that server. Externally it is the channel of the launched plugin.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import os
import shutil
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import grpc

from vz_core import Driver
from vz_core.registry import DriverRegistry

__all__ = [
    "DriverProvider",
    "ExternalProvider",
    "InProcessProvider",
    "ProviderMode",
    "WireUnavailableError",
    "sha256_of",
]

ProviderMode = Literal["in-process", "external"]


class WireUnavailableError(RuntimeError):
    """The raw gRPC channel needed by a wire-level case cannot be opened in this setup."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class DriverProvider(abc.ABC):
    """Makes Driver instances for one run. Providers are cheap to build and hold no connection themselves."""

    mode: ClassVar[ProviderMode]

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """What the report records about the driver source (name, plugin path, checksum, arguments)."""

    @abc.abstractmethod
    async def connect(self) -> Driver:
        """A new, connected Driver instance (externally: a freshly launched, handshaken plugin)."""

    @abc.abstractmethod
    def wire(self, driver: Driver) -> contextlib.AbstractAsyncContextManager[grpc.aio.Channel]:
        """A raw channel speaking ``devsy.runtime.v1.RuntimeDriver`` to ``driver`` (raises WireUnavailableError)."""

    def plugin_pid(self, driver: Driver) -> int | None:
        """The process id of the plugin serving ``driver`` (external providers only)."""
        return None

    @abc.abstractmethod
    def frames_only(self, driver: Driver) -> contextlib.AbstractAsyncContextManager[Driver]:
        """``driver`` seen through a ``RemoteDriver(local_exec=False)``: its ``exec_local`` copies over Exec
        frames even when a local exec socket is advertised (the fallback every host has)."""


class InProcessProvider(DriverProvider):
    """A driver object built in this process, from the registry by name or from a factory."""

    mode = "in-process"

    def __init__(
        self,
        name: str | None = None,
        *,
        factory: Callable[..., Driver] | None = None,
        options: Mapping[str, object] | None = None,
        registry: DriverRegistry | None = None,
    ) -> None:
        if (name is None) == (factory is None):
            raise ValueError("give exactly one of a registered driver name or a factory")
        self.name = name or getattr(factory, "__qualname__", "factory")
        self.options = dict(options or {})
        if factory is None:
            assert name is not None
            self._factory: Callable[..., Driver] = (registry or DriverRegistry()).get(name).load()
        else:
            self._factory = factory

    def describe(self) -> dict[str, Any]:
        return {"source": "registry", "name": self.name, "options": sorted(self.options)}

    async def connect(self) -> Driver:
        return self._factory(**self.options)

    def wire(self, driver: Driver) -> contextlib.AbstractAsyncContextManager[grpc.aio.Channel]:
        from vz_core.rpc import serve_in_process  # the server half is loaded only by the wire-level cases

        return serve_in_process(driver)

    @contextlib.asynccontextmanager
    async def frames_only(self, driver: Driver) -> AsyncIterator[Driver]:
        from vz_core.rpc import connect_in_process

        async with connect_in_process(driver, local_exec=False, name=self.name) as remote:
            remote.local_exec = False
            yield remote


class ExternalProvider(DriverProvider):
    """A plugin binary verified by checksum and launched through the real supervisor for every connection."""

    mode = "external"

    def __init__(
        self,
        executable: str | os.PathLike[str],
        sha256: str,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        handshake_timeout: float = 15.0,
        name: str = "",
    ) -> None:
        path = Path(executable)
        if not path.is_absolute():
            found = shutil.which(str(executable))
            if found is None:
                raise FileNotFoundError(f"plugin {executable!r} is not an absolute path and is not on PATH")
            path = Path(found)
        self.executable = path
        self.sha256 = sha256.lower()
        self.args = tuple(args)
        self.env = dict(env or {})
        self.handshake_timeout = handshake_timeout
        self.name = name or path.name

    def describe(self) -> dict[str, Any]:
        return {
            "source": "plugin",
            "name": self.name,
            "plugin_path": str(self.executable),
            "sha256": self.sha256,
            "args": list(self.args),
        }

    def derive(
        self,
        *,
        executable: Path | None = None,
        sha256: str | None = None,
        args: Sequence[str] | None = None,
        handshake_timeout: float | None = None,
    ) -> ExternalProvider:
        """The same launch with some parts replaced (a copied binary, other arguments, a shorter timeout)."""
        return ExternalProvider(
            executable or self.executable,
            sha256 or self.sha256,
            args=self.args if args is None else args,
            env=self.env,
            handshake_timeout=self.handshake_timeout if handshake_timeout is None else handshake_timeout,
            name=self.name,
        )

    async def connect(self) -> Driver:
        from vz_conformance import _remote

        return await _remote.launch(
            self.executable,
            self.sha256,
            args=self.args,
            env=self.env,
            handshake_timeout=self.handshake_timeout,
            name=self.name,
        )

    @contextlib.asynccontextmanager
    async def wire(self, driver: Driver) -> AsyncIterator[grpc.aio.Channel]:
        from vz_conformance import _remote

        await driver.info()  # make sure the plugin is up (a crashed one is relaunched by the client)
        yield _remote.channel_of(driver)

    def plugin_pid(self, driver: Driver) -> int | None:
        from vz_conformance import _remote

        return _remote.pid_of(driver)

    @contextlib.asynccontextmanager
    async def frames_only(self, driver: Driver) -> AsyncIterator[Driver]:
        from vz_conformance import _remote

        await driver.info()  # make sure the plugin is up (a crashed one is relaunched by the client)
        remote = _remote.frames_only(driver, self.name)
        try:
            yield remote
        finally:
            await remote.close()
