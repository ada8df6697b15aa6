"""The linux_native driver: Linux Machines on a Linux host, run by runc with the guest agent as PID 1.

A Machine is an OCI container whose process is ``vz-agent`` in init mode: a child subreaper that runs the
image's main process (output to a bounded log on the host) and serves execs over a Unix socket in a host
directory bind-mounted at ``/.vz/run``. Exec therefore never spawns runc: the driver talks to the agent over
that socket and the agent forks the command inside the Machine's namespaces and cgroup.

The root filesystem is an overlay of the cached image rootfs (read-only lower) and a per-Machine upper
directory that survives Stop/Start and is discarded on recreation. Every start regenerates the OCI spec from
the Machine's record, so the record (not the runtime) is the source of truth, and a relaunched driver finds
every Machine in its real state (a Machine whose init died is reported stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import shutil
import signal
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vz_core import (
    Capabilities,
    Driver,
    DriverInfo,
    EgressPolicy,
    ExecEvent,
    ExecSpec,
    Extensions,
    MachineConfig,
    MachineDetails,
    MachineMount,
    MachineState,
    MountType,
    RecreateMode,
    RunImageRequest,
)
from vz_core.errors import (
    AlreadyExistsError,
    DriverError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    RuntimeFailureError,
    UnavailableError,
    UnsupportedError,
)
from vz_core.paths import state_dir as default_state_root
from vz_drivers.linux_native._host import HostFacts, host_facts, read_meminfo
from vz_drivers.linux_native._identity import resolve_user
from vz_drivers.linux_native._mounts import is_mounted, mount_overlay, mounts_under, unmount
from vz_drivers.linux_native._network import NetworkConfig, remove_host_table, setup_network
from vz_drivers.linux_native._runc import Runc
from vz_drivers.linux_native._spec import RUN_DIR, build_spec
from vz_drivers.linux_native._state import MachinePaths, MachineRecord, StateStore, atomic_write, machine_key
from vz_drivers.linux_native._validate import check_workspace_id, validate_request

__all__ = ["DRIVER_NAME", "LinuxNativeDriver"]

DRIVER_NAME = "linux_native"
DEFAULT_SUBNET = "10.231.0.0/16"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vz")
    except Exception:
        return "0.0.0"


def _proc_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie process; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _as_bool(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


@dataclass
class _LoopState:
    clients: dict[str, tuple[int, Any]] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)


class LinuxNativeDriver(Driver):
    """Machines as runc containers with their own namespaces, cgroup limits and overlay root layer.

    Options (all optional; strings are accepted so the plugin can pass them from its command line):

    * ``state_dir``: where Machines are recorded (default ``<vz state>/drivers/linux_native``).
    * ``image_dir``: image store root (default: the shared vz image cache).
    * ``runc``: path of runc (default: found on PATH); ``runc_sha256``: pin its checksum (default: trust on
      first use, recorded in ``<state_dir>/trust.json``).
    * ``cgroup_parent``: cgroup directory under which Machines live (default ``vz``).
    * ``subnet``: IPv4 range for Machine veth links with egress allowed (default 10.231.0.0/16).
    * ``stop_timeout``: seconds the main process gets after SIGTERM before everything is killed (default 10).
    * ``insecure_registries``: comma-separated registry hosts reached over plain HTTP (loopback tests).
    * ``agent_binary``: a prebuilt guest agent (default: built from the bundled sources once).
    """

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        image_dir: str | os.PathLike[str] | None = None,
        runc: str = "",
        runc_sha256: str = "",
        cgroup_parent: str = "vz",
        subnet: str = DEFAULT_SUBNET,
        stop_timeout: float | str = 10.0,
        insecure_registries: str | tuple[str, ...] | list[str] = (),
        agent_binary: str = "",
        **unknown: Any,
    ) -> None:
        if unknown:
            raise InvalidArgumentError(
                f"unknown linux_native option(s): {', '.join(sorted(unknown))}; known: state_dir, image_dir, runc, "
                "runc_sha256, cgroup_parent, subnet, stop_timeout, insecure_registries, agent_binary"
            )
        root = Path(state_dir) if state_dir else default_state_root() / "drivers" / DRIVER_NAME
        self._store = StateStore(root.absolute())
        self._image_dir = Path(image_dir).absolute() if image_dir else None
        if isinstance(insecure_registries, str):
            insecure_registries = tuple(r for r in insecure_registries.split(",") if r)
        self._insecure = tuple(insecure_registries)
        self._images: Any = None
        self._facts: HostFacts = host_facts()
        runc_path = runc or shutil.which("runc") or ""
        try:
            self._runc = Runc(runc_path, self._store.runc_root, self._store.trust_file, runc_sha256)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if not cgroup_parent or "/" in cgroup_parent.strip("/") or cgroup_parent.startswith("."):
            raise InvalidArgumentError("cgroup_parent must be a single directory name such as 'vz'")
        self._cgroup_parent = cgroup_parent.strip("/")
        try:
            self._net = NetworkConfig(
                ip=self._facts.ip, nsenter=self._facts.nsenter, nft=self._facts.nft, subnet=subnet
            )
        except ValueError as exc:
            raise InvalidArgumentError(f"subnet {subnet!r}: {exc}") from None
        self._stop_timeout = float(stop_timeout)
        self._agent_binary_opt = agent_binary
        self._agent_binary: str = ""
        # Agent connections and locks belong to one event loop; a driver object may outlive a loop.
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ helpers

    def _ls(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopState()
        return state

    @property
    def state_root(self) -> Path:
        return self._store.root

    def _image_store(self) -> Any:
        if self._images is None:
            from vz_drivers._images import ImageStore

            self._images = ImageStore(self._image_dir, insecure_registries=self._insecure)
        return self._images

    async def _agent(self) -> str:
        if not self._agent_binary:
            if self._agent_binary_opt:
                self._agent_binary = await asyncio.to_thread(_checked_executable, self._agent_binary_opt)
            else:
                from vz_drivers._agent import ensure_agent_binary

                self._agent_binary = str(await asyncio.to_thread(ensure_agent_binary))
        return self._agent_binary

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

    def _alive(self, record: MachineRecord) -> bool:
        if record.status != "running" or not record.init_pid:
            return False
        return _proc_start_time(record.init_pid) == record.init_start_time

    def _load(self, workspace_id: str) -> MachineRecord | None:
        check_workspace_id(workspace_id)
        record = self._store.load(machine_key(workspace_id))
        if record is not None and record.workspace_id != workspace_id:
            # A hash prefix collision would be astronomically unlikely; never confuse two Machines.
            raise RuntimeFailureError("machine key collision; refusing to touch another Machine's state")
        return record

    def _require(self, workspace_id: str) -> MachineRecord:
        record = self._load(workspace_id)
        if record is None:
            raise NotFoundError(
                f"Machine {workspace_id!r} does not exist; create it with RunImage (`vz up`)",
                details={"workspace_id": workspace_id},
            )
        return record

    def _cgroup_path(self, record: MachineRecord) -> str:
        return f"/{self._cgroup_parent}/{record.container_id}"

    # ------------------------------------------------------------------ discovery

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        try:
            runtime_version = await self._runc.get_version()
        except DriverError:
            runtime_version = ""
        return DriverInfo(
            driver_name=DRIVER_NAME,
            driver_version=_version(),
            runtime_name="runc",
            runtime_version=runtime_version,
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
        facts = {
            "runc": self._runc.path,
            "runc_version": self._runc.version,
            "cgroups": self._facts.cgroup_mode,
            "root_layer": "overlayfs" if self._facts.overlayfs else "unavailable",
            "memory_view": "/proc/meminfo generated from the memory limit",
            "cpu_view": "cpuset plus /sys/devices/system/cpu/online generated from the CPU count",
            "egress_allow": f"veth + masquerade from {self._net.subnet}, IPv4 forwarding enabled on the host",
            "egress_deny": "namespace with no link to the host; nftables rejects all but loopback",
            "state_dir": str(self._store.root),
        }
        return Extensions(
            target_os=("linux",),
            profiles=("developer", "hardened"),
            tty=False,
            accelerator="none",
            accelerator_reason="Machines are containers sharing the host kernel; no hardware virtualization",
            snapshots=False,
            egress_policies=(EgressPolicy.ALLOW, EgressPolicy.DENY),
            facts=facts,
            resource_limits=True,
            storage_limits=False,
        )

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        if not self._facts.is_root:
            raise UnavailableError(
                "linux_native needs root (namespaces, cgroups, overlay mounts); run vz as root or pick another driver"
            )
        if not self._facts.overlayfs:
            raise UnavailableError(
                "overlayfs is not available in this kernel; load it with `modprobe overlay` (linux_native needs it "
                "for the Machine-local root layer)"
            )
        if self._facts.cgroup_mode == "none":
            raise UnavailableError("no cgroup filesystem is mounted at /sys/fs/cgroup; mount cgroups first")
        await asyncio.to_thread(self._verify_runc)

    def _verify_runc(self) -> None:
        self._store.ensure()
        os.close(self._runc.verify())

    async def provisioning_preflight(self) -> None:
        await self.preflight()
        missing = self._net.missing_tools("allow")
        if missing:
            raise UnavailableError("linux_native needs " + ", ".join(missing))
        await self._agent()

    async def target_architecture(self, workspace_id: str) -> str:
        return self._facts.architecture

    # ------------------------------------------------------------------ find / reuse

    async def find(self, workspace_id: str) -> MachineDetails | None:
        record = self._load(workspace_id)
        if record is None:
            return None
        return self._details(record)

    def _details(self, record: MachineRecord) -> MachineDetails:
        alive = self._alive(record)
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
        for mount in record.mounts:
            if mount.type == "bind" and not await asyncio.to_thread(os.path.exists, mount.host_path):
                raise FailedPreconditionError(
                    f"Machine {workspace_id!r}: the {mount.target} mount source {mount.source!r} no longer exists "
                    "on the host; restore it or recreate the Machine with `vz up --recreate`",
                    details={"workspace_id": workspace_id, "mount": mount.target},
                )

    # ------------------------------------------------------------------ create

    async def run_image(self, request: RunImageRequest) -> None:
        check_workspace_id(request.workspace_id)
        key = machine_key(request.workspace_id)
        valid = validate_request(request, self._facts, key)
        # Image and users: resolved before anything of the Machine is touched.
        store = self._image_store()
        platform = request.platform or f"linux/{self._facts.architecture}"
        image = await store.resolve(request.image, platform=platform)
        if image.os != "linux" or image.architecture != self._facts.architecture:
            raise UnsupportedError(
                f"image {request.image!r} is for {image.os}/{image.architecture}; this host runs "
                f"linux/{self._facts.architecture} Machines"
            )
        lower = Path(await store.rootfs(image))
        user_spec = request.user or image.config.user
        user = resolve_user(lower, user_spec, field="user")
        identity_name = request.developer_identity()
        identity = resolve_user(lower, identity_name, field="remote_user" if request.remote_user else "user")
        argv: list[str]
        if request.entrypoint:
            argv = [request.entrypoint, *request.args]
        else:
            argv = [*image.config.entrypoint, *(request.args or image.config.cmd)]
        working_dir = image.config.working_dir or "/"
        await self._agent()
        await asyncio.to_thread(self._verify_runc)

        async with self._locked(key):
            existing = self._load(request.workspace_id)
            if existing is not None:
                if not request.allow_recreate:
                    raise AlreadyExistsError(
                        f"Machine {request.workspace_id!r} already exists; use it, delete it, or recreate it with "
                        "`vz up --recreate`",
                        details={"workspace_id": request.workspace_id},
                    )
                # The whole new configuration is valid: now, and only now, the old Machine goes.
                await self._teardown(existing)
                await asyncio.to_thread(self._remove_machine_dir, existing)
            record = MachineRecord(
                workspace_id=request.workspace_id,
                key=key,
                machine_id=uuid.uuid4().hex,
                container_id=f"vz-{key[:24]}",
                created_at=_now(),
                image_ref=request.image,
                image_digest=image.digest,
                lower_dir=str(lower),
                argv=argv,
                environment=dict(request.environment),
                image_env=list(image.config.env),
                working_dir=working_dir,
                user=request.user or image.config.user,
                uid=user.uid,
                gid=user.gid,
                additional_gids=list(user.additional_gids),
                developer_identity=identity_name,
                identity_uid=identity.uid,
                identity_gid=identity.gid,
                labels=valid.labels,
                mounts=list(valid.mounts),
                cpus=valid.cpus,
                cpuset=valid.cpuset,
                memory_bytes=valid.memory_bytes,
                profile=valid.profile,
                egress=valid.egress,
                cap_add=list(valid.cap_add),
                privileged=valid.privileged,
                no_new_privileges=valid.no_new_privileges,
                extra={"workspace_target": valid.mounts[0].target} if request.workspace_mount else {},
            )
            try:
                await asyncio.to_thread(self._create_dirs, record)
                await self._start_locked(record)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self._teardown(record)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self._remove_machine_dir, record)
                raise

    def _create_dirs(self, record: MachineRecord) -> None:
        paths = self._store.paths(record.key)
        if paths.root.exists():
            # Leftovers of a crashed creation (no record): nothing there belongs to a live Machine.
            self._remove_tree(paths)
        for d in (paths.root, paths.upper, paths.work, paths.rootfs, paths.bundle, paths.run, paths.etc):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(paths.run, 0o755)
        # The merged root directory takes the upper directory's owner and mode: copy the image's.
        lower = os.stat(record.lower_dir)
        os.chown(paths.upper, lower.st_uid, lower.st_gid)
        os.chmod(paths.upper, lower.st_mode & 0o7777)
        mounts = []
        for m in record.mounts:
            if m.type == "volume":
                vdir = self._store.volume_dir(m.source)
                data = vdir / "data"
                if not data.exists():
                    data.mkdir(parents=True, mode=0o755)
                    (vdir / "name").write_text(m.source)
                    if record.identity_uid:
                        os.chown(data, record.identity_uid, record.identity_gid)
                m = replace(m, host_path=str(data))
            mounts.append(m)
        record.mounts = mounts
        ws_target = record.extra.get("workspace_target")
        for m in mounts:
            if m.target == ws_target and m.type == "bind" and not m.read_only and record.identity_uid:
                _chown_tree(Path(m.host_path), record.identity_uid, record.identity_gid)
        self._store.save(record)

    # ------------------------------------------------------------------ start / stop / delete

    async def start(self, workspace_id: str) -> None:
        record = self._require(workspace_id)
        async with self._locked(record.key):
            record = self._require(workspace_id)
            if self._alive(record):
                return
            await self._start_locked(record)

    async def _start_locked(self, record: MachineRecord) -> None:
        paths = self._store.paths(record.key)
        agent = await self._agent()
        await self._cleanup_runtime(record)
        await asyncio.to_thread(self._prepare_start, record, paths, agent)
        stderr_fd = os.open(paths.agent_stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        pid_file = paths.bundle / "init.pid"
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
        try:
            try:
                await self._runc.check(
                    "create",
                    "--bundle",
                    str(paths.bundle),
                    "--pid-file",
                    str(pid_file),
                    record.container_id,
                    what=f"creating Machine {record.workspace_id!r}",
                    stdout=stderr_fd,
                    stderr=stderr_fd,
                    log=paths.runc_log,
                    new_session=True,
                    limit=60,
                )
            finally:
                os.close(stderr_fd)
            pid = int(pid_file.read_text().strip())
            start_time = _proc_start_time(pid)
            if start_time is None:
                raise RuntimeFailureError(f"Machine {record.workspace_id!r}: its init process vanished while starting")
            await setup_network(self._net, pid=pid, key=record.key, egress=record.egress)
            await self._runc.check(
                "start", record.container_id, what=f"starting Machine {record.workspace_id!r}", log=paths.runc_log
            )
            record.init_pid = pid
            record.init_start_time = start_time
            record.status = "running"
            record.started_at = _now()
            record.exit_code = 0
            record.error = ""
            await self._wait_agent(record, paths)
            await asyncio.to_thread(self._store.save, record)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await self._cleanup_runtime(record)
            record.status = "stopped"
            record.init_pid = 0
            record.error = str(exc) if isinstance(exc, DriverError) else "start failed"
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._store.save, record)
            raise

    def _prepare_start(self, record: MachineRecord, paths: MachinePaths, agent: str) -> None:
        if not Path(record.lower_dir).is_dir():
            raise FailedPreconditionError(
                f"the image {record.image_ref!r} of Machine {record.workspace_id!r} is no longer in the image cache; "
                "recreate the Machine with `vz up --recreate`"
            )
        hostname = "vz-" + record.key[:12]
        paths.etc.mkdir(parents=True, exist_ok=True, mode=0o700)
        paths.run.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileNotFoundError):
            paths.socket.unlink()
        (paths.etc / "hostname").write_text(hostname + "\n")
        (paths.etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{hostname}\n")
        (paths.etc / "resolv.conf").write_text(_resolv_conf() if record.egress == "allow" else "")
        if record.memory_bytes:
            (paths.etc / "meminfo").write_text(_meminfo(record.memory_bytes))
        if record.cpus:
            (paths.etc / "cpu-online").write_text("0\n" if record.cpus == 1 else f"0-{record.cpus - 1}\n")
        if not is_mounted(paths.rootfs):
            paths.rootfs.mkdir(parents=True, exist_ok=True)
            mount_overlay(Path(record.lower_dir), paths.upper, paths.work, paths.rootfs)
        import json

        spec = build_spec(
            record,
            paths,
            agent_binary=agent,
            agent_args=_agent_args(record, self._stop_timeout),
            env=_merge_env(record.image_env, record.environment),
            cgroups_path=self._cgroup_path(record),
            hostname=hostname,
            swap_limit=self._facts.swap_limit,
        )
        atomic_write(paths.bundle / "config.json", json.dumps(spec, indent=1).encode(), 0o600)

    async def _wait_agent(self, record: MachineRecord, paths: MachinePaths) -> None:
        from vz_drivers._agent import AgentClient

        deadline = asyncio.get_running_loop().time() + 30.0
        delay = 0.001
        while True:
            if _proc_start_time(record.init_pid) != record.init_start_time:
                raise RuntimeFailureError(
                    f"Machine {record.workspace_id!r} stopped while starting",
                    runtime_message=_tail(paths.agent_stderr),
                )
            if paths.socket.exists():
                try:
                    client = await AgentClient.connect_unix(paths.socket, timeout=10)
                except UnavailableError:
                    pass
                else:
                    old = self._ls().clients.pop(record.key, None)
                    if old is not None:
                        await old[1].close()
                    self._ls().clients[record.key] = (record.init_pid, client)
                    return
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeFailureError(
                    f"the guest agent of Machine {record.workspace_id!r} did not come up within 30 s",
                    runtime_message=_tail(paths.agent_stderr),
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _client(self, record: MachineRecord) -> Any:
        from vz_drivers._agent import AgentClient

        entry = self._ls().clients.get(record.key)
        if entry is not None:
            pid, client = entry
            if pid == record.init_pid and not client.closed:
                return client
            await client.close()
            self._ls().clients.pop(record.key, None)
        lock = self._ls().locks.setdefault("client:" + record.key, asyncio.Lock())
        async with lock:
            entry = self._ls().clients.get(record.key)
            if entry is not None and entry[0] == record.init_pid and not entry[1].closed:
                return entry[1]
            client = await AgentClient.connect_unix(self._store.paths(record.key).socket, timeout=10)
            self._ls().clients[record.key] = (record.init_pid, client)
            return client

    async def stop(self, workspace_id: str) -> None:
        record = self._require(workspace_id)
        async with self._locked(record.key):
            record = self._require(workspace_id)
            await self._teardown(record)

    async def _teardown(self, record: MachineRecord) -> None:
        """Stop the Machine's processes and release its runtime resources; keep its data."""
        if self._alive(record):
            await self._graceful_stop(record)
        await self._cleanup_runtime(record)
        if record.status != "stopped" or record.init_pid:
            record.status = "stopped"
            record.init_pid = 0
            record.init_start_time = 0
            if self._store.paths(record.key).record.exists():
                await asyncio.to_thread(self._store.save, record)

    async def _graceful_stop(self, record: MachineRecord) -> None:
        pid, start = record.init_pid, record.init_start_time
        entry = self._ls().clients.pop(record.key, None)
        if entry is not None:
            await entry[1].close()
        client: Any = None
        try:
            client = await self._client(record)
            async with asyncio.timeout(self._stop_timeout + 10):
                status = await client.status()
                if status.main_exit is not None:
                    record.exit_code = status.main_exit.exit_code
                # SIGTERM to the main process, up to stop_timeout of grace, then every process is killed.
                await client.shutdown(grace=self._stop_timeout)
        except (DriverError, TimeoutError):
            pass
        finally:
            self._ls().clients.pop(record.key, None)
            if client is not None:
                await client.close()
        # The agent is PID 1 of the Machine's PID namespace: killing it ends whatever is left in the Machine.
        with contextlib.suppress(ProcessLookupError):
            if _proc_start_time(pid) == start:
                os.kill(pid, signal.SIGKILL)
        await _wait_exit(pid, start, limit=10)

    async def _cleanup_runtime(self, record: MachineRecord) -> None:
        """Remove runc's container (and its cgroup) and unmount the root filesystem; idempotent."""
        entry = self._ls().clients.pop(record.key, None)
        if entry is not None:
            await entry[1].close()
        if (self._store.runc_root / record.container_id).exists():
            await self._runc.delete_force(record.container_id)
        paths = self._store.paths(record.key)
        if mounts_under(paths.rootfs):
            await asyncio.to_thread(unmount, paths.rootfs)

    def _remove_machine_dir(self, record: MachineRecord) -> None:
        self._remove_tree(self._store.paths(record.key))
        self._remove_cgroup_parent()

    def _remove_tree(self, paths: MachinePaths) -> None:
        if mounts_under(paths.root):
            unmount(paths.rootfs)
            if mounts_under(paths.root):
                raise RuntimeFailureError(f"{paths.root} still has mounts; refusing to remove it")
        with contextlib.suppress(FileNotFoundError):
            paths.record.unlink()
        shutil.rmtree(paths.root, ignore_errors=True)

    def _remove_cgroup_parent(self) -> None:
        for base in Path("/sys/fs/cgroup").iterdir() if Path("/sys/fs/cgroup").is_dir() else ():
            for candidate in (base / self._cgroup_parent, Path("/sys/fs/cgroup") / self._cgroup_parent):
                with contextlib.suppress(OSError):
                    candidate.rmdir()

    async def delete(self, workspace_id: str) -> None:
        record = self._load(workspace_id)
        if record is None:
            return
        async with self._locked(record.key):
            record = self._load(workspace_id)
            if record is None:
                return
            await self._teardown(record)
            await asyncio.to_thread(self._remove_machine_dir, record)

    # ------------------------------------------------------------------ exec / logs

    async def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        if not spec.argv:
            raise InvalidArgumentError("exec needs a non-empty argv", details={"field": "argv"})
        if spec.tty:
            raise UnsupportedError("linux_native does not run tty execs (the extension service does not advertise tty)")
        record = self._require(spec.workspace_id)
        if not self._alive(record):
            raise FailedPreconditionError(
                f"Machine {spec.workspace_id!r} is stopped; start it first (`vz up`)",
                details={"workspace_id": spec.workspace_id},
            )
        client = await self._client(record)
        env = dict(spec.environment)
        full = replace(
            spec,
            user=spec.user or record.user,
            workdir=spec.workdir or record.working_dir,
            environment=env,
        )
        async for event in client.exec(full, stdin):
            yield event

    async def logs(self, workspace_id: str) -> AsyncIterator[bytes]:
        record = self._require(workspace_id)
        if not self._alive(record):
            raise FailedPreconditionError(
                f"Machine {workspace_id!r} is stopped; start it to read its logs",
                details={"workspace_id": workspace_id},
            )
        client = await self._client(record)
        async for chunk in client.logs():
            yield chunk

    async def close(self) -> None:
        clients = list(self._ls().clients.values())
        self._ls().clients.clear()
        for _, client in clients:
            await client.close()

    # ------------------------------------------------------------------ cleanup for tests and uninstall

    async def remove_everything(self) -> None:
        """Delete every Machine of this state directory, its volumes and the host NAT table (tests, uninstall)."""
        for record in list(self._store.records()):
            await self.delete(record.workspace_id)
        for cid in self._runc.list_ids():
            await self._runc.delete_force(cid)
        if self._store.machines_dir.is_dir():
            for entry in self._store.machines_dir.iterdir():
                await asyncio.to_thread(self._remove_tree, MachinePaths(entry))
        shutil.rmtree(self._store.volumes_dir, ignore_errors=True)
        await remove_host_table(self._net)
        await asyncio.to_thread(self._remove_cgroup_parent)
        await self.close()


