"""The one place the suite touches the host's plugin machinery (trust, launcher, ``RemoteDriver``, daemon).

External runs go through exactly what the host uses: the binary is verified against its SHA-256 before every
launch (and a sealed copy of the verified bytes is executed), started under the supervisor, handshaken with
AutoMTLS, and its Info negotiated before any other call.

Through the daemon (``through_daemon``), the plugin is the vz daemon's own warm session of the driver: the
daemon's ``SessionPool`` launched it (its pinned script verified), and ``Drivers.Connect`` opens a socket
where the daemon passes the Runtime Protocol to that plugin byte for byte. The suite's ``RemoteDriver`` speaks
to that socket; the daemon's connection stays open for as long as the driver object lives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from vz_conformance._outcome import WireUnavailableError
from vz_core import Driver
from vz_core.rpc import RemoteDriver
from vz_core.transport import LaunchSpec, PluginLauncher
from vz_core.trust import verify_binary

__all__ = ["DaemonDriver", "channel_of", "frames_only", "launch", "pid_of", "through_daemon"]

DRIVER_CONNECT = "Drivers.Connect"


def _remote(
    executable: Path, sha256: str, args: Sequence[str], env: Mapping[str, str], handshake_timeout: float, name: str
) -> RemoteDriver:
    def prepare() -> LaunchSpec:
        binary = verify_binary(executable, sha256, driver_dir=executable.parent, name=name)
        return LaunchSpec(name, [str(executable), *args], binary=binary, env=dict(env))

    launcher = PluginLauncher(prepare, name=name, handshake_timeout=handshake_timeout)
    # wide_frames=False: the suite judges the protocol's Exec frames exactly as a host that is not vz gets them.
    return RemoteDriver(launcher, mode="warm", idle_timeout=None, name=name, wide_frames=False)


async def launch(
    executable: Path,
    sha256: str,
    *,
    args: Sequence[str],
    env: Mapping[str, str],
    handshake_timeout: float,
    name: str,
) -> Driver:
    """Verify, launch, handshake and negotiate now (so launch failures surface here, not at a later call)."""
    driver = _remote(executable, sha256, args, env, handshake_timeout, name)
    try:
        await driver.info()
    except BaseException:
        await driver.close()
        raise
    return driver


class DaemonDriver(RemoteDriver):
    """A ``RemoteDriver`` on the vz daemon's proxy of its warm plugin session (``through_daemon``).

    ``session`` is what the daemon said about it (``socket``, ``pid``, ``name``, ``script``, ``sha256``,
    ``args``, ``options``, ``launches``); ``plugin_pid`` the plugin's pid at connect. ``close()`` closes the
    channel and the daemon connection (the daemon stops serving the socket; its plugin stays warm)."""

    def __init__(self, channel: grpc.aio.Channel, connection: Any, session: Mapping[str, Any], name: str) -> None:
        super().__init__(channel=channel, name=name, wide_frames=False)  # frames as sent, like launch()
        self.proxy_channel = channel
        self.daemon_connection = connection
        self.session = dict(session)
        self.plugin_pid: int | None = session.get("pid") if isinstance(session.get("pid"), int) else None

    def __repr__(self) -> str:
        return f"DaemonDriver(name={self.name!r}, plugin_pid={self.plugin_pid})"

    async def close(self) -> None:
        await super().close()
        with contextlib.suppress(Exception):
            await self.proxy_channel.close(None)
        await asyncio.to_thread(self.daemon_connection.close)


def _open_session(
    name: str, options: Mapping[str, Any], environ: Mapping[str, str] | None
) -> tuple[Any, dict[str, Any]]:
    from vz_core.daemon import DaemonError, connect

    connection = connect(environ=environ)
    try:
        connection.call(DRIVER_CONNECT, {"driver": name, "options": dict(options)})
        message = connection.receive()
        if isinstance(message, dict) and "error" in message:
            error = message["error"]
            raise DaemonError.from_wire(error if isinstance(error, dict) else {})
        session = message.get("progress", {}).get("driver") if isinstance(message, dict) else None
        if not isinstance(session, dict) or not isinstance(session.get("socket"), str):
            raise DaemonError(
                f"the vz daemon (pid {connection.pid}) answered {DRIVER_CONNECT} with {message!r}, not a driver "
                "session: it runs an older vz; stop it with `vz daemon stop`"
            )
    except BaseException:
        connection.close()
        raise
    return connection, session


async def through_daemon(
    name: str, options: Mapping[str, Any], *, environ: Mapping[str, str] | None = None
) -> DaemonDriver:
    """The daemon's warm plugin session of driver ``name`` with ``options`` (JSON values), as a connected
    ``DaemonDriver``; the daemon is started when none runs (unless ``VZ_DAEMON_AUTOSTART=0``). Info is
    negotiated now, so a failure surfaces here."""
    from vz_core.rpc import CHANNEL_OPTIONS

    connection, session = await asyncio.to_thread(_open_session, name, options, environ)
    channel = grpc.aio.insecure_channel(f"unix:{session['socket']}", options=CHANNEL_OPTIONS)
    driver = DaemonDriver(channel, connection, session, name)
    try:
        await driver.info()
    except BaseException:
        await driver.close()
        raise
    return driver


def channel_of(driver: Driver) -> grpc.aio.Channel:
    if isinstance(driver, DaemonDriver):
        return driver.proxy_channel
    conn = driver.connection if isinstance(driver, RemoteDriver) else None
    if conn is None:
        raise WireUnavailableError(f"{driver!r} has no live plugin connection for wire-level frames")
    return conn.channel


def pid_of(driver: Driver) -> int | None:
    if isinstance(driver, DaemonDriver):
        return driver.plugin_pid
    conn = driver.connection if isinstance(driver, RemoteDriver) else None
    return conn.pid if conn is not None else None


def frames_only(driver: Driver, name: str) -> RemoteDriver:
    """A second ``RemoteDriver`` on ``driver``'s live plugin channel that never uses the local exec socket:
    ``exec_local`` copies over Exec frames. Closing it leaves the plugin and the channel to ``driver``."""
    return RemoteDriver(channel=channel_of(driver), name=name, local_exec=False)
