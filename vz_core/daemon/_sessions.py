"""Driver sessions of the vz daemon: every driver a supervised, checksum-verified plugin, kept warm and shared.

``SessionPool`` is what ``vz_core.env.acquire_driver`` returns drivers from inside the daemon: ``start()`` makes it
the daemon's ``running_pool()``, which every command's ``Context.drivers`` carries (``vz_core.daemon._calls``);
``aclose()`` stops every plugin and withdraws it.

One door for every driver. A built-in has no manifest file: at ``start()`` the pool builds the equivalent
record for its installed console script (``vz-driver-<name>``, i.e. ``<registration module>:main``) with
``vz_core.drivers.pin_builtin``: SHA-256 pinned then (and checked against the hash the installer wrote in the
distribution's RECORD when there is one; the script's ``#!`` interpreter must be the daemon's). Every launch,
built-in or external, then goes: ``vz_core.trust.verify_binary`` (the file is hashed again through one open
descriptor; a changed script is refused with a message naming it, before anything runs) → the sealed copy of
exactly those bytes is executed under the supervisor (``PR_SET_PDEATHSIG``: plugins die with the daemon, even
a SIGKILLed one) → go-plugin handshake with AutoMTLS → health check → negotiation (Info with the recreate
opt-in, validated; Extensions). What the checksums cover: the console script (which names the interpreter and
the registration module it imports) and the registration module's source file, both pinned at start and
checked at every launch. The interpreter and the rest of site-packages (the driver's own code included) are
not hashed: they are the code the daemon itself runs from (its fingerprint names ``sys.executable``), so a
hash of them taken by that code would prove nothing more than running it does. A built-in declared without
a console script (a Python driver package that declares only its factory) gets one written by the pool at
start (``<VZ_HOME>/daemon/launchers/vz-driver-<name>``: this interpreter running the shared plugin main for
that declaration), pinned and verified the same way.

Sharing. One warm ``vz_core.rpc.RemoteDriver`` per (driver name, effective options) (the options after the
host configuration is merged in: two Machines with the same options share a plugin); concurrent calls share its
connection. ``acquire_driver`` hands out ``SharedDriver`` handles whose ``close()`` leaves the session running.

Lifecycle. A plugin with no call for ``VZ_DAEMON_PLUGIN_IDLE`` seconds (default 300; 0 = never) is stopped;
the next call launches it again. A plugin that dies (a crash, a kill) is counted and logged; the call that was
running fails with ``UnavailableError`` (the plugin's redacted stderr tail attached) and the next call
launches a new one, which finds its Machines where drivers keep them: on disk (records in their state
directories, found by Find). Machines never depend on a plugin process staying alive.

External drivers (``vz driver add``) take the same path with their manifest's checksum; a driver added again
gets a new session on the new record (the old plugin is stopped once its calls end).

Secrets. The pool has one redactor (``PoolRedactor``) for every plugin's stderr and error texts; it learns
every secret of every Environment it serves (the redactor given to ``acquire_driver``, merged again before
every call, short secrets masked as whole tokens) and the environment values sent to plugins (from 4
characters).

States (``status()``): ``"warm"`` a plugin process runs and a call is in flight; ``"idle"`` it runs with no
call in flight (it is stopped after the idle time); ``"stopping"`` it is being shut down and its process has not
exited yet; ``"stopped"`` no plugin process runs; ``"refused"`` a
built-in whose script could not be pinned (``"error"`` says why; launching it fails with that message).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vz_core._driver import Driver
from vz_core.errors import DriverError, NotFoundError, TrustError, UnsupportedError, UserError, VzError
from vz_core.redact import MIN_SECRET_LENGTH, Redactor
from vz_core.services import ServiceSpec, ServiceState
from vz_core.transport import PluginLauncher

if TYPE_CHECKING:
    from vz_core._types import (
        DriverInfo,
        ExecEvent,
        ExecExit,
        ExecSpec,
        Extensions,
        MachineDetails,
        RunImageRequest,
        TerminalEvent,
        TerminalInput,
        TerminalSpec,
    )
    from vz_core.drivers import HostConfig, ManifestStore, ResolvedDriver
    from vz_core.env import DriverFacts
    from vz_core.registry import DriverRegistry
    from vz_core.rpc import RemoteDriver
    from vz_core.transport import LaunchSpec, PluginConnection

__all__ = [
    "DEFAULT_PLUGIN_IDLE",
    "DRIVER_CONNECT",
    "ENV_PLUGIN_IDLE",
    "DriverProxy",
    "PluginSession",
    "PoolRedactor",
    "SessionPool",
    "SharedDriver",
    "plugin_idle_seconds",
    "running_pool",
    "serve_driver_connect",
]

log = logging.getLogger("vz.daemon.sessions")

ENV_PLUGIN_IDLE = "VZ_DAEMON_PLUGIN_IDLE"
DEFAULT_PLUGIN_IDLE = 300.0


def plugin_idle_seconds(raw: str | None = None) -> float | None:
    """Seconds a warm plugin may stay without calls (``VZ_DAEMON_PLUGIN_IDLE``, default 300); None = never
    stopped (the value 0). ``UserError`` naming the variable for anything else than a number >= 0."""
    text = (os.environ.get(ENV_PLUGIN_IDLE, "") if raw is None else raw).strip()
    if not text:
        return DEFAULT_PLUGIN_IDLE
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{ENV_PLUGIN_IDLE}={text!r} must be a number of seconds >= 0 (0: never stop idle plugins)")
    return None if value == 0 else value


def _identity(resolved: ResolvedDriver) -> str:
    """What makes an external driver's record this one: a re-added manifest is another session."""
    record = resolved.external
    if record is None:
        return ""
    return json.dumps([record.manifest_path, record.added_at, record.manifest.model_dump(mode="json")], sort_keys=True)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _verified_files(resolved: ResolvedDriver) -> list[str]:
    """The files a launch of ``resolved`` verifies (a pinned script and its registration module, or an external
    driver's binary); [] for what is not launched from a verified file."""
    if resolved.pinned is not None:
        return [str(resolved.pinned.script), *([resolved.pinned.module_file] if resolved.pinned.module_file else [])]
    if resolved.external is not None:
        with contextlib.suppress(Exception):
            record = resolved.external
            return [str(record.manifest.binary_path(record.driver_dir))]
    return []


