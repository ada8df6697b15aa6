"""The Driver contract, implemented once for every driver whose Machines run the vz guest agent.

``AgentMachineDriver`` owns what every such driver does the same way: the record book and per-Machine locks,
Find, ReusePreflight, RunImage's order (validate and resolve everything, then replace the old Machine, then
create), Start/Stop/Delete, readiness (the agent answers, or the backend process dies: whichever comes
first, no polling), Exec and Logs through the agent, and cleanup. A ``Backend`` supplies only what differs:
how a Machine is created and booted, how its agent is reached, how it is shut down, and its facts.

Who closes what: the driver owns the agent connections it opens (one per Machine per event loop, closed by
``close()``, by Stop/Delete, and when the backend process changes); an exec's event stream is closed with
``aclosing`` so that a caller who stops early (cancellation) kills the command at once.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import datetime
import errno
import functools
import os
import secrets
import shutil
import subprocess
import sys
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from vz_core import (
    Capabilities,
    Driver,
    DriverInfo,
    EgressPolicy,
    ExecEvent,
    ExecExit,
    ExecSpec,
    Extensions,
    MachineConfig,
    MachineDetails,
    MachineMount,
    MachineState,
    MountType,
    RecreateMode,
    RunImageRequest,
    TerminalEvent,
    TerminalInput,
    TerminalSpec,
)
from vz_core.errors import (
    AlreadyExistsError,
    DriverError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    RuntimeFailureError,
    RuntimeTimeoutError,
    UnavailableError,
    UnsupportedError,
)
from vz_core.options import Options
from vz_core.paths import state_dir as default_state_root
from vz_core.secrets import SecretKeeper
from vz_core.services import ServiceSpec, ServiceState
from vz_drivers._files import STORAGE_ERRNOS, atomic_write, host_write_error, read_chunks_nofollow
from vz_drivers._machine._book import MachinePaths, MachineRecord, MountRecord, RecordBook, machine_key
from vz_drivers._machine._identity import ResolvedUser, resolve_user
from vz_drivers._machine._procs import kill_process, proc_start_time, wait_gone
from vz_drivers._machine._validate import CommonRequest, Rules, check_workspace_id

if TYPE_CHECKING:
    from vz_core.registry import DriverDeclaration
    from vz_drivers._agent import AgentClient

__all__ = [
    "AgentKeys",
    "AgentLink",
    "AgentMachineDriver",
    "Backend",
    "ImageSource",
    "MachinePlan",
    "ResolvedImage",
    "checked_executable",
    "chown_tree",
    "no_input",
    "now",
    "record_fields",
    "tail",
]

SNAPSHOT_LABEL = "vz.workspace"
"""The label whose value ``snapshot`` asks for a snapshot workspace projection."""

R = TypeVar("R", bound=MachineRecord)
P = TypeVar("P", bound=MachinePaths)


def now() -> str:
    """The current UTC time as RFC 3339 with microseconds (record timestamps)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vz")
    except Exception:
        return "0.0.0"


def tail(path: Path, limit: int = 4000) -> str:
    """The last ``limit`` bytes of a host log file, as text ("" when unreadable)."""
    try:
        return path.read_bytes()[-limit:].decode(errors="replace")
    except OSError:
        return ""