def _agent_args(record: MachineRecord, stop_timeout: float) -> list[str]:
    """Arguments of the guest agent in init mode (the container's process)."""
    args = [
        "serve",
        "--listen",
        f"unix:{RUN_DIR}/agent.sock",
        "--init",
        "--inherit-env",
        "--log",
        f"{RUN_DIR}/main.log",
        "--main-user",
        record.user or "root",
        "--main-workdir",
        record.working_dir or "/",
        "--stop-timeout",
        f"{max(stop_timeout, 0.0):.3f}s",
    ]
    return [*args, "--", *record.argv] if record.argv else args


def _merge_env(image_env: list[str], *layers: Any) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in image_env:
        name, sep, value = item.partition("=")
        if sep:
            env[name] = value
    for layer in layers:
        env.update(layer)
    return env


def _meminfo(limit: int) -> str:
    host = read_meminfo()
    total = limit // 1024
    values = dict(host)
    values["MemTotal"] = total
    for name in ("MemFree", "MemAvailable"):
        values[name] = min(host.get(name, total), total)
    values["SwapTotal"] = 0
    values["SwapFree"] = 0
    return "".join(f"{name + ':':<16}{value:>8} kB\n" for name, value in values.items())


def _resolv_conf() -> str:
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        return ""
    kept = [line for line in lines if not (line.startswith("nameserver") and " 127." in line)]
    return "\n".join(kept) + "\n"


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give the workspace to the developer identity (no symlink following, one filesystem)."""
    dev = os.lstat(root).st_dev
    os.chown(root, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if st.st_dev == dev:
                os.chown(path, uid, gid, follow_symlinks=False)
        dirnames[:] = [d for d in dirnames if os.lstat(os.path.join(dirpath, d)).st_dev == dev]


def _checked_executable(path: str) -> str:
    p = Path(path)
    if not p.is_file() or not os.access(p, os.X_OK):
        raise UnavailableError(f"agent_binary {path} is not an executable file")
    return str(p.absolute())


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_bytes()[-limit:].decode(errors="replace")
    except OSError:
        return ""


async def _wait_exit(pid: int, start: int, limit: float) -> None:
    """Wait until process ``pid`` (with start time ``start``) is gone, on its pidfd; SIGKILL at the deadline."""
    if _proc_start_time(pid) != start:
        return
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def _exited() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, _exited)
    try:
        if _proc_start_time(pid) != start:
            return
        try:
            await asyncio.wait_for(asyncio.shield(done), limit)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            await asyncio.wait_for(asyncio.shield(done), 10)
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    # The process may linger as a zombie until its parent reaps it; that is "gone" for us.
