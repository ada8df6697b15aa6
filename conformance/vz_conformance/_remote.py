"""The one place the suite touches the host's plugin machinery (trust, launcher, ``RemoteDriver``).

External runs go through exactly what the host uses: the binary is verified against its SHA-256 before every
launch (and a sealed copy of the verified bytes is executed), started under the supervisor, handshaken with
AutoMTLS, and its Info negotiated before any other call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from vz_conformance._providers import WireUnavailableError
from vz_core import Driver
from vz_core.rpc import RemoteDriver
from vz_core.transport import LaunchSpec, PluginLauncher
from vz_core.trust import verify_binary

__all__ = ["channel_of", "frames_only", "launch", "pid_of"]


def _remote(
    executable: Path, sha256: str, args: Sequence[str], env: Mapping[str, str], handshake_timeout: float, name: str
) -> RemoteDriver:
    def prepare() -> LaunchSpec:
        binary = verify_binary(executable, sha256, driver_dir=executable.parent, name=name)
        return LaunchSpec(name, [str(executable), *args], binary=binary, env=dict(env))

    launcher = PluginLauncher(prepare, name=name, handshake_timeout=handshake_timeout)
    return RemoteDriver(launcher, mode="warm", idle_timeout=None, name=name)


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


def channel_of(driver: Driver) -> grpc.aio.Channel:
    conn = driver.connection if isinstance(driver, RemoteDriver) else None
    if conn is None:
        raise WireUnavailableError(f"{driver!r} has no live plugin connection for wire-level frames")
    return conn.channel


def pid_of(driver: Driver) -> int | None:
    conn = driver.connection if isinstance(driver, RemoteDriver) else None
    return conn.pid if conn is not None else None


def frames_only(driver: Driver, name: str) -> RemoteDriver:
    """A second ``RemoteDriver`` on ``driver``'s live plugin channel that never uses the local exec socket:
    ``exec_local`` copies over Exec frames. Closing it leaves the plugin and the channel to ``driver``."""
    return RemoteDriver(channel=channel_of(driver), name=name, local_exec=False)