def checked_executable(path: str, *, option: str = "agent_binary") -> Path:
    """``path`` made absolute when it is an executable file; ``UnavailableError`` naming ``option`` otherwise."""
    p = Path(path)
    if not p.is_file() or not os.access(p, os.X_OK):
        raise UnavailableError(f"{option} {path} is not an executable file")
    return p.absolute()


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give the workspace to the developer identity (no symlink following, one filesystem).

    Windows: host files have no POSIX owner; the guest sees the share's ownership instead. Nothing to do."""
    if sys.platform == "win32":
        return
    dev = os.lstat(root).st_dev
    os.chown(root, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if st.st_dev == dev:
                os.chown(path, uid, gid, follow_symlinks=False)
        dirnames[:] = [d for d in dirnames if os.lstat(os.path.join(dirpath, d)).st_dev == dev]


@dataclass
class AgentLink:
    """An open, checked connection of this event loop to one Machine's agent (made by ``Backend.connect``)."""

    client: AgentClient
    pid: int
    """The backend process (``MachineRecord.pid``/``pid_start``) this connection belongs to."""
    pid_start: int
    port: int = 0
    """Which of the Machine's channels it uses (backends with several)."""
    release: Callable[[], None] | None = None
    """Called once after the client closed (a backend's port lock)."""

    async def close(self) -> None:
        try:
            await self.client.close()
        finally:
            release, self.release = self.release, None
            if release is not None:
                release()


@dataclass(frozen=True)
class ResolvedImage:
    """An image resolved for a RunImage request, with its users and main command."""

    digest: str
    rootfs: Path
    """The image unpacked on the host, read for its users and mount targets (never copied into a disk)."""
    layers: tuple[tuple[str, Path], ...]
    """``(digest, blob path)`` of every layer, bottom up: what a root disk is written from."""
    env: list[str]
    user: str
    """The Machine's user (request or image)."""
    user_ids: ResolvedUser
    identity_name: str
    identity: ResolvedUser
    argv: list[str]
    working_dir: str


class ImageSource:
    """The shared image store, opened on first use."""

    def __init__(self, image_dir: str | os.PathLike[str] | None, insecure_registries: tuple[str, ...]):
        self._dir = Path(image_dir).absolute() if image_dir else None
        self._insecure = tuple(insecure_registries)
        self._store: Any = None

    def store(self) -> Any:
        if self._store is None:
            from vz_drivers._images import ImageStore

            self._store = ImageStore(self._dir, insecure_registries=self._insecure)
        return self._store

    async def resolve(self, request: RunImageRequest, *, architecture: str, display: str) -> ResolvedImage:
        """Resolve the image, unpack its root filesystem and resolve the request's users in it."""
        store = self.store()
        image = await store.resolve(request.image, platform=request.platform or f"linux/{architecture}")
        if image.os != "linux" or image.architecture != architecture:
            raise UnsupportedError(
                f"image {request.image!r} is for {image.os}/{image.architecture}; {display} runs linux/{architecture} "
                "Machines here",
                details={"field": "image"},
            )
        rootfs = Path(await store.rootfs(image))
        user = request.user or image.config.user
        user_ids = resolve_user(rootfs, user, field="user")
        identity_name = request.developer_identity()
        identity = resolve_user(rootfs, identity_name, field="remote_user" if request.remote_user else "user")
        if request.entrypoint:
            argv = [request.entrypoint, *request.args]
        else:
            argv = [*image.config.entrypoint, *(request.args or image.config.cmd)]
        return ResolvedImage(
            digest=image.digest,
            rootfs=rootfs,
            layers=tuple((layer, store.blob_path(layer)) for layer in image.layers),
            env=list(image.config.env),
            user=user,
            user_ids=user_ids,
            identity_name=identity_name,
            identity=identity,
            argv=argv,
            working_dir=image.config.working_dir or "/",
        )


def record_fields(request: RunImageRequest, key: str, image: ResolvedImage, common: CommonRequest) -> dict[str, Any]:
    """The ``MachineRecord`` fields every backend fills the same way for a new Machine (a backend adds its own,
    or overrides these, when it constructs its record type)."""
    return {
        "workspace_id": request.workspace_id,
        "key": key,
        "machine_id": uuid.uuid4().hex,
        "created_at": now(),
        "image_ref": request.image,
        "image_digest": image.digest,
        "argv": image.argv,
        "environment": dict(request.environment),
        "image_env": image.env,
        "working_dir": image.working_dir,
        "user": image.user,
        "developer_identity": image.identity_name,
        "identity_uid": image.identity.uid,
        "identity_gid": image.identity.gid,
        "labels": common.labels,
        "mounts": list(common.mounts),
        "cpus": common.cpus,
        "memory_bytes": common.memory_bytes,
        "egress": common.egress,
        "extra": {"workspace_target": common.mounts[0].target if request.workspace_mount else ""},
    }


@dataclass
class MachinePlan(Generic[R]):
    """What ``Backend.plan`` decided for a RunImage: the new record plus whatever the backend staged for it."""

    record: R
    staged: dict[str, Any] = field(default_factory=dict)


class Backend(abc.ABC, Generic[R, P]):
    """What one kind of agent Machine does differently. Everything else is ``AgentMachineDriver``'s.

    A backend owns its ``book`` (record and path types) and its host resources; it never keeps Machine state
    in memory that a relaunched driver could not rebuild from the records. Methods that touch one Machine are
    called with that Machine's lock held.
    """

    name: str
    """The driver name ("qemu")."""
    display: str
    """How messages name the driver ("the qemu driver")."""
    runtime_name: str
    book: RecordBook[R, P]
    rules: Rules
    stop_timeout: float
    """Seconds the main process gets after SIGTERM on Stop."""
    stop_slack: float = 10.0
    """How much longer than ``stop_timeout`` a graceful stop may take before the process is killed."""
    boot_timeout: float
    """Seconds a start may take until the agent answers (each backend sets it: from its ``boot_timeout`` option,
    or as its own bound)."""
    graceful_replace: bool = False
    """Whether Delete and recreation stop a running Machine gracefully (else it is killed)."""
    workspace_snapshots: bool = False
    """Whether the ``snapshot`` workspace projection (label ``vz.workspace=snapshot``) is offered: the driver
    copies the worktree into the Machine's directory when it is created (``Extensions.snapshots``)."""
    verify_on_find: bool = False
    """Whether Find of a running Machine checks its agent's identity (a connection and handshake: backends whose
    channel takes any number of connections), so that status never reports a Machine whose agent was replaced
    as running."""
    keep_log_on_stop: bool = False
    """Whether a graceful Stop copies the main log through the agent to ``MachinePaths.kept_log`` (backends
    whose log lives only inside the Machine)."""

    declaration: ClassVar[DriverDeclaration | None] = None
    """The driver's declaration (its registration module's ``DECLARATION``): it declares every option the backend
    accepts, with its type, default and bounds."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        """Check ``options`` with the declaration (unknown keys and refused values are an
        ``InvalidArgumentError`` naming the option) into ``self.options``, the frozen typed ``Options`` the
        backend reads, and take the common ones. ``options`` may already be that ``Options``."""
        if self.declaration is None:
            raise TypeError(f"{type(self).__name__} has no declaration: set the class attribute `declaration`")
        self.options: Options = self.declaration.options_of(options)
        opts = self.options
        root = Path(opts.state_dir) if opts.state_dir else default_state_root() / "drivers" / self.name
        self.state_root = root.absolute()
        self.images = ImageSource(opts.image_dir or None, opts.insecure_registries)
        if "stop_timeout" in opts:
            self.stop_timeout = opts.stop_timeout
        self._agent_option: str = opts.get("agent_binary", "")
        self._agent_path: Path | None = None
        self.agent_keys: AgentKeys | None = None
        """Set by ``AgentMachineDriver``: where the per-boot identity keys of this backend's agents are kept."""

    def new_identity_key(self, record: R) -> bytes:
        """A fresh identity key for this boot of ``record``'s agent (kept in memory and the kernel keyring, never
        on disk). The backend hands it to the agent where the Machine cannot read it."""
        assert self.agent_keys is not None, "the backend is not attached to a driver"
        return self.agent_keys.new(record)

    def identity_key(self, record: R) -> bytes:
        """The identity key of the running boot of ``record``'s agent, for ``AgentClient``'s handshake.

        ``FailedPreconditionError`` when it is gone (the keyring is not available to this process): the agent
        cannot be told from an impostor, so nothing is sent to it; a stop kills the Machine promptly.
        """
        key = self.agent_keys.get(record) if self.agent_keys is not None else None
        if key is None:
            raise FailedPreconditionError(
                f"Machine {record.workspace_id!r}: its agent's identity key is kept in memory only and is not "
                "available to this process (no kernel keyring), so its agent cannot be verified; stop the Machine "
                "and start it again (`vz stop`, `vz up`)",
                details={"workspace_id": record.workspace_id},
            )
        return key

    async def agent_binary(self) -> Path:
        """The guest agent binary: the ``agent_binary`` option checked, or the bundled sources built once."""
        if self._agent_path is None:
            if self._agent_option:
                self._agent_path = await asyncio.to_thread(checked_executable, self._agent_option)
            else:
                from vz_drivers._agent import ensure_agent_binary

                self._agent_path = Path(
                    await asyncio.to_thread(functools.partial(ensure_agent_binary, goos=self.rules.target_os))
                )
        return self._agent_path

    # -- facts

    @abc.abstractmethod
    async def runtime_version(self) -> str:
        """The backend's version for Info ("" when unknown); never raises."""

    storage_limits: bool = False
    """Whether ``host_requirements.storage_bytes`` is enforced."""
    egress_policies: tuple[EgressPolicy, ...] = (EgressPolicy.ALLOW, EgressPolicy.DENY)
    """The egress policies the backend enforces (``Extensions.egress_policies``)."""
    terminals: bool = True
    """Whether terminal sessions are served (``Extensions.terminal``)."""
    shares_host_kernel: bool = False
    """Whether the Machine runs on this host's kernel, so the host's descriptors can become a command's own stdio
    (``exec_local`` hands them to the agent: EXEC_FDS). VM backends copy once between descriptors and frames."""

    def snapshots(self) -> bool:
        """``Extensions.snapshots``: by default whether the workspace snapshot projection is offered."""
        return self.workspace_snapshots

    @abc.abstractmethod
    async def extension_facts(self) -> tuple[dict[str, str], str, str]:
        """Extensions facts: (free-form facts, accelerator name, why that accelerator); never raises."""

    @abc.abstractmethod
    async def preflight(self) -> None:
        """Raise ``UnavailableError`` when this host cannot run Machines."""

    @abc.abstractmethod
    async def provisioning_preflight(self) -> None:
        """``preflight`` plus everything creating a Machine needs (tools, the agent binary)."""

    # -- create and boot

    @abc.abstractmethod
    async def plan(self, request: RunImageRequest, key: str) -> MachinePlan[R]:
        """Validate ``request`` and resolve everything it needs; touch no Machine. Raise naming the field."""

    async def stage(self, plan: MachinePlan[R]) -> None:
        """Build what the new Machine needs while the old one (if any) still exists (e.g. a root disk)."""

    def unstage(self, plan: MachinePlan[R]) -> None:
        """Discard what ``stage`` built and ``make_machine_dir`` did not take (runs in a thread)."""

    @abc.abstractmethod
    def make_machine_dir(self, record: R, plan: MachinePlan[R]) -> None:
        """Create the backend's part of a new Machine's directory (runs in a thread; the record is saved after)."""

    @abc.abstractmethod
    async def boot(self, record: R) -> None:
        """Start the Machine and set ``record.pid``/``pid_start`` to the process whose life is the Machine's.

        Returns once that process runs; readiness is awaited by the driver through ``connect``.
        """

    @abc.abstractmethod
    async def connect(self, record: R, *, booting: bool) -> AgentLink:
        """Open and check a connection to the Machine's agent (``booting``: the first one after ``boot``, which
        may wait for the agent to come up; the driver bounds it with ``boot_timeout`` and races it against the
        process's death). Use ``open_agent_socket`` for Unix sockets."""

    @abc.abstractmethod
    def diagnose(self, record: R) -> tuple[str, str]:
        """A short reason why a start failed (for the message) and the log tail that explains it (runs in a thread)."""

    # -- liveness (the Machine's life is its backend process's, by default)

    def alive(self, record: R) -> bool:
        """Whether the Machine runs: by default, whether its process (``pid`` with ``pid_start``) still lives."""
        if record.status != "running" or not record.pid:
            return False
        return proc_start_time(record.pid) == record.pid_start

    async def wait_gone(self, record: R, limit: float | None = None) -> None:
        """Wait (on a signal, no polling) until the Machine is gone; force it off first at ``limit`` seconds."""
        await wait_gone(record.pid, record.pid_start, limit=limit)

    async def kill(self, record: R) -> None:
        """Force the Machine off now and wait until it is gone (idempotent)."""
        await kill_process(record.pid, record.pid_start)

    # -- stop and remove

    async def shutdown(self, record: R, link: AgentLink) -> None:
        """Ask the agent to stop everything (SIGTERM, ``stop_timeout`` of grace, then kill) and end."""
        await link.client.shutdown(grace=self.stop_timeout)

    def read_log(self, record: R, link: AgentLink) -> AsyncGenerator[bytes, None]:
        """The main process's log of a running Machine, through ``link`` (the driver closes the iterator)."""
        return link.client.logs()

    async def release(self, record: R) -> None:
        """Release the host resources of a start once the process is gone (idempotent)."""

    def stopped_log(self, record: R) -> Path:
        """Where the main process's log of a stopped Machine is on the host (read without following links)."""
        return self.book.paths(record.key).kept_log

    def remove_tree(self, paths: P) -> None:
        """Remove one Machine's directory (runs in a thread; the Machine is stopped)."""
        shutil.rmtree(paths.root, ignore_errors=True)

    async def remove_host_state(self) -> None:
        """Remove what the backend holds on the host besides Machine directories and volumes (tests, uninstall)."""


class AgentKeys:
    """The per-boot identity keys of agents (docs/agent-protocol.md, HELLO ``challenge``): random, one per start,
    kept like environment values (``SecretKeeper``: this process's memory and the kernel keyring of the driver's
    user, never a file), under the Machine's key and id so that a recreated Machine never inherits one."""

    _SUFFIX = ".agent-identity"

    def __init__(self, keeper: SecretKeeper) -> None:
        self._keeper = keeper

    def new(self, record: MachineRecord) -> bytes:
        key = secrets.token_bytes(32)
        self._keeper.put(record.key, record.machine_id + self._SUFFIX, {"key": key.hex()})
        return key

    def get(self, record: MachineRecord) -> bytes | None:
        kept = self._keeper.get(record.key, record.machine_id + self._SUFFIX)
        try:
            return bytes.fromhex(kept["key"]) if kept else None
        except (KeyError, ValueError):
            return None

    def drop(self, record: MachineRecord) -> None:
        self._keeper.drop(record.key, record.machine_id + self._SUFFIX)


def _identity_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the client's ``AgentIdentityError`` (it may have crossed a process boundary)."""
    return isinstance(exc, FailedPreconditionError) and exc.details.get("agent_identity") == "failed"


@dataclass
class _LoopState:
    links: dict[str, AgentLink] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)