def _stamp(paths: list[str]) -> tuple[tuple[int, int, int, int] | None, ...]:
    """What changes whenever a file's bytes change (a write always moves ctime; a replacement moves the inode)."""
    stamps: list[tuple[int, int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamps)


class PoolRedactor(Redactor):
    """The pool's redactor: declared secrets (``add_secret``, ``merge``) are masked even when short (as whole
    tokens); other values (the environment values ``RemoteDriver`` registers, ``add``) only from
    ``MIN_SECRET_LENGTH`` characters, so that a "1" in some Environment's variables does not mask every "1" in
    every error."""

    def __init__(self) -> None:
        self._declared = False
        super().__init__(short_tokens=True)

    def add(self, *secrets: str | bytes) -> None:
        if not self._declared:
            secrets = tuple(s for s in secrets if len(s.encode() if isinstance(s, str) else s) >= MIN_SECRET_LENGTH)
        if secrets:
            super().add(*secrets)

    def add_secret(self, *secrets: str | bytes) -> None:
        """Register declared secrets (short ones too, masked as whole tokens)."""
        self._declared = True
        try:
            super().add(*secrets)
        finally:
            self._declared = False

    def merge(self, other: Redactor) -> None:
        """Learn every secret ``other`` holds (a command's: its Environment's declared secrets)."""
        self._declared = True
        try:
            super().merge(other)
        finally:
            self._declared = False


class _Launches:
    """What happened to one session's plugin processes."""

    def __init__(self) -> None:
        self.launches = 0
        self.launch_failures = 0
        self.crashes = 0
        self.last_crash: dict[str, str] | None = None
        self.last_launch_ms: float | None = None


class PluginSession:
    """One warm plugin session: a ``RemoteDriver`` for (name, effective options) and what it went through."""

    def __init__(
        self,
        pool: SessionPool,
        resolved: ResolvedDriver,
        options: dict[str, Any],
        key: tuple[str, str, str],
    ) -> None:
        from vz_core.rpc import RemoteDriver

        self.pool = pool
        self.name = resolved.name
        self.resolved = resolved
        self.options = options
        self.key = key
        self.stats = _Launches()
        self.in_flight = 0
        self._quiet = asyncio.Event()
        self._quiet.set()
        self.last_use: str | None = None
        self.facts: DriverFacts | None = None
        self._facts_launch = -1
        self._facts_lock = asyncio.Lock()
        self._watchers: set[asyncio.Task[None]] = set()
        self._keeper: asyncio.Task[None] | None = None
        launcher = _CountingLauncher(
            self,
            resolved.launch_spec(options),
            name=self.name,
            redactor=pool.redactor,
            handshake_timeout=pool.handshake_timeout,
            run_root=pool.run_root,
        )
        self.remote: RemoteDriver = RemoteDriver(
            launcher, mode="warm", idle_timeout=pool.plugin_idle, name=self.name, redactor=pool.redactor
        )
        self._files = _verified_files(resolved)
        self._stamp = _stamp(self._files)

    def recheck(self) -> None:
        """Refuse to go on with a warm plugin whose verified file changed since: the same check a launch does,
        now, so a changed binary is refused at the next operation (``TrustError``) even while its plugin runs.

        A stat per file when nothing changed; the full verification only after a change.
        """
        stamp = _stamp(self._files)
        if stamp == self._stamp:
            return
        spec = self.resolved.launch_spec(self.options)()  # verifies (TrustError) and seals a copy
        if spec.binary is not None:
            spec.binary.close()
        self._stamp = stamp

    # what the launcher reports ---------------------------------------------------------------------------

    def _launched(self, conn: PluginConnection, seconds: float) -> None:
        self.stats.launches += 1
        self.stats.last_launch_ms = round(seconds * 1000, 1)
        log.info("driver %s: plugin launched (pid %s, %.0f ms)", self.name, conn.pid, seconds * 1000)
        task = asyncio.get_running_loop().create_task(self._watch(conn))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _watch(self, conn: PluginConnection) -> None:
        status = await conn.process.wait()
        if conn.stopping:
            log.info("driver %s: plugin %s stopped (%s)", self.name, conn.pid, status)
            return
        await conn.stderr.finish(0.5)
        self.stats.crashes += 1
        tail = conn.stderr_tail(2000)
        self.stats.last_crash = {"time": _now(), "pid": str(conn.pid), "status": str(status), "stderr": tail}
        log.warning(
            "driver %s: plugin %s died (%s); the next call starts it again%s",
            self.name,
            conn.pid,
            status,
            f"; its last stderr lines:\n{tail}" if tail else "",
        )

    # state ----------------------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        conn = self.remote.connection or self.remote.retiring
        return conn.pid if conn is not None else None

    @property
    def state(self) -> str:
        if self.remote.connection is None:
            return "stopping" if self.remote.retiring is not None else "stopped"
        return "warm" if self.in_flight else "idle"

    def describe(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "name": self.name,
            "options": self.pool.redactor.redact_data(dict(self.options)),
            "origin": "builtin" if self.resolved.builtin is not None else "external",
            "pid": self.pid,
            "state": self.state,
            "in_flight": self.in_flight,
            "last_use": self.last_use,
            "launches": self.stats.launches,
            "launch_failures": self.stats.launch_failures,
            "crashes": self.stats.crashes,
            "last_crash": self.stats.last_crash,
            "last_launch_ms": self.stats.last_launch_ms,
            "provenance": None,
        }
        if self.resolved.pinned is not None:
            row.update(script=str(self.resolved.pinned.script), sha256=self.resolved.pinned.sha256)
        elif self.resolved.external is not None:
            manifest = self.resolved.external.manifest
            with contextlib.suppress(VzError):
                row["sha256"] = manifest.entry_for().sha256
                row["script"] = str(manifest.binary_path(self.resolved.external.driver_dir))
            from vz_core._install import provenance_of

            row["provenance"] = provenance_of(self.name).get("provenance")
        return row

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        self.in_flight += 1
        self._quiet.clear()
        self.last_use = _now()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.last_use = _now()
            if not self.in_flight:
                self._quiet.set()

    async def quiet(self) -> None:
        """Return once no call is in flight."""
        await self._quiet.wait()

    async def negotiated(self) -> DriverFacts:
        """The driver's negotiated facts (Info with the recreate opt-in, Extensions), taken once per plugin
        launch; a stopped plugin's last facts are returned without launching it again."""
        from vz_core.env import DriverFacts

        async with self._facts_lock:
            if self.facts is not None and (self.remote.connection is None or self._facts_launch == self.stats.launches):
                return self.facts
            with self.using():
                info = await self.remote.info(supports_recreate_on_run=True)
                try:
                    extensions = await self.remote.extensions()
                except (UnsupportedError, NotFoundError):
                    extensions = None
            self.facts = DriverFacts(name=self.name, info=info, extensions=extensions)
            self._facts_launch = self.stats.launches
            return self.facts

    async def connection(self) -> PluginConnection:
        """The live plugin connection (launching the plugin when none runs), for a proxied call
        (``DriverProxy``); call it inside ``using()``. The plugin is kept from idling out while proxied calls
        run and counts as used when they end (``RemoteDriver``'s idle timer sees only its own calls: the
        session asks it for the negotiated Info now and then, which moves the timer and sends nothing)."""
        from vz_core.errors import UnavailableError

        conn = self.remote.connection
        if conn is None:
            await self.remote.info(supports_recreate_on_run=True)  # launches, handshakes and negotiates
            conn = self.remote.connection
            if conn is None:
                raise UnavailableError(f"driver {self.name!r}: its plugin stopped right after it was launched")
        if self.pool.plugin_idle is not None and (self._keeper is None or self._keeper.done()):
            self._keeper = asyncio.get_running_loop().create_task(self._keep_warm(self.pool.plugin_idle))
        return conn

    async def _keep_warm(self, idle: float) -> None:
        """While calls are in flight, and once after they ended, move the plugin's idle timer forward."""
        every = max(idle / 10, 0.05)
        while True:
            await asyncio.sleep(every)
            if self.remote.connection is None:
                return
            with contextlib.suppress(Exception):
                await self.remote.info(supports_recreate_on_run=True)  # the negotiated Info: no RPC
            if not self.in_flight:
                return

    def cached_extensions(self) -> tuple[bool, Extensions | None]:
        """(True, the Extensions) when they are known for the plugin running now."""
        if self.facts is not None and self.remote.connection is not None and self._facts_launch == self.stats.launches:
            return True, self.facts.extensions
        return False, None

    async def aclose(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(BaseException):
                await self._keeper
        await self.remote.close()
        for task in list(self._watchers):
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 2.0)
            task.cancel()


class _CountingLauncher(PluginLauncher):
    """A launcher that tells its session about every plugin it starts (for status and crash counts)."""

    def __init__(self, session: PluginSession, prepare: Callable[[], LaunchSpec], **kwargs: Any) -> None:
        super().__init__(prepare, **kwargs)
        self._session = session

    async def launch(self) -> PluginConnection:
        started = time.monotonic()
        try:
            conn = await super().launch()
        except BaseException:
            self._session.stats.launch_failures += 1
            raise
        self._session._launched(conn, time.monotonic() - started)
        return conn


class SharedDriver(Driver):
    """A handle on a shared plugin session (what ``acquire_driver`` returns in the daemon): every call goes to
    the session's ``RemoteDriver``; ``close()`` leaves the plugin running for the next command."""

    def __init__(self, session: PluginSession, redactor: Redactor | None = None) -> None:
        self._session = session
        self._remote = session.remote
        self._redactor = redactor

    def _using(self) -> contextlib.AbstractContextManager[None]:
        # The command's redactor may have learned more secrets since the handle was made (they are resolved
        # while the command runs): the pool learns them before each call.
        self._session.pool.learn(self._redactor)
        return self._session.using()

    def __repr__(self) -> str:
        return f"SharedDriver(name={self._session.name!r}, pid={self._session.pid})"

    @property
    def session(self) -> PluginSession:
        return self._session

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        with self._using():
            return await self._remote.info(supports_recreate_on_run=supports_recreate_on_run)

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        with self._using():
            await self._remote.preflight(disable_auto_start=disable_auto_start)

    async def provisioning_preflight(self) -> None:
        with self._using():
            await self._remote.provisioning_preflight()

    async def reuse_preflight(self, workspace_id: str, remote_user: str) -> None:
        with self._using():
            await self._remote.reuse_preflight(workspace_id, remote_user)

    async def find(self, workspace_id: str) -> MachineDetails | None:
        with self._using():
            return await self._remote.find(workspace_id)

    async def target_architecture(self, workspace_id: str) -> str:
        with self._using():
            return await self._remote.target_architecture(workspace_id)

    async def run_image(self, request: RunImageRequest) -> None:
        with self._using():
            await self._remote.run_image(request)

    async def start(self, workspace_id: str) -> None:
        with self._using():
            await self._remote.start(workspace_id)

    async def stop(self, workspace_id: str) -> None:
        with self._using():
            await self._remote.stop(workspace_id)

    async def delete(self, workspace_id: str) -> None:
        with self._using():
            await self._remote.delete(workspace_id)

    async def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        with self._using():
            events = self._remote.exec(spec, stdin)
            try:
                async for event in events:
                    yield event
            finally:
                await events.aclose()  # type: ignore[attr-defined]

    async def exec_local(self, machine_id: str, spec: ExecSpec, stdio: tuple[int, int, int]) -> ExecExit:
        with self._using():
            return await self._remote.exec_local(machine_id, spec, stdio)

    async def delete_volume(self, name: str) -> None:
        """A named volume's data removed by the plugin (``MachineExtensions.DeleteVolume``)."""
        with self._using():
            await self._remote.delete_volume(name)

    async def set_services(self, workspace_id: str, specs: Sequence[ServiceSpec]) -> tuple[ServiceState, ...]:
        """The Machine's service set replaced by the plugin (``MachineExtensions.SetServices``)."""
        with self._using():
            return await self._remote.set_services(workspace_id, specs)

    async def service_states(self, workspace_id: str) -> tuple[ServiceState, ...]:
        with self._using():
            return await self._remote.service_states(workspace_id)

    async def service_logs(self, workspace_id: str, name: str, tail_bytes: int = 0) -> bytes:
        with self._using():
            return await self._remote.service_logs(workspace_id, name, tail_bytes)

    async def logs(self, workspace_id: str) -> AsyncIterator[bytes]:
        with self._using():
            chunks = self._remote.logs(workspace_id)
            try:
                async for chunk in chunks:
                    yield chunk
            finally:
                await chunks.aclose()  # type: ignore[attr-defined]

    async def terminal(self, spec: TerminalSpec, input: AsyncIterator[TerminalInput]) -> AsyncIterator[TerminalEvent]:
        with self._using():
            events = self._remote.terminal(spec, input)
            try:
                async for event in events:
                    yield event
            finally:
                await events.aclose()  # type: ignore[attr-defined]

    async def extensions(self) -> Extensions | None:
        """The plugin's Extensions, asked once per plugin launch (every command negotiates; the answer of the
        running plugin does not change). None when the driver serves no extensions."""
        known, extensions = self._session.cached_extensions()
        if known:
            return extensions
        self._session.pool.learn(self._redactor)
        return (await self._session.negotiated()).extensions

    async def close(self) -> None:
        """Nothing to do: the session stays warm for the next command (the pool stops it)."""


class SessionPool:
    """The daemon's driver sessions (see the module docstring).

    ``plugin_idle``: seconds before an idle plugin is stopped (None: ``VZ_DAEMON_PLUGIN_IDLE``, default 300;
    0: never). ``registry``, ``store``, ``host_config``: where drivers, external manifests and host options come
    from (defaults: this installation and ``VZ_HOME``). ``run_root``: where the plugins' private socket
    directories are made (default: the temporary directory). ``scripts_dir``: where the built-ins' console
    scripts are (default: this interpreter's scripts directory). ``launcher_dir``: where launcher scripts are
    written for built-ins declared without a console script (default: ``<VZ_HOME>/daemon/launchers``).
    """

    def __init__(
        self,
        *,
        plugin_idle: float | None = None,
        redactor: PoolRedactor | None = None,
        registry: DriverRegistry | None = None,
        store: ManifestStore | None = None,
        host_config: HostConfig | None = None,
        run_root: str | None = None,
        handshake_timeout: float = 15.0,
        scripts_dir: str | os.PathLike[str] | None = None,
        launcher_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if plugin_idle is None:
            self.plugin_idle = plugin_idle_seconds()
        elif not math.isfinite(plugin_idle) or plugin_idle < 0:
            raise UserError(f"plugin_idle must be a number of seconds >= 0, not {plugin_idle!r}")
        else:
            self.plugin_idle = None if plugin_idle == 0 else float(plugin_idle)
        self.redactor = redactor if redactor is not None else PoolRedactor()
        self._registry = registry
        self._store = store
        self._host_config = host_config
        self.run_root = run_root
        self.handshake_timeout = handshake_timeout
        self._scripts_dir = scripts_dir
        self._launcher_dir = launcher_dir
        self._pins: dict[str, ResolvedDriver] = {}
        self._pin_errors: dict[str, VzError] = {}
        self._sessions: dict[tuple[str, str, str], PluginSession] = {}
        self._retired: set[asyncio.Task[None]] = set()
        self._retiring: set[PluginSession] = set()
        self._previous: SessionPool | None = None
        self._proxies: set[DriverProxy] = set()
        self._started = False
        self._closed = False

    # lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Pin every built-in's console script and make this the ``running_pool()``. Call once, at daemon
        start, in the daemon's event loop. A built-in whose script cannot be pinned stays listed; launching it
        fails with the reason."""
        global _running
        if self._started:
            return
        await asyncio.to_thread(self._pin_all)
        self._started = True
        self._previous, _running = _running, self

    def _pin_kwargs(self) -> dict[str, Any]:
        if self._launcher_dir is None:
            from vz_core.paths import state_dir

            self._launcher_dir = state_dir() / "daemon" / "launchers"
        return {"scripts_dir": self._scripts_dir, "launcher_dir": self._launcher_dir}

    def _pin_all(self) -> None:
        from vz_core import drivers

        registry = self.registry
        for name in registry.names():
            try:
                self._pins[name] = drivers.pin_builtin(name, registry=registry, **self._pin_kwargs())
            except (TrustError, UserError) as exc:
                self._pin_errors[name] = exc
                log.warning("built-in driver %s cannot be launched: %s", name, exc)

    async def aclose(self) -> None:
        """Stop every plugin (Machines keep running) and withdraw this pool (``running_pool()`` gives the one
        before it, usually None: commands then open their drivers in-process)."""
        global _running
        if self._closed:
            return
        self._closed = True
        if self._started and _running is self:
            _running = self._previous
        for task in list(self._retired):
            task.cancel()
        for proxy in list(self._proxies):
            await proxy.close()
        sessions, self._sessions = list(self._sessions.values()), {}
        sessions += list(self._retiring)
        self._retiring.clear()
        results = await asyncio.gather(*(s.aclose() for s in sessions), return_exceptions=True)
        for session, result in zip(sessions, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("driver %s: stopping its plugin failed: %s", session.name, result)

    async def __aenter__(self) -> SessionPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def registry(self) -> DriverRegistry:
        if self._registry is None:
            from vz_core.registry import DriverRegistry

            self._registry = DriverRegistry()
        return self._registry

    @property
    def pins(self) -> Mapping[str, ResolvedDriver]:
        """The pinned built-ins by name."""
        return dict(self._pins)

    # the DriverSource contract --------------------------------------------------------------------------

    def learn(self, redactor: Redactor | None) -> None:
        """Add every secret ``redactor`` holds (a command's: its Environment's secrets) to the pool's."""
        if redactor is not None and redactor is not self.redactor:
            self.redactor.merge(redactor)

    def driver(
        self,
        name: str,
        project_options: Mapping[str, Any] | None = None,
        *,
        where: str = "driver_options",
        recorded: bool = False,
        redactor: Redactor | None = None,
    ) -> Driver:
        """A handle on the shared session of driver ``name`` with the effective options for ``project_options``
        (validated exactly as ``vz_core.drivers.open_driver`` does; ``UserError``/``NotFoundError`` before
        anything is launched). Nothing is launched until the first call."""
        self.learn(redactor)
        return SharedDriver(self.session(name, project_options, where=where, recorded=recorded), redactor)

    def session(
        self,
        name: str,
        project_options: Mapping[str, Any] | None = None,
        *,
        where: str = "driver_options",
        recorded: bool = False,
    ) -> PluginSession:
        """The session for driver ``name`` and those options (made on first use)."""
        from vz_core import drivers

        if self._closed:
            raise UserError("the vz daemon is shutting down; run the command again")
        options = drivers.effective_options(
            name,
            project_options,
            where=where,
            registry=self.registry,
            store=self._store,
            host_config=self._host_config,
            recorded=recorded,
        )
        resolved = self._resolve(name)
        key = (*drivers.driver_key(name, options), _identity(resolved))
        session = self._sessions.get(key)
        if session is None:
            session = PluginSession(self, resolved, options, key)
            for old_key, old in list(self._sessions.items()):
                if old_key[:2] == key[:2]:
                    # The driver was added again (`vz driver add`): new calls use the new record; the plugin
                    # of the old one is stopped once its calls are done.
                    del self._sessions[old_key]
                    self._retire(old)
            self._sessions[key] = session
        else:
            try:
                session.recheck()
            except TrustError:
                # The plugin runs code that no longer matches what was verified: stop it once its calls end;
                # the next command launches again, and that launch verifies (refused until the bytes match).
                del self._sessions[key]
                self._retire(session)
                raise
        return session

    def _retire(self, session: PluginSession) -> None:
        async def retire() -> None:
            await session.quiet()
            await session.aclose()
            self._retiring.discard(session)

        self._retiring.add(session)
        task = asyncio.get_running_loop().create_task(retire())
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    def _resolve(self, name: str) -> ResolvedDriver:
        from vz_core import drivers

        pinned = self._pins.get(name)
        if pinned is not None:
            return pinned
        failed = self._pin_errors.get(name)
        if failed is not None:
            raise type(failed)(str(failed))
        resolved = drivers.resolve(name, registry=self.registry, store=self._store)
        if resolved.builtin is not None:
            # A built-in registered after start (not pinned): pin it now rather than launch it unchecked.
            resolved = drivers.pin_builtin(name, registry=self.registry, **self._pin_kwargs())
            self._pins[name] = resolved
        return resolved

    # Drivers.Connect -------------------------------------------------------------------------------------

    async def serve_connect(self, call: Any, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """Serve a ``Drivers.Connect`` call (see ``serve_driver_connect``): launch the session's plugin, open a
        ``DriverProxy`` to it, tell the client its socket, and close it when the client hangs up."""
        session = self.session(name, dict(options), where=f"{DRIVER_CONNECT} options", recorded=True)
        with session.using():
            conn = await session.connection()
        proxy = DriverProxy(session, self.run_root)
        self._proxies.add(proxy)
        try:
            path = await proxy.start()
            log.info("driver %s: a client speaks to its plugin (pid %s) through %s", name, conn.pid, path)
            row = session.describe()
            pinned = session.resolved.pinned
            await call.progress(
                {
                    "driver": {
                        "socket": path,
                        "pid": conn.pid,
                        "name": session.name,
                        "script": row.get("script"),
                        "sha256": row.get("sha256"),
                        "args": list(pinned.args) if pinned is not None else [],
                        "options": row.get("options"),
                        "launches": session.stats.launches,
                    }
                }
            )
            while await call.receive() is not None:
                pass
        finally:
            self._proxies.discard(proxy)
            await proxy.close()
        return {}

    # System.Status and System.Capabilities --------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """One row per plugin session (and per pinned built-in not used yet): name, pid, state, last use,
        launches, crashes, the script and its pinned SHA-256."""
        rows = [s.describe() for s in self._sessions.values()]
        used = {s.name for s in self._sessions.values()}
        for name, resolved in sorted(self._pins.items()):
            if name in used:
                continue
            pinned = resolved.pinned
            assert pinned is not None
            rows.append(
                {
                    "name": name,
                    "options": None,
                    "origin": "builtin",
                    "pid": None,
                    "state": "stopped",
                    "in_flight": 0,
                    "last_use": None,
                    "launches": 0,
                    "launch_failures": 0,
                    "crashes": 0,
                    "last_crash": None,
                    "last_launch_ms": None,
                    "script": str(pinned.script),
                    "sha256": pinned.sha256,
                }
            )
        for name, exc in sorted(self._pin_errors.items()):
            rows.append({"name": name, "origin": "builtin", "pid": None, "state": "refused", "error": str(exc)})
        return sorted(rows, key=lambda row: row["name"])

    async def capabilities(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """Every driver's negotiated facts (``DriverFacts.describe()``: Info, Extensions), launching plugins
        that never ran (they then idle out). A driver that cannot be launched gets ``"error"`` instead."""
        if names is None:
            from vz_core.drivers import ManifestStore

            store = self._store if self._store is not None else ManifestStore()
            names = sorted({*self.registry.names(), *store.names()})

        async def one(name: str) -> dict[str, Any]:
            try:
                facts = await self.session(name, None, where="System.Capabilities").negotiated()
            except (VzError, OSError) as exc:
                code = exc.code if isinstance(exc, DriverError) else type(exc).__name__
                return {"name": name, "error": {"code": code, "message": self.redactor.redact(str(exc))}}
            return {"name": name, "facts": facts.describe()}

        return list(await asyncio.gather(*(one(name) for name in names)))


# Drivers.Connect: a client's gRPC view of a warm plugin session ---------------------------------------------

DRIVER_CONNECT = "Drivers.Connect"
"""The local-wire method that opens a driver session for a client (``serve_driver_connect``)."""
_PROXIED = ("/devsy.runtime.v1.RuntimeDriver/", "/vz.machine.v1.MachineExtensions/")
_HOP_BY_HOP = frozenset({"user-agent", "content-type", "te"})
_GRPC_OWN = ("grpc-", ":")
_DETAILS = "grpc-status-details-bin"  # the RuntimeError details: the plugin's, passed on
_TRANSPORT = ("UNAVAILABLE", "INTERNAL", "CANCELLED", "UNKNOWN")
_FOREVER = 10**7  # seconds: time_remaining() of a call without a deadline is about this or larger


def _forwarded(metadata: Any) -> list[tuple[str, str | bytes]]:
    """Metadata a hop forwards: the application's keys (``vz-exec-*``) and the status details, not the rest of
    gRPC's own."""
    out: list[tuple[str, str | bytes]] = []
    for key, value in metadata or ():
        if key in _HOP_BY_HOP or (key.startswith(_GRPC_OWN) and key != _DETAILS):
            continue
        out.append((key, value))
    return out


class DriverProxy:
    """A gRPC server on a private Unix socket that passes ``devsy.runtime.v1.RuntimeDriver`` and
    ``vz.machine.v1.MachineExtensions`` calls, byte for byte, to the warm plugin of one ``PluginSession``.

    Nothing is decoded: requests, responses, response headers (``vz-exec-stop-input``, ``vz-exec-chunk``) and
    the status with its RuntimeError details are the plugin's own, so a client sees exactly what the plugin
    sent (the conformance suite judges it through here). What is the proxy's own: a call whose plugin died
    during it ends UNAVAILABLE with the plugin's redacted stderr tail (what ``RemoteDriver`` says for its own
    calls), and a call that cannot reach the plugin (a launch that failed, a verified file that changed since
    the launch) ends with that error, redacted. The plugin's controller (``plugin.GRPCController/Shutdown``)
    is not reachable: its methods are UNIMPLEMENTED here.

    One proxy per ``Drivers.Connect`` call, closed when the call ends. Its socket (mode 0600) is in a fresh
    0700 directory with a random name: only this user can reach it, and only while the call is open.
    """

    def __init__(self, session: PluginSession, run_root: str | None = None) -> None:
        self.session = session
        self._run_root = run_root
        self._server: Any = None
        self._dir: str | None = None
        self.path = ""

    async def start(self) -> str:
        """Start serving; returns the socket path."""
        import tempfile

        import grpc

        from vz_core.rpc import SERVER_OPTIONS

        self._dir = tempfile.mkdtemp(prefix="vz-drv-", dir=self._run_root)
        os.chmod(self._dir, 0o700)
        self.path = os.path.join(self._dir, "driver.sock")
        server = grpc.aio.server(options=SERVER_OPTIONS)
        handler: Any = _ProxyHandler(self.session)
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix:{self.path}")
        await server.start()
        os.chmod(self.path, 0o600)
        self._server = server
        return self.path

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            from vz_core.rpc import stop_server

            await stop_server(server, 1.0)
        if self._dir is not None:
            import shutil

            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class _ProxyHandler:
    """The generic handler of ``DriverProxy``: every proxied method as a raw-bytes stream-stream relay (the wire
    does not say whether a method is unary or streaming; a unary call is one message each way)."""

    def __init__(self, session: PluginSession) -> None:
        self._session = session

    def service(self, details: Any) -> Any:
        import grpc

        method: str = details.method
        if not method.startswith(_PROXIED):
            return None  # UNIMPLEMENTED, as a plugin answers a method it does not serve
        return grpc.stream_stream_rpc_method_handler(_Relay(self._session, method).run)


class _Relay:
    """One proxied call."""

    def __init__(self, session: PluginSession, method: str) -> None:
        self.session = session
        self.method = method
        self.rpc = method.rsplit("/", 1)[-1]

    async def run(self, requests: AsyncIterator[bytes], context: Any) -> None:
        import grpc

        with self.session.using():
            try:
                self.session.recheck()  # a driver file changed under the warm plugin: refused, as for vz commands
                conn = await self.session.connection()
            except VzError as exc:
                await self._refuse(context, exc)
                return
            upstream = conn.channel.stream_stream(self.method, None, None)  # no (de)serializers: bytes both ways
            remaining = context.time_remaining()
            timeout = remaining if remaining is not None and remaining < _FOREVER else None
            call = upstream(None, metadata=_forwarded(context.invocation_metadata()), timeout=timeout)
            pump = asyncio.get_running_loop().create_task(self._pump(requests, call))
            try:
                headers = await call.initial_metadata()
                forwarded = _forwarded(headers)
                if forwarded:
                    await context.send_initial_metadata(tuple(forwarded))
                while True:
                    message = await call.read()
                    if message is grpc.aio.EOF:  # type: ignore[attr-defined]
                        break
                    await context.write(message)
                code = await call.code()
            except grpc.RpcError:
                code = await call.code()
            except BaseException:
                call.cancel()
                raise
            finally:
                pump.cancel()
                with contextlib.suppress(BaseException):
                    await pump
            trailers = tuple(_forwarded(await call.trailing_metadata()))
            if code == grpc.StatusCode.OK:
                if trailers:
                    context.set_trailing_metadata(trailers)
                return
            details = await call.details() or ""
            has_details = any(key == _DETAILS for key, _ in trailers)
            if code.name in _TRANSPORT and not has_details:
                status = await conn.wait_exited(1.0)
                if status is not None:
                    await self._died(context, conn, status)
            await context.abort(code, details, trailers)

    async def _pump(self, requests: AsyncIterator[bytes], call: Any) -> None:
        try:
            async for request in requests:
                await call.write(request)
            await call.done_writing()
        except asyncio.CancelledError:
            raise
        except Exception:  # the plugin ended the call: its status is what the client gets
            return

    async def _refuse(self, context: Any, exc: VzError) -> None:
        """The plugin could not be reached (a launch that failed, a changed file): the error a ``RemoteDriver``
        caller would get, redacted, as the call's status (a driver error keeps its category, anything else is
        UNAVAILABLE)."""
        from vz_core.errors import UnavailableError
        from vz_core.rpc import error_to_status

        redact = self.session.pool.redactor.redact
        if isinstance(exc, DriverError):
            err: DriverError = type(exc)(
                redact(exc.message) or exc.message,
                runtime_message=redact(exc.runtime_message),
                details={k: redact(v) for k, v in exc.details.items()},
                retryable=exc.retryable,
            )
        else:
            err = UnavailableError(redact(str(exc)) or type(exc).__name__, details={"rpc": self.rpc})
        grpc_status = error_to_status(err)
        await context.abort(grpc_status.code, grpc_status.details, grpc_status.trailing_metadata)

    async def _died(self, context: Any, conn: PluginConnection, status: object) -> None:
        from vz_core.errors import UnavailableError
        from vz_core.rpc import error_to_status

        await conn.stderr.finish(0.5)
        redactor = self.session.pool.redactor
        err = UnavailableError(
            f"driver {self.session.name!r}: the plugin process died during {self.rpc} ({status}); "
            "the next call starts it again",
            runtime_message=redactor.redact(conn.stderr_tail()),
            details={"rpc": self.rpc, "plugin_exit": str(status)},
        )
        grpc_status = error_to_status(err)
        await context.abort(grpc_status.code, grpc_status.details, grpc_status.trailing_metadata)


_running: SessionPool | None = None


def running_pool() -> SessionPool | None:
    """The daemon's started ``SessionPool`` (None outside a daemon, or before its start): what every command's
    ``Context.drivers`` is (``vz_core.daemon._calls.context_of``)."""
    return _running


async def serve_driver_connect(call: Any) -> dict[str, Any]:
    """``Drivers.Connect {"driver": NAME, "options": {...}}``: the daemon's warm plugin session of that driver,
    for a client that speaks the Runtime Protocol itself (the conformance suite's ``--through-daemon``).

    The session is the one ``vz`` commands share for those effective options (``options`` are validated like
    recorded Machine options: every key must be one the driver declares; host-scoped keys such as a state
    directory are allowed, since the caller is this user). The plugin is launched (verified, handshaken,
    negotiated) now. Then one progress message ``{"driver": {"socket", "pid", "name", "script", "sha256",
    "args", "options", "launches"}}`` tells the client where to send gRPC (``socket``: a ``DriverProxy`` of
    this call). It is served until the client closes this connection (or cancels); the result is then ``{}``.
    The plugin stays warm afterwards, like any other session of the pool.
    """
    pool = running_pool()
    if pool is None:
        raise UserError("this vz daemon serves no driver sessions (it runs without its service)")
    request = call.request or {}
    name = request.get("driver")
    if not isinstance(name, str) or not name:
        raise UserError(f'{DRIVER_CONNECT}: give "driver": the name of a driver (`vz driver list`)')
    options = request.get("options") or {}
    if not isinstance(options, dict):
        raise UserError(f'{DRIVER_CONNECT}: "options" must be an object of driver options, not {options!r}')
    return await pool.serve_connect(call, name, options)
