"""Where the Driver under test comes from: built in-process, or launched as a plugin through the supervisor.

A provider makes connected ``Driver`` objects (each ``connect()`` is a new instance; externally a new plugin
process) and opens a raw gRPC channel to the same driver for the wire-level cases (frames a ``Driver`` cannot
express). The same checks run against both.

In-process the raw channel goes to the Runtime Protocol server every Python driver is served with
(``vz_core.rpc.serve_in_process``: the plugin server's servicers on a private Unix socket inside this
process), so malformed frames are judged by that server. Externally it is the channel of the launched plugin;
through the daemon (``DaemonProvider``) the channel of the daemon's proxy of its own plugin, which passes every
frame and status unchanged.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import grpc

from vz_conformance._outcome import WireUnavailableError
from vz_core import Driver
from vz_core.registry import DriverRegistry

__all__ = [
    "DaemonProvider",
    "DriverProvider",
    "ExternalProvider",
    "InProcessProvider",
    "ProviderMode",
    "WireUnavailableError",
    "sha256_of",
]

ProviderMode = Literal["in-process", "external"]


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


class DaemonProvider(ExternalProvider):
    """The external side run through the vz daemon: every ``connect()`` is a ``Drivers.Connect`` call, so the
    plugin under test is the daemon's own warm session of a registered driver (launched by its ``SessionPool``
    from the pinned console script, checksum-verified, supervised, shared with ``vz`` commands of the same
    options), reached through the daemon's byte-for-byte proxy of the Runtime Protocol.

    ``executable``/``sha256``/``args``/``env`` describe that same launch (the installed console script, its
    hash, the options as the daemon passes them): ``connect()`` refuses a daemon whose pinned script or hash
    differ (another installation), and ``derive()`` (the crash cases that launch a changed copy) launches
    from the suite like ``ExternalProvider``. ``environ`` picks the daemon (``VZ_HOME``, ``VZ_DAEMON_SOCKET``;
    default ``os.environ``); one is started when none runs unless ``VZ_DAEMON_AUTOSTART=0``.
    """

    def __init__(
        self,
        driver: str,
        executable: str | os.PathLike[str],
        sha256: str,
        *,
        options: Mapping[str, object] | None = None,
        args: Sequence[str] = (),
        handshake_timeout: float = 15.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.options = {k: str(v) if isinstance(v, os.PathLike) else v for k, v in (options or {}).items()}
        env = {}
        if self.options:
            from vz_core.registry import OPTIONS_ENV

            env[OPTIONS_ENV] = json.dumps(self.options)
        super().__init__(executable, sha256, args=args, env=env, handshake_timeout=handshake_timeout, name=driver)
        self.environ = None if environ is None else dict(environ)
        self.sessions: list[dict[str, Any]] = []
        """What the daemon said about each session it opened (socket, plugin pid, script, hash, launches)."""

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "source": "daemon", "options": sorted(self.options)}

    async def connect(self) -> Driver:
        from vz_conformance import _remote

        driver = await _remote.through_daemon(self.name, self.options, environ=self.environ)
        session = driver.session
        if session.get("script") != str(self.executable) or session.get("sha256") != self.sha256:
            await driver.close()
            raise RuntimeError(
                f"the vz daemon's plugin of {self.name!r} is {session.get('script')} (SHA-256 "
                f"{session.get('sha256')}), not this installation's {self.executable} ({self.sha256}): it runs "
                "another vz; stop it with `vz daemon stop` (the next run starts one of this vz)"
            )
        self.sessions.append(session)
        return driver