async def _no_input() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


class AgentMachineDriver(Driver, Generic[R, P]):
    """A ``vz_core.Driver`` for Machines that run the vz guest agent, over a ``Backend``."""

    def __init__(self, backend: Backend[R, P]) -> None:
        self._backend = backend
        self._store: RecordBook[R, P] = backend.book
        self._secrets = SecretKeeper(self._store.root)
        backend.agent_keys = AgentKeys(self._secrets)
        # Agent connections and locks belong to one event loop; a driver object may outlive a loop.
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()

    @property
    def state_root(self) -> Path:
        return self._store.root

    # ------------------------------------------------------------------ helpers

    def _ls(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopState()
        return state

    @contextlib.asynccontextmanager
    async def _locked(self, key: str) -> AsyncIterator[None]:
        lock = self._ls().locks.setdefault(key, asyncio.Lock())
        async with lock:
            cm = self._store.locked(key)
            await asyncio.to_thread(cm.__enter__)
            try:
                yield
            finally:
                cm.__exit__(None, None, None)

    def _alive(self, record: R) -> bool:
        return self._backend.alive(record)

    def _load(self, workspace_id: str) -> R | None:
        check_workspace_id(workspace_id)
        record = self._store.load(machine_key(workspace_id))
        if record is not None and record.workspace_id != workspace_id:
            # A hash prefix collision would be astronomically unlikely; never confuse two Machines.
            raise RuntimeFailureError("machine key collision; refusing to touch another Machine's state")
        return record

    def _require(self, workspace_id: str) -> R:
        record = self._load(workspace_id)
        if record is None:
            raise NotFoundError(
                f"Machine {workspace_id!r} does not exist; create it with RunImage (`vz up`)",
                details={"workspace_id": workspace_id},
            )
        return record

    def _require_running(self, workspace_id: str) -> R:
        record = self._require(workspace_id)
        if not self._alive(record):
            raise FailedPreconditionError(
                f"Machine {workspace_id!r} is stopped; start it first (`vz up`)",
                details={"workspace_id": workspace_id},
            )
        return record

    # ------------------------------------------------------------------ discovery

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        return DriverInfo(
            driver_name=self._backend.name,
            driver_version=_version(),
            runtime_name=self._backend.runtime_name,
            runtime_version=await self._backend.runtime_version(),
            capabilities=Capabilities(
                mount_types=(MountType.BIND, MountType.VOLUME, MountType.TMPFS),
                requires_mount_streaming=False,
                requires_workspace_chown=False,
                recreate_mode=RecreateMode.ON_RUN if supports_recreate_on_run else RecreateMode.DELETE,
                provisioning_preflight=True,
                reprovision=False,
                logs=True,
                reuse_preflight=True,
            ),
        )

    async def extensions(self) -> Extensions | None:
        facts, accelerator, reason = await self._backend.extension_facts()
        return Extensions(
            target_os=(self._backend.rules.target_os,),
            profiles=self._backend.rules.profiles,
            tty=False,
            accelerator=accelerator,
            accelerator_reason=reason,
            snapshots=self._backend.snapshots(),
            egress_policies=self._backend.egress_policies,
            facts=facts,
            resource_limits=True,
            storage_limits=self._backend.storage_limits,
            terminal=self._backend.terminals,
            pids_limits=self._backend.rules.pids_limits,
            services=True,
        )

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        await self._backend.preflight()

    async def provisioning_preflight(self) -> None:
        await self._backend.provisioning_preflight()

    async def target_architecture(self, workspace_id: str) -> str:
        return self._backend.rules.architecture

    # ------------------------------------------------------------------ find / reuse

    async def find(self, workspace_id: str) -> MachineDetails | None:
        record = self._load(workspace_id)
        if record is None:
            return None
        alive = self._alive(record)
        if alive and self._backend.verify_on_find:
            record, alive = await self._verify(record)
        state = MachineState(
            status="running" if alive else "stopped",
            started_at=record.started_at,
            exit_code=0 if alive else record.exit_code,
            error="" if alive else record.error,
        )
        mounts = tuple(MachineMount(type=m.type, source=m.source, destination=m.target) for m in record.mounts)
        return MachineDetails(
            id=record.machine_id,
            created_at=record.created_at,
            state=state,
            config=MachineConfig(labels=dict(record.labels), working_dir=record.working_dir, user=record.user),
            mounts=mounts,
        )

    async def reuse_preflight(self, workspace_id: str, remote_user: str) -> None:
        record = self._require(workspace_id)
        identity = remote_user or "root"
        if identity != record.developer_identity:
            raise FailedPreconditionError(
                f"Machine {workspace_id!r} was created for developer identity {record.developer_identity!r} "
                f"(workspace owned by it), not {identity!r}; recreate it with `vz up --recreate` to change the "
                "identity",
                details={"workspace_id": workspace_id, "created_for": record.developer_identity, "requested": identity},
            )
        present = os.path.isdir if self._backend.rules.bind_dirs_only else os.path.exists
        for mount in record.mounts:
            if mount.type == "bind" and not await asyncio.to_thread(present, mount.host_path):
                raise FailedPreconditionError(
                    f"Machine {workspace_id!r}: the {mount.target} mount source {mount.source!r} no longer exists "
                    "on the host; restore it or recreate the Machine with `vz up --recreate`",
                    details={"workspace_id": workspace_id, "mount": mount.target},
                )

    # ------------------------------------------------------------------ create

    async def run_image(self, request: RunImageRequest) -> None:
        check_workspace_id(request.workspace_id)
        key = machine_key(request.workspace_id)
        # Everything is validated and resolved before anything of a Machine is touched.
        plan = await self._backend.plan(request, key)
        record = plan.record
        await asyncio.to_thread(self._store.ensure)
        async with self._locked(key):
            existing = self._load(request.workspace_id)
            if existing is not None and not request.allow_recreate:
                raise AlreadyExistsError(
                    f"Machine {request.workspace_id!r} already exists; use it, delete it, or recreate it with "
                    "`vz up --recreate`",
                    details={"workspace_id": request.workspace_id},
                )
            created = False
            try:
                try:
                    await self._backend.stage(plan)
                    if existing is not None:
                        # The whole new configuration is valid: now, and only now, the old Machine goes.
                        await self._halt(existing, graceful=self._backend.graceful_replace)
                        await asyncio.to_thread(self._remove_machine_dir, existing)
                    created = True
                    await asyncio.to_thread(self._create_machine_dir, record, plan)
                finally:
                    await asyncio.to_thread(self._backend.unstage, plan)
                await self._boot(record)
            except BaseException:
                if created:
                    with contextlib.suppress(Exception):
                        await self._halt(record, graceful=False)
                    with contextlib.suppress(Exception):
                        await asyncio.to_thread(self._remove_machine_dir, record)
                raise

    def _create_machine_dir(self, record: R, plan: MachinePlan[R]) -> None:
        try:
            self._make_machine_dir(record, plan)
        except OSError as exc:
            # A full or read-only state disk is the host's condition, not a bug: say which file and what to do.
            raise host_write_error(exc.filename or self._store.paths(record.key).root, exc) from None

    def _make_machine_dir(self, record: R, plan: MachinePlan[R]) -> None:
        paths = self._store.paths(record.key)
        if paths.root.exists():
            # Leftovers of a crashed creation (no record): nothing there belongs to a live Machine.
            self._backend.remove_tree(paths)
        for d in (paths.root, paths.chan, paths.run):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._backend.make_machine_dir(record, plan)
        uid, gid = record.identity_uid, record.identity_gid
        mounts = []
        for m in record.mounts:
            if m.type == "volume":
                vdir = self._store.volume_dir(m.source)
                data = vdir / "data"
                if not data.exists():
                    data.mkdir(parents=True, mode=0o755)
                    (vdir / "name").write_text(m.source)
                    if sys.platform != "win32" and (uid or gid):  # (no POSIX owners on Windows)
                        os.chown(data, uid, gid)
                m = replace(m, host_path=str(data))
            mounts.append(m)
        ws_target = record.extra.get("workspace_target")
        if record.labels.get(SNAPSHOT_LABEL) == "snapshot" and self._backend.workspace_snapshots:
            mounts = [
                replace(m, host_path=str(self._snapshot(m, paths))) if m.target == ws_target and m.type == "bind" else m
                for m in mounts
            ]
        record.mounts = mounts
        for m in mounts:
            if m.target == ws_target and m.type == "bind" and not m.read_only and (uid or gid):
                chown_tree(Path(m.host_path), uid, gid)
        self._store.save(record)

    @staticmethod
    def _snapshot(mount: MountRecord, paths: MachinePaths) -> Path:
        """A point-in-time copy of the worktree for a ``snapshot`` projection (reflinks where the filesystem
        has them, else a full copy); it lives and goes with the Machine's directory."""
        copy = paths.root / "workspace"
        source = mount.host_path or mount.source
        result = subprocess.run(
            ["cp", "--reflink=auto", "-a", "--no-target-directory", "--", source, str(copy)],
            capture_output=True,
            check=False,
        )
        if result.returncode != 0:
            raise host_write_error(
                str(copy), OSError(errno.EIO, result.stderr.decode(errors="replace").strip() or "cp failed")
            )
        return copy

    def _remove_machine_dir(self, record: R) -> None:
        self._secrets.drop(record.key, record.machine_id)
        AgentKeys(self._secrets).drop(record)
        paths = self._store.paths(record.key)
        with contextlib.suppress(FileNotFoundError):
            paths.record.unlink()
        self._backend.remove_tree(paths)

    # ------------------------------------------------------------------ boot and readiness

    def _secret_environment(self, record: R) -> None:
        """Give ``record`` its environment values (kept in memory only, never in its file) before a start."""
        if record.environment:
            # A new Machine, or a record an earlier version wrote with its values (saved without them now).
            self._secrets.put(record.key, record.machine_id, record.environment)
        elif record.environment_names:
            values = self._secrets.get(record.key, record.machine_id)
            if values is None:
                raise FailedPreconditionError(
                    f"Machine {record.workspace_id!r}: its environment values "
                    f"({', '.join(record.environment_names)}) are kept in memory only and are gone (the host "
                    "restarted, or no kernel keyring is available to this driver); recreate the Machine with "
                    "`vz up --recreate` to give them again",
                    details={"workspace_id": record.workspace_id},
                )
            record.environment = values

    async def _boot(self, record: R) -> None:
        await self._drop_link(record.key)
        with contextlib.suppress(FileNotFoundError):
            self._store.paths(record.key).kept_log.unlink()
        try:
            self._secret_environment(record)
            try:
                await self._backend.boot(record)
            except OSError as exc:
                if exc.errno not in STORAGE_ERRNOS:
                    raise
                raise host_write_error(exc.filename or self._store.paths(record.key).root, exc) from None
            record.status = "running"
            record.started_at = now()
            record.exit_code = 0
            record.error = ""
            await asyncio.to_thread(self._store.save, record)
            await self._wait_ready(record)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await self._backend.kill(record)
            with contextlib.suppress(Exception):
                await self._backend.release(record)
            record.status = "stopped"
            record.pid = 0
            record.pid_start = 0
            record.error = exc.message if isinstance(exc, DriverError) else "start failed"
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._store.save, record)
            raise

    async def _wait_ready(self, record: R) -> None:
        """Wait for the agent's answer, or for the backend process to die, whichever comes first."""
        limit = self._backend.boot_timeout
        connect = asyncio.ensure_future(self._backend.connect(record, booting=True))
        died = asyncio.ensure_future(self._backend.wait_gone(record))
        timed_out = False
        try:
            done, _ = await asyncio.wait({connect, died}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            if connect in done and not connect.cancelled() and connect.exception() is None:
                self._ls().links[record.key] = connect.result()
                return
            if not connect.done():
                timed_out = not done
                connect.cancel()
                with contextlib.suppress(BaseException):
                    await connect
            elif not died.done():
                # The connection broke: when the Machine is going down, its log says why.
                await asyncio.wait({died}, timeout=5)
        finally:
            if not connect.done():
                connect.cancel()
            died.cancel()
            with contextlib.suppress(BaseException):
                await died
        detail, log = await asyncio.to_thread(self._backend.diagnose, record)
        if died.done() and not died.cancelled():
            raise RuntimeFailureError(
                f"Machine {record.workspace_id!r} stopped while starting: {detail}", runtime_message=log
            )
        if timed_out:
            raise RuntimeTimeoutError(
                f"Machine {record.workspace_id!r} did not become ready within {limit:g} s ({detail})",
                runtime_message=log,
            )
        exc = connect.exception()
        assert exc is not None
        raise exc

    async def _link(self, record: R) -> AgentLink:
        state = self._ls()
        link = state.links.get(record.key)
        if link is not None and self._current(link, record):
            return link
        lock = state.locks.setdefault("link:" + record.key, asyncio.Lock())
        async with lock:
            link = state.links.get(record.key)
            if link is not None:
                if self._current(link, record):
                    return link
                state.links.pop(record.key, None)
                await link.close()
            link = await self._backend.connect(record, booting=False)
            state.links[record.key] = link
            return link

    async def _checked_link(self, record: R) -> AgentLink:
        """``_link``, and when the process on the channel fails the agent's identity check: the Machine is
        stopped by the kernel's means (``Backend.kill``), its record says why, and the error is raised."""
        try:
            return await self._link(record)
        except DriverError as exc:
            if _identity_failed(exc):
                await self._condemn(record, exc)
            raise

    async def _verify(self, record: R) -> tuple[R, bool]:
        """Find's check of a running Machine's agent: (the record as it is now, whether it runs). Only a failed
        identity check changes the answer; an agent that is busy or unreachable right now is still running."""
        try:
            async with asyncio.timeout(5.0):
                await self._checked_link(record)
        except DriverError as exc:
            if _identity_failed(exc):
                return self._load(record.workspace_id) or record, False
        except TimeoutError:
            pass
        return record, True

    async def _condemn(self, record: R, exc: DriverError) -> None:
        """Kill a Machine whose agent was replaced (nothing more is sent to the impostor) and record why."""
        async with self._locked(record.key):
            current = self._load(record.workspace_id)
            if current is None or current.pid != record.pid or current.pid_start != record.pid_start:
                return  # already stopped or restarted meanwhile
            current.error = exc.message
            await self._halt(current, graceful=False)  # kills, releases, saves the record with the error

    @staticmethod
    def _current(link: AgentLink, record: MachineRecord) -> bool:
        return link.pid == record.pid and link.pid_start == record.pid_start and not link.client.closed

    async def _drop_link(self, key: str) -> None:
        link = self._ls().links.pop(key, None)
        if link is not None:
            await link.close()

    # ------------------------------------------------------------------ start / stop / delete

    async def start(self, workspace_id: str) -> None:
        record = self._require(workspace_id)
        async with self._locked(record.key):
            record = self._require(workspace_id)
            if self._alive(record):
                return
            await self._halt(record, graceful=False)
            await self._boot(record)

    async def stop(self, workspace_id: str) -> None:
        record = self._require(workspace_id)
        async with self._locked(record.key):
            record = self._require(workspace_id)
            await self._halt(record, graceful=True)

    async def delete(self, workspace_id: str) -> None:
        record = self._load(workspace_id)
        if record is None:
            return
        async with self._locked(record.key):
            record = self._load(workspace_id)
            if record is None:
                return
            await self._halt(record, graceful=self._backend.graceful_replace)
            await asyncio.to_thread(self._remove_machine_dir, record)

    async def _halt(self, record: R, *, graceful: bool) -> None:
        """Stop the Machine (cleanly when ``graceful``), make sure its process is gone, release the start's host
        resources; the Machine's data stays."""
        if self._alive(record):
            if graceful:
                await self._graceful(record)
            await self._backend.kill(record)
        await self._drop_link(record.key)
        await self._backend.release(record)
        if record.status != "stopped" or record.pid:
            record.status = "stopped"
            record.pid = 0
            record.pid_start = 0
            if self._store.paths(record.key).record.exists():
                await asyncio.to_thread(self._store.save, record)

    async def _graceful(self, record: R) -> None:
        try:
            async with asyncio.timeout(self._backend.stop_timeout + self._backend.stop_slack):
                link = await self._link(record)
                with contextlib.suppress(DriverError):
                    status = await link.client.status()
                    if status.main_exit is not None:
                        record.exit_code = status.main_exit.exit_code
                if self._backend.keep_log_on_stop:
                    await self._keep_log(record, link)
                await self._backend.shutdown(record, link)
                await self._backend.wait_gone(record)
        except DriverError as exc:
            if _identity_failed(exc):
                record.error = exc.message  # the impostor is told nothing: _halt kills the Machine now
        except TimeoutError:
            pass
        finally:
            await self._drop_link(record.key)

    async def _keep_log(self, record: R, link: AgentLink) -> None:
        chunks: list[bytes] = []
        with contextlib.suppress(DriverError):
            async with contextlib.aclosing(self._backend.read_log(record, link)) as stream:
                async for chunk in stream:
                    chunks.append(chunk)
            await asyncio.to_thread(atomic_write, self._store.paths(record.key).kept_log, b"".join(chunks), 0o600)

    # ------------------------------------------------------------------ exec / logs

    async def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        if not spec.argv:
            raise InvalidArgumentError("exec needs a non-empty argv", details={"field": "argv"})
        if spec.tty:
            raise UnsupportedError(
                f"{self._backend.display} does not run tty execs (the extension service does not advertise tty)"
            )
        record = self._require_running(spec.workspace_id)
        link = await self._checked_link(record)
        full = replace(spec, user=spec.user or record.user, workdir=spec.workdir or record.working_dir)
        # aclosing: a caller that stops early (cancellation) kills the command now, not at garbage collection.
        async with contextlib.aclosing(link.client.exec(full, stdin)) as events:
            async for event in events:
                yield event

    async def exec_local(self, machine_id: str, spec: ExecSpec, stdio: tuple[int, int, int]) -> ExecExit:
        """``Driver.exec_local``. A Machine on this host's kernel (``Backend.shares_host_kernel``) gets the
        descriptors themselves: the agent starts the command with exactly them as its stdin, stdout and stderr
        (EXEC_FDS; nothing is copied on the host). Other Machines, and agents that predate EXEC_FDS, get the
        copying default (one copy, between the descriptors and agent frames)."""
        if not self._backend.shares_host_kernel:
            return await super().exec_local(machine_id, spec, stdio)
        if not spec.argv:
            raise InvalidArgumentError("exec needs a non-empty argv", details={"field": "argv"})
        if spec.tty:
            raise InvalidArgumentError("exec_local runs commands without a terminal (tty=False); use terminal()")
        record = self._require_running(machine_id)
        link = await self._checked_link(record)
        if "exec_fds" not in link.client.info.features:
            return await super().exec_local(machine_id, spec, stdio)
        full = replace(
            spec, workspace_id=machine_id, user=spec.user or record.user, workdir=spec.workdir or record.working_dir
        )
        return await link.client.exec_fds(full, stdio)

    async def terminal(self, spec: TerminalSpec, input: AsyncIterator[TerminalInput]) -> AsyncIterator[TerminalEvent]:
        """A terminal session through the guest agent: the pseudo-terminal is allocated inside the Machine."""
        if not spec.argv:
            raise InvalidArgumentError("a terminal session needs a non-empty argv", details={"field": "argv"})
        record = self._require_running(spec.workspace_id)
        link = await self._checked_link(record)
        full = replace(spec, user=spec.user or record.user, workdir=spec.workdir or record.working_dir)
        async with contextlib.aclosing(link.client.terminal(full, input)) as events:
            async for event in events:
                yield event

    async def logs(self, workspace_id: str) -> AsyncIterator[bytes]:
        record = self._require(workspace_id)
        if not self._alive(record):
            # A stopped Machine's completed log, from the host; the Machine is not started for it.
            path = self._backend.stopped_log(record)
            for chunk in await asyncio.to_thread(lambda: list(read_chunks_nofollow(path))):
                yield chunk
            return
        link = await self._checked_link(record)
        async with contextlib.aclosing(self._backend.read_log(record, link)) as chunks:
            async for chunk in chunks:
                yield chunk

    # ------------------------------------------------------------------ services

    async def set_services(self, workspace_id: str, specs: Sequence[ServiceSpec]) -> tuple[ServiceState, ...]:
        """Make ``specs`` the running Machine's service set, supervised by its agent (``vz_core.services``).

        A service without a user or working directory gets the Machine's. ``InvalidArgumentError`` for a bad
        set (nothing changes), ``FailedPreconditionError`` for a stopped Machine, ``UnsupportedError`` for an
        agent that predates services.
        """
        record = self._require_running(workspace_id)
        link = await self._checked_link(record)
        full = [replace(s, user=s.user or record.user, workdir=s.workdir or record.working_dir) for s in specs]
        return await link.client.set_services(full)

    async def service_states(self, workspace_id: str) -> tuple[ServiceState, ...]:
        """The running Machine's service states, in start order."""
        record = self._require_running(workspace_id)
        link = await self._checked_link(record)
        return await link.client.service_states()

    async def service_logs(self, workspace_id: str, name: str, tail_bytes: int = 0) -> bytes:
        """The newest output of service ``name`` of the running Machine."""
        record = self._require_running(workspace_id)
        link = await self._checked_link(record)
        return await link.client.service_logs(name, tail_bytes=tail_bytes)

    async def delete_volume(self, name: str) -> None:
        """Remove the named volume's data (idempotent: a missing volume is success).

        ``FailedPreconditionError`` while a Machine of this driver (running or stopped) still mounts it.
        """
        if not name:
            raise InvalidArgumentError("a volume name is required", details={"field": "name"})
        users = sorted(
            r.workspace_id
            for r in await asyncio.to_thread(lambda: list(self._store.records()))
            if any(m.type == "volume" and m.source == name for m in r.mounts)
        )
        if users:
            raise FailedPreconditionError(
                f"volume {name!r} is still mounted by Machine(s) {', '.join(map(repr, users))}; delete them first",
                details={"volume": name},
            )
        await asyncio.to_thread(shutil.rmtree, self._store.volume_dir(name), True)

    async def close(self) -> None:
        state = self._ls()
        links = list(state.links.values())
        state.links.clear()
        for link in links:
            await link.close()

    # ------------------------------------------------------------------ cleanup for tests and uninstall

    async def remove_everything(self) -> None:
        """Delete every Machine of this state directory, its volumes and the backend's host state."""
        for record in list(self._store.records()):
            await self.delete(record.workspace_id)
        await self._backend.remove_host_state()
        if self._store.machines_dir.is_dir():
            for entry in list(self._store.machines_dir.iterdir()):
                await asyncio.to_thread(self._backend.remove_tree, self._store.paths(entry.name))
        shutil.rmtree(self._store.volumes_dir, ignore_errors=True)
        await self.close()


def no_input() -> AsyncIterator[bytes]:
    """An empty stdin for execs the driver runs itself."""
    return _no_input()
