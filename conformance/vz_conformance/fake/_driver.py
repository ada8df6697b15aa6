"""The reference fake driver: Machines are directories, commands are host processes.

It implements the whole Machine contract honestly except isolation: there is no container, so it advertises
no mount types, no resource, pids or storage limits and no egress policies, and refuses requests that need them
(nothing bounds what its commands use: it is a reference for the protocol, not a place for untrusted code). The
one exception is the network: a Machine given the ``vz.network`` label runs its processes in a network namespace
joined to its Environment's route domain (``_network``; the Extensions fact ``topology``), as linux_native does.
Fault modes (``FAULT_DESCRIPTIONS``) each break one rule on purpose so the conformance suite can prove that
its checks fail when they should.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import platform
import pwd
import secrets
import shutil
import subprocess
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import cast

from vz_core import (
    API_MAJOR,
    API_MINOR,
    MAX_CHUNK,
    Capabilities,
    Driver,
    DriverInfo,
    ExecEvent,
    ExecOutput,
    ExecSpec,
    Extensions,
    GpuRequirement,
    MachineConfig,
    MachineDetails,
    MachineMount,
    MachineState,
    Mount,
    MountType,
    RecreateMode,
    RunImageRequest,
    TerminalEvent,
    TerminalInput,
    TerminalSpec,
)
from vz_core import paths as vz_paths
from vz_core.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RuntimeFailureError,
    UnavailableError,
    UnsupportedError,
)
from vz_core.options import Options
from vz_core.savestate import NO_SAVED_STATE, RestoreOutcome, SavedState
from vz_core.secrets import SecretKeeper
from vz_core.services import ServiceSpec, ServiceState

from . import _network, _saved
from ._exec import (
    MINIMAL_PATH,
    HostUser,
    Launch,
    exit_event,
    kill_group,
    resolve_user,
    spawn,
    stream_exec,
)
from ._faults import check_faults
from ._main import append_log, read_log_tail, start_main_process, stop_main_process
from ._services import Supervisor
from ._store import MachineRecord, MachineStore
from ._terminal import run_terminal

__all__ = ["FakeDriver"]

INVALID_IMAGE_PREFIX = "invalid/"
"""Images starting with this are rejected as InvalidArgument (so tests can exercise a bad image)."""
LOG_LIMIT = 1 << 20
"""Logs returns at most the last this many bytes of the main process's output."""
_LOGS_WRONG_CHUNK = 2 * MAX_CHUNK
_UNKNOWN_MOUNT_TYPE = 99
_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class FakeDriver(Driver):
    """A Driver whose Machines are directories under ``state_dir`` and whose commands run on the host.

    ``state_dir`` defaults to ``<vz state dir>/drivers/fake``; the declaration's ``Options`` may come in its
    place (how ``DriverDeclaration.create`` builds it). ``faults`` names fault modes (see
    ``FAULT_DESCRIPTIONS``; a string is read as a comma-separated list); an unknown name is a ``UserError``.
    Everything but the environment values lives on disk, so a new instance on the same directory (a relaunched
    plugin) finds every Machine in the state the last one left it; the values are kept in memory (this process
    and the kernel keyring, see ``vz_core.secrets``), never in a file. Calls are serialized per
    workspace within a process (asyncio lock) and across processes (fcntl lock).
    """

    def __init__(self, state_dir: str | Path | Options | None = None, faults: Iterable[str] | str = ()) -> None:
        if isinstance(state_dir, Options):  # built from its declaration (``DriverDeclaration.create``)
            options = state_dir
            state_dir, faults = options.state_dir or None, options.faults
        if isinstance(faults, str):
            faults = [name.strip() for name in faults.split(",") if name.strip()]
        self.faults = check_faults(faults)
        self.state_dir = Path(state_dir) if state_dir is not None else vz_paths.state_dir() / "drivers" / "fake"
        self._store = MachineStore(
            self.state_dir, raw_id_paths="raw-id-paths" in self.faults, keep_legacy_environment=self._keep_legacy
        )
        # Process groups of the execs this instance is running, per Machine key: Stop/Delete/recreation kill them.
        self._active: dict[str, set[int]] = {}
        # The service sets of running Machines (SetServices), per Machine key; Stop ends them, as it does in a
        # Machine whose agent supervises them.
        self._services: dict[str, Supervisor] = {}
        # The Machines' environment values: never on disk (the record keeps the names only), in this process's
        # memory and the user's kernel keyring, as for the built-in drivers; a Start without them is refused.
        self._secrets = SecretKeeper(self.state_dir)

    def __repr__(self) -> str:
        return f"FakeDriver(state_dir={str(self.state_dir)!r}, faults={sorted(self.faults)!r})"

    # Discovery -------------------------------------------------------------------------------------------

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        if "crash-during-info" in self.faults:
            os._exit(3)
        mount_types: tuple[MountType, ...] = ()
        if "unknown-enum-info" in self.faults:
            # Deliberately not a MountType member: the value must reach the wire as the raw number.
            mount_types = cast(tuple[MountType, ...], (_UNKNOWN_MOUNT_TYPE,))
        return DriverInfo(
            driver_name="" if "malformed-info" in self.faults else "fake",
            driver_version=_version(),
            runtime_name="fake",
            runtime_version="1",
            capabilities=Capabilities(
                mount_types=mount_types,
                recreate_mode=RecreateMode.ON_RUN if supports_recreate_on_run else RecreateMode.DELETE,
                provisioning_preflight=True,
                reuse_preflight=True,
                logs=True,
            ),
            api_major=2 if "incompatible-version" in self.faults else API_MAJOR,
            api_minor=API_MINOR,
        )

    async def extensions(self) -> Extensions:
        return Extensions(
            target_os=("linux",),
            profiles=("developer",),
            tty=False,
            accelerator="none",
            accelerator_reason="Machines are plain host processes; nothing is virtualized",
            snapshots=False,
            egress_policies=(),
            resource_limits=False,
            storage_limits=False,
            terminal=True,
            facts={_network.FACT_KEY: _network.FACT},
            save_state=True,
            services=True,
        )

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        if "failing-preflight" in self.faults:
            raise RuntimeFailureError("preflight failed on purpose (fault mode 'failing-preflight')")
        _host_architecture()
        self._check_state_dir()

    async def provisioning_preflight(self) -> None:
        self._check_state_dir()

    def _check_state_dir(self) -> None:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UnavailableError(
                f"the fake driver cannot create its state directory {self.state_dir}: {exc.strerror}; "
                "pass a writable --state-dir (or set VZ_HOME)"
            ) from exc
        if not os.access(self.state_dir, os.W_OK | os.X_OK):
            raise UnavailableError(
                f"the fake driver's state directory {self.state_dir} is not writable; "
                "pass a writable --state-dir (or set VZ_HOME)"
            )

    async def target_architecture(self, workspace_id: str) -> str:
        _require_id(workspace_id, "TargetArchitecture")
        return _host_architecture()

    # Lifecycle -------------------------------------------------------------------------------------------

    async def find(self, workspace_id: str) -> MachineDetails | None:
        _require_id(workspace_id, "Find")
        record = self._store.read(self._store.key(workspace_id))
        if record is None:
            return None
        return MachineDetails(
            id=record.id,
            created_at=record.created_at,
            state=MachineState(status=record.reported_status or record.status, started_at=record.started_at),
            config=MachineConfig(
                labels=MappingProxyType(dict(record.labels)), working_dir=record.working_dir, user=record.user
            ),
            mounts=tuple(MachineMount(**mount) for mount in record.mounts),
        )

    async def run_image(self, request: RunImageRequest) -> None:
        _require_id(request.workspace_id, "RunImage")
        key = self._store.key(request.workspace_id)
        if "recreate-before-validate" in self.faults and request.allow_recreate:
            async with self._store.locked(key):
                old = self._store.read(key)
                self._forget(key, old)
                await self._release(key, old)
                await self._store.discard(self._store.remove(key))
        record = self._validate_run(request, key)
        if "failing-run" in self.faults:
            raise RuntimeFailureError("RunImage failed on purpose (fault mode 'failing-run'); nothing was created")
        async with self._store.locked(key):
            existing = self._store.read(key)
            if existing is not None and not request.allow_recreate and "runimage-overwrites" not in self.faults:
                raise AlreadyExistsError(
                    f"a Machine for workspace {request.workspace_id!r} already exists (id {existing.id}); "
                    "reuse it, delete it first, or recreate it explicitly (--recreate)",
                    details={"workspace_id": request.workspace_id},
                )
            now = _now()
            record = replace(record, id=secrets.token_hex(32), created_at=now, started_at=now)
            self._forget(key, existing)
            await self._release(key, existing)
            values = dict(request.environment)
            if values:
                self._secrets.put(key, record.id, values)
            await self._store.discard(self._store.install(key, record))
            try:
                await self._attach(key, record)
            except BaseException:
                self._forget(key, record)
                await self._release(key, record)
                await self._store.discard(self._store.remove(key))
                raise
            self._start_main_process(key, record, values)

    async def start(self, workspace_id: str) -> None:
        async with self._locked_record(workspace_id, "Start") as (key, record):
            if record is None or record.status == "running":
                return
            values = self._values(key, record)
            if values is None:
                names = ", ".join(record.environment_names)
                raise FailedPreconditionError(
                    f"the Machine for workspace {workspace_id!r} cannot start: the values of its environment "
                    f"variables ({names}) are never written to disk, and neither this driver process nor the "
                    "kernel keyring holds them any more (the host restarted, or the keyring is unavailable and "
                    "another driver process created the Machine); recreate the Machine to give them again "
                    "(vz up --recreate)",
                    details={"workspace_id": workspace_id, "variables": names},
                )
            self._discard_state(key, record)
            await self._attach(key, record, start=True)
            record.status = "running"
            record.started_at = _now()
            record.reported_status = ""
            self._store.write(key, record)
            self._start_main_process(key, record, values)

    async def stop(self, workspace_id: str) -> None:
        async with self._locked_record(workspace_id, "Stop") as (key, record):
            if record is None:
                return
            if record.status == "stopped":
                if "stop-not-idempotent" in self.faults:
                    raise FailedPreconditionError(
                        f"the Machine for workspace {workspace_id!r} is already stopped "
                        "(fault mode 'stop-not-idempotent')"
                    )
                return
            supervisor = self._services.pop(key, None)
            if supervisor is not None:
                await supervisor.stop()
            self._halt(key, record)
            await self._release(key, record)
            record.status = "stopped"
            record.main_pid, record.main_started = 0, 0.0
            if "find-stale-status" in self.faults:
                record.reported_status = "running"
            self._store.write(key, record)

    # Saved state (vz.machine.v1 SaveState / RestoreState) ------------------------------------------------

    async def save_state(self, workspace_id: str) -> SavedState:
        """Freeze the running Machine's processes where they are and stop it (``_saved``)."""
        async with self._locked_record(workspace_id, "SaveState") as (key, record):
            if record is None:
                raise _not_found(workspace_id, "SaveState")
            if record.status != "running":
                raise FailedPreconditionError(
                    f"SaveState: the Machine for workspace {workspace_id!r} is stopped; only a running Machine's "
                    "state can be saved (vz up, then vz stop --save)",
                    details={"workspace_id": workspace_id},
                )
            machine_dir = self._store.machine_dir(key)
            groups = [g for g in (_saved.identity(pid) for pid in self._groups(key, record)) if g is not None]
            if "save-fails" in self.faults:
                self._halt(key, record)  # the processes are lost, yet the save is reported
            else:
                _saved.freeze(groups)
            saved_at = _now()
            try:
                path = _saved.write_state(machine_dir, record.id, saved_at, groups)
            except OSError as exc:
                _saved.thaw(groups)  # a save that fails leaves the Machine running
                raise RuntimeFailureError(f"SaveState: cannot write the state file: {exc.strerror}") from exc
            record.status = "stopped"
            self._store.write(key, record)
            return SavedState(saved_at=saved_at, size_bytes=path.stat().st_size, path=str(path))

    async def restore_state(self, workspace_id: str) -> RestoreOutcome:
        """Resume the Machine's frozen processes, or say why not (the state is then discarded)."""
        async with self._locked_record(workspace_id, "RestoreState") as (key, record):
            if record is None:
                raise _not_found(workspace_id, "RestoreState")
            if record.status == "running":
                raise FailedPreconditionError(
                    f"RestoreState: the Machine for workspace {workspace_id!r} is running; stop it with its "
                    "state saved first (vz stop --save)",
                    details={"workspace_id": workspace_id},
                )
            machine_dir = self._store.machine_dir(key)
            try:
                groups = _saved.read_state(machine_dir, record.id)
            except _saved.StateProblem as problem:
                if "state-file-corrupt" not in self.faults or str(problem) == NO_SAVED_STATE:
                    self._discard_state(key, record)
                    self._store.write(key, record)
                    return RestoreOutcome(restored=False, reason=str(problem))
                groups = []  # trusts an unreadable file: "resumes" nothing, the Machine boots fresh
                self._discard_state(key, record)
            if "restore-fails" in self.faults:
                self._discard_state(key, record)  # the saved processes are lost, yet a resume is reported
                groups = []
            _saved.remove_state(machine_dir)
            record.status = "running"
            if groups:
                _saved.thaw(groups)
                self._store.write(key, record)
            else:
                values = self._values(key, record) or {}
                await self._attach(key, record, start=True)
                record.started_at = _now()
                self._store.write(key, record)
                self._start_main_process(key, record, values)
            return RestoreOutcome(restored=True)

    def _groups(self, key: str, record: MachineRecord) -> list[int]:
        """The Machine's process groups: its main process and the execs this instance is running."""
        main = [record.main_pid] if record.main_pid else []
        return main + sorted(self._active.get(key, ()))

    def _discard_state(self, key: str, record: MachineRecord) -> None:
        """Drop a saved state: its frozen processes are ended and the state file removed."""
        machine_dir = self._store.machine_dir(key)
        if (machine_dir / _saved.STATE_NAME).exists():
            # The record (not the state file, which may be corrupt) names the main process; the file may name
            # frozen execs too (each checked against its start time before it is killed).
            stop_main_process(record.main_pid, record.main_started)
            _saved.kill_saved(_saved.raw_groups(machine_dir))
            for pgid in self._active.get(key, ()):
                kill_group(pgid)
            _saved.remove_state(machine_dir)
            record.main_pid, record.main_started = 0, 0.0

    async def delete(self, workspace_id: str) -> None:
        _require_id(workspace_id, "Delete")
        key = self._store.key(workspace_id)
        async with self._store.locked(key):
            record = self._store.read(key)
            self._forget(key, record)
            await self._release(key, record)
            old = self._store.remove(key)
            if old is None and "delete-not-idempotent" in self.faults:
                raise _not_found(workspace_id, "Delete")
            await self._store.discard(old)

    async def reuse_preflight(self, workspace_id: str, remote_user: str) -> None:
        _require_id(workspace_id, "ReusePreflight")
        record = self._store.read(self._store.key(workspace_id))
        if record is None:
            raise _not_found(workspace_id, "ReusePreflight")
        if "reuse-ignores-identity" in self.faults:
            return
        identity = remote_user or "root"
        if identity != record.identity:
            raise FailedPreconditionError(
                f"the Machine for workspace {workspace_id!r} was created for developer identity "
                f"{record.identity!r}, not {identity!r}; run again with --recreate to replace it "
                "(its Machine-local data is discarded)",
                details={"workspace_id": workspace_id, "created_for": record.identity, "requested": identity},
            )

    # Exec and logs ---------------------------------------------------------------------------------------

    async def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncGenerator[ExecEvent, None]:
        _require_id(spec.workspace_id, "Exec")
        if not spec.argv:
            raise InvalidArgumentError("Exec needs a non-empty argv", details={"field": "argv"})
        if spec.tty:
            raise UnsupportedError(
                "the fake driver has no pseudo-terminals (extensions advertise tty = false); run without a TTY"
            )
        _check_argv(spec.argv, "argv")
        _check_environment(spec.environment, "environment")
        key = self._store.key(spec.workspace_id)
        active = self._active.setdefault(key, set())
        async with self._store.locked(key, cross_process=False):
            # Under the lock: a concurrent Stop either sees this command registered (and kills it) or runs first.
            record = self._running_record(key, spec.workspace_id, "Exec")
            launch = self._exec_launch(key, record, spec)
            try:
                proc = spawn(launch, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            except OSError as exc:
                failure = _spawn_failure(exc, launch)
            else:
                failure = []
                active.add(proc.pid)
        if failure:
            for event in failure:
                yield event
            return
        async with contextlib.aclosing(
            stream_exec(proc, stdin, faults=self.faults, on_finish=lambda: active.discard(proc.pid))
        ) as events:
            async for event in events:
                yield event

    def terminal(self, spec: TerminalSpec, input: AsyncIterator[TerminalInput]) -> AsyncIterator[TerminalEvent]:
        """A terminal session on a host pseudo-terminal, with the exec's user, workdir and environment rules."""
        return self._terminal(spec, input)

    async def _terminal(
        self, spec: TerminalSpec, keys: AsyncIterator[TerminalInput]
    ) -> AsyncGenerator[TerminalEvent, None]:
        _require_id(spec.workspace_id, "ExecPty")
        if not spec.argv:
            raise InvalidArgumentError("ExecPty needs a non-empty argv", details={"field": "argv"})
        _check_argv(spec.argv, "argv")
        _check_environment(spec.environment, "environment")
        key = self._store.key(spec.workspace_id)
        active = self._active.setdefault(key, set())
        async with self._store.locked(key, cross_process=False):
            record = self._running_record(key, spec.workspace_id, "ExecPty")
            launch = self._exec_launch(
                key,
                record,
                ExecSpec(spec.workspace_id, spec.argv, spec.user, spec.workdir, spec.environment),
            )
            launch = replace(launch, argv=spec.argv)  # the exec fault modes are not the terminal's
        started: list[int] = []

        def on_start(pid: int) -> None:
            started.append(pid)
            active.add(pid)

        def on_finish() -> None:
            for pid in started:
                active.discard(pid)

        async with contextlib.aclosing(
            run_terminal(spec, launch, keys, faults=self.faults, on_start=on_start, on_finish=on_finish)
        ) as events:
            async for event in events:
                yield event

    async def logs(self, workspace_id: str) -> AsyncGenerator[bytes, None]:
        """The main process's output so far; a stopped Machine answers with what its last run wrote and is not
        started (its log is kept on disk until Delete or recreation)."""
        _require_id(workspace_id, "Logs")
        key = self._store.key(workspace_id)
        if "logs-starts-machine" in self.faults and self._store.read(key) is not None:
            await self.start(workspace_id)
        if "logs-stopped-refused" in self.faults:
            self._running_record(key, workspace_id, "Logs")
        elif self._store.read(key) is None:
            raise _not_found(workspace_id, "Logs")
        data = read_log_tail(self._store.machine_dir(key), LOG_LIMIT)
        size = _LOGS_WRONG_CHUNK if "logs-wrong-chunks" in self.faults else MAX_CHUNK
        for offset in range(0, len(data), size):
            yield data[offset : offset + size]

    # Services --------------------------------------------------------------------------------------------

    async def set_services(self, workspace_id: str, specs: Sequence[ServiceSpec]) -> tuple[ServiceState, ...]:
        """Make ``specs`` the running Machine's whole service set (``_services``). A bad set is
        INVALID_ARGUMENT and changes nothing; a stopped Machine is FAILED_PRECONDITION."""
        _require_id(workspace_id, "SetServices")
        key = self._store.key(workspace_id)
        async with self._store.locked(key, cross_process=False):
            record = self._running_record(key, workspace_id, "SetServices")
            supervisor = self._services.get(key)
            if supervisor is None:
                supervisor = Supervisor(lambda spec, argv: self._service_launch(key, record, spec, argv), self.faults)
            states = await supervisor.set(specs)
            self._services[key] = supervisor
            return states

    async def service_states(self, workspace_id: str) -> tuple[ServiceState, ...]:
        """The running Machine's services, in start order."""
        _require_id(workspace_id, "ServiceStates")
        key = self._store.key(workspace_id)
        self._running_record(key, workspace_id, "ServiceStates")
        supervisor = self._services.get(key)
        return supervisor.states() if supervisor is not None else ()

    async def service_logs(self, workspace_id: str, name: str, tail_bytes: int = 0) -> bytes:
        """The newest output of service ``name`` (kept across its restarts, bounded)."""
        _require_id(workspace_id, "ServiceLogs")
        key = self._store.key(workspace_id)
        self._running_record(key, workspace_id, "ServiceLogs")
        supervisor = self._services.get(key)
        if supervisor is None:
            raise InvalidArgumentError(f"no service {name!r} in this Machine", details={"field": "name"})
        return supervisor.log_tail(name, tail_bytes)

    def _service_launch(self, key: str, record: MachineRecord, spec: ServiceSpec, argv: Sequence[str]) -> Launch:
        _check_argv(tuple(argv), "argv")
        _check_environment(spec.environment, "environment")
        exec_spec = ExecSpec(record.workspace_id, tuple(argv), spec.user, spec.workdir, spec.environment)
        launch = self._exec_launch(key, record, exec_spec)
        return replace(launch, argv=tuple(argv))  # the exec fault modes are not the services'

    # Helpers ---------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked_record(self, workspace_id: str, rpc: str) -> AsyncIterator[tuple[str, MachineRecord | None]]:
        """The Machine's key and record under its lock (Start/Stop); NOT_FOUND when it is missing, except under
        the ``missing-not-found`` fault, where the record is None."""
        _require_id(workspace_id, rpc)
        key = self._store.key(workspace_id)
        async with self._store.locked(key):
            record = self._store.read(key)
            if record is None and "missing-not-found" not in self.faults:
                raise _not_found(workspace_id, rpc)
            yield key, record

    def _running_record(self, key: str, workspace_id: str, rpc: str) -> MachineRecord:
        record = self._store.read(key)
        if record is None:
            raise _not_found(workspace_id, rpc)
        if record.status != "running":
            raise FailedPreconditionError(
                f"{rpc}: the Machine for workspace {workspace_id!r} is stopped; start it first (vz up)",
                details={"workspace_id": workspace_id},
            )
        return record

    def _values(self, key: str, record: MachineRecord) -> dict[str, str] | None:
        """The Machine's environment values: kept since its creation, or read from an old record (kept from now
        on; the store has rewritten that record without them). None when the Machine has environment variables
        whose values neither this process nor the keyring holds (e.g. after a host restart)."""
        if record.legacy_environment is not None:
            return dict(record.legacy_environment)
        if not record.environment_names:
            return {}
        return self._secrets.get(key, record.id)

    def _keep_legacy(self, key: str, record: MachineRecord) -> None:
        """Keep the values of a record written by an older fake (the store rewrites it without them)."""
        if record.legacy_environment and record.id:
            self._secrets.put(key, record.id, record.legacy_environment)

    def _forget(self, key: str, record: MachineRecord | None) -> None:
        """Halt the Machine (if any) and drop its environment values: it is being removed or replaced."""
        self._halt(key, record)
        if record is not None and record.id:
            self._secrets.drop(key, record.id)

    async def _attach(self, key: str, record: MachineRecord, *, start: bool = False) -> None:
        """A Machine with the ``vz.network`` label: its namespace, joined to its route domain (``_network``)."""
        join = not (start and "network-not-reattached" in self.faults)
        await _network.attach(key, record.labels, resolv="network-no-resolv" not in self.faults, join=join)

    async def _release(self, key: str, record: MachineRecord | None) -> None:
        """Undo ``_attach`` (a halted or removed Machine keeps no namespace and no domain end)."""
        if record is not None:
            await _network.release(key, record.labels)

    def _halt(self, key: str, record: MachineRecord | None) -> None:
        """Kill everything running in the Machine: its main process, the execs this instance started, its services
        and the processes of a saved state."""
        supervisor = self._services.pop(key, None)
        if supervisor is not None:
            supervisor.kill()
        if record is not None:
            stop_main_process(record.main_pid, record.main_started)
            _saved.kill_saved(_saved.raw_groups(self._store.machine_dir(key)))
        for pgid in self._active.get(key, ()):
            kill_group(pgid)

    def _validate_run(self, request: RunImageRequest, key: str) -> MachineRecord:
        """Check the whole request without touching anything; the record to create (id and times unset)."""
        if not request.image:
            raise InvalidArgumentError("RunImage needs a non-empty image", details={"field": "image"})
        if request.image.startswith(INVALID_IMAGE_PREFIX):
            raise InvalidArgumentError(
                f"image {request.image!r} is invalid: the fake driver rejects every image named "
                f"{INVALID_IMAGE_PREFIX}...; use any other non-empty image name",
                details={"field": "image"},
            )
        for mount in request.all_mounts():
            raise UnsupportedError(
                f"mount {_describe_mount(mount)} is not supported: the fake driver supports no mount types "
                "(capabilities.mount_types is empty); remove the mount or use a driver that projects mounts",
                details={"field": "mounts", "target": mount.target},
            )
        requirements = request.host_requirements
        if requirements is not None:
            for name, value in (
                ("cpus", requirements.cpus),
                ("memory_bytes", requirements.memory_bytes),
                ("storage_bytes", requirements.storage_bytes),
            ):
                if value:
                    raise UnsupportedError(
                        f"host_requirements.{name} = {value} is not supported: the fake driver cannot limit "
                        "resources or storage (its extensions declare resource_limits and storage_limits "
                        "false); leave it 0",
                        details={"field": f"host_requirements.{name}"},
                    )
            if requirements.gpu == GpuRequirement.REQUIRED:
                raise UnsupportedError(
                    "a GPU is required but the fake driver has no accelerator; drop the GPU requirement",
                    details={"field": "host_requirements.gpu"},
                )
        if request.platform:
            target_os, _, rest = request.platform.partition("/")
            arch = rest.partition("/")[0]
            host = _host_architecture()
            if target_os != "linux" or arch != host:
                raise UnsupportedError(
                    f"platform {request.platform!r} is not supported: the fake driver runs Machines as host "
                    f"processes, so only linux/{host} works here",
                    details={"field": "platform"},
                )
        labels = request.label_map()
        profile = labels.get("vz.profile", "")
        if profile and profile != "developer":
            raise UnsupportedError(
                f"profile {profile!r} is not supported: the fake driver offers only the 'developer' profile",
                details={"field": "labels", "label": "vz.profile"},
            )
        if "vz.egress" in labels:
            raise UnsupportedError(
                "egress policies are not supported by the fake driver (its extensions declare none); "
                "remove the vz.egress label",
                details={"field": "labels", "label": "vz.egress"},
            )
        if "vz.pids" in labels:
            raise UnsupportedError(
                "a pids limit is not supported by the fake driver: its Machines are plain host processes with no "
                "cgroup of their own (its extensions declare pids_limits false); remove the vz.pids label",
                details={"field": "labels", "label": "vz.pids"},
            )
        _network.validate(labels)
        user = resolve_user(request.user) if request.user else None
        _check_environment(request.environment, "environment")
        argv = _main_argv(request.entrypoint, request.args)
        if argv:
            _check_argv(argv, "entrypoint/args")
            _check_executable(argv[0], request.environment.get("PATH", MINIMAL_PATH), user)
        return MachineRecord(
            workspace_id=request.workspace_id,
            id="",
            created_at="",
            started_at="",
            status="running",
            image=request.image,
            labels=labels,
            user=request.user,
            working_dir=str(self._store.root_dir(key)),
            identity=request.developer_identity(),
            mount_policy=[],
            mounts=[],
            entrypoint=request.entrypoint,
            args=list(request.args),
            environment_names=sorted(request.environment),
        )

    def _start_main_process(self, key: str, record: MachineRecord, values: Mapping[str, str]) -> None:
        """Start the Machine's entrypoint/args (if any) in the background and record its identity."""
        argv = _main_argv(record.entrypoint, tuple(record.args))
        if not argv:
            return
        machine_dir = self._store.machine_dir(key)
        try:
            user = resolve_user(record.user) if record.user else None
        except InvalidArgumentError as exc:
            append_log(machine_dir, f"vz-fake: cannot start the main process: {exc.message}\n")
            return
        root = self._store.root_dir(key)
        launch = Launch(
            argv=argv, cwd=str(root), env=_environment(user, root, values), user=user, netns=_netns(key, record)
        )
        main = start_main_process(launch, machine_dir, keep=LOG_LIMIT)
        if main is not None:
            record.main_pid, record.main_started = main.pid, main.create_time
            self._store.write(key, record)

    def _exec_launch(self, key: str, record: MachineRecord, spec: ExecSpec) -> Launch:
        user_name = spec.user or record.user
        user = resolve_user(user_name) if user_name else None
        root = self._store.root_dir(key)
        cwd = root
        if spec.workdir:
            cwd = root / spec.workdir  # an absolute workdir replaces the root
            if not cwd.is_dir():
                raise InvalidArgumentError(
                    f"workdir {spec.workdir!r} is not a directory (relative paths start at the Machine root)",
                    details={"field": "workdir"},
                )
        argv = spec.argv
        if "exec-shell-reparse" in self.faults:
            argv = ("sh", "-c", " ".join(spec.argv))
        # Without the values (see ``_values``; the running Machine was started with them), the exec gets none.
        env = _environment(user, root, self._values(key, record) or {}, spec.environment)
        return Launch(argv=argv, cwd=str(cwd), env=env, user=user, netns=_netns(key, record))


def _netns(key: str, record: MachineRecord) -> str | None:
    return _network.namespace_for(key) if _network.LABEL in record.labels else None


def _spawn_failure(exc: OSError, launch: Launch) -> list[ExecEvent]:
    """What an exec reports when its command cannot start: shell-style 127/126, or an RPC error."""
    if exc.filename is not None and exc.filename != launch.cwd:
        if isinstance(exc, FileNotFoundError):
            return [ExecOutput("stderr", f"vz-fake: {launch.argv[0]}: command not found\n".encode()), exit_event(127)]
        if isinstance(exc, PermissionError):
            return [ExecOutput("stderr", f"vz-fake: {launch.argv[0]}: permission denied\n".encode()), exit_event(126)]
    if isinstance(exc, PermissionError):
        raise PermissionDeniedError(
            f"cannot start the command as the requested user: {exc.strerror}; the fake driver must run as root "
            "to switch users",
            runtime_message=str(exc),
        ) from exc
    raise RuntimeFailureError(f"cannot start the command: {exc.strerror}", runtime_message=str(exc)) from exc


def _environment(user: HostUser | None, root: Path, *layers: Mapping[str, str]) -> dict[str, str]:
    home = user.home if user is not None else _own_home()
    env = {"PATH": MINIMAL_PATH, "HOME": home}
    for layer in layers:
        env.update(layer)
    env["VZ_MACHINE_ROOT"] = str(root)
    return env


def _own_home() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return "/"


def _main_argv(entrypoint: str, args: tuple[str, ...]) -> tuple[str, ...]:
    return ((entrypoint,) if entrypoint else ()) + tuple(args)


def _check_argv(argv: tuple[str, ...], name: str) -> None:
    for index, arg in enumerate(argv):
        if "\0" in arg:
            raise InvalidArgumentError(f"{name}[{index}] contains a NUL byte", details={"field": name})


def _check_environment(environment: Mapping[str, str], name: str) -> None:
    # Values are secrets: errors name the variable, never its value.
    for key, value in environment.items():
        if not key or "=" in key or "\0" in key:
            raise InvalidArgumentError(
                f"{name} has an invalid variable name {key!r} (empty, or contains '=' or NUL)", details={"field": name}
            )
        if "\0" in value:
            raise InvalidArgumentError(f"{name} variable {key!r} has a value containing NUL", details={"field": name})


def _check_executable(command: str, path: str, user: HostUser | None) -> None:
    if "/" in command and not os.path.isabs(command):
        return  # relative to the Machine root, which only exists once the Machine does
    found = shutil.which(command, path=path) if "/" not in command else command
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise InvalidArgumentError(
            f"entrypoint {command!r} is not an executable file on the Machine's PATH ({path}); "
            "the fake driver runs host commands",
            details={"field": "entrypoint"},
        )


def _describe_mount(mount: Mount) -> str:
    kind = mount.type.label if isinstance(mount.type, MountType) else f"type {int(mount.type)}"
    return f"{kind} {mount.source!r} -> {mount.target!r}"


def _require_id(workspace_id: str, rpc: str) -> None:
    if not workspace_id:
        raise InvalidArgumentError(f"{rpc} needs a non-empty workspace_id", details={"field": "workspace_id"})


def _not_found(workspace_id: str, rpc: str) -> NotFoundError:
    return NotFoundError(
        f"{rpc}: no Machine exists for workspace {workspace_id!r}; create it first (vz up)",
        details={"workspace_id": workspace_id},
    )


def _host_architecture() -> str:
    machine = platform.machine().lower()
    try:
        return _ARCHITECTURES[machine]
    except KeyError:
        raise UnsupportedError(
            f"host architecture {machine!r} is not supported: Machines can only be amd64 or arm64"
        ) from None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@functools.cache
def _version() -> str:
    try:
        return importlib.metadata.version("vz")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"
