"""The qemu driver: Linux Machines as QEMU virtual machines (KVM where it can run the guest, otherwise TCG).

A Machine boots a stock Linux kernel with an initramfs vz builds (busybox, the needed kernel modules, the guest
agent); the image's root filesystem becomes an ext4 root disk on virtio-blk; the guest agent runs as PID 1 from
the initramfs and executes every command chrooted into that disk. The host reaches the agent over virtio-serial
ports (one agent session per port; each host process takes a free port), the workspace, bind mounts and volumes
over virtio-9p, and networking is QEMU user networking (``restrict=on`` under ``vz.egress=deny``).

QEMU runs detached (``-daemonize``, own session) and is found again through the Machine's record (pid plus
kernel start time), its QMP socket and its agent sockets: a relaunched driver finds every Machine in its real
state. See docs/drivers/qemu.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
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
    RuntimeTimeoutError,
    UnavailableError,
    UnsupportedError,
)
from vz_core.paths import cache_dir
from vz_core.paths import state_dir as default_state_root
from vz_drivers.qemu._accel import ACCELERATORS, Accelerator, choose_accelerator
from vz_drivers.qemu._disk import create_root_disk, default_disk_size, find_mke2fs, minimum_disk_size, tree_usage
from vz_drivers.qemu._guestconfig import GuestConfig, GuestMount, env_list, hosts_file, render, resolv_file
from vz_drivers.qemu._identity import resolve_user
from vz_drivers.qemu._initramfs import Initramfs, build_initramfs, find_busybox
from vz_drivers.qemu._kernel import Kernel, extract_vmlinux, find_kernel, resolve_modules
from vz_drivers.qemu._qemu import QemuBinary, Share, VmSpec, find_qemu, launch, proc_start_time
from vz_drivers.qemu._qmp import QmpClient, open_unix
from vz_drivers.qemu._state import MachinePaths, MachineRecord, StateStore, atomic_write, machine_key
from vz_drivers.qemu._validate import HostLimits, check_workspace_id, guest_path, validate_request

__all__ = ["DRIVER_NAME", "QemuDriver"]

DRIVER_NAME = "qemu"
DEFAULT_MEMORY = 512 * 1024 * 1024
DEFAULT_CPUS = 2
_MIB = 1024 * 1024
_OPTIONS = (
    "state_dir",
    "image_dir",
    "qemu",
    "kernel",
    "modules",
    "busybox",
    "accelerator",
    "sessions",
    "stop_timeout",
    "boot_timeout",
    "insecure_registries",
    "agent_binary",
)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vz")
    except Exception:
        return "0.0.0"


def _meminfo_total() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass
class _Conn:
    """This event loop's connection to one Machine's agent, on one virtio-serial port (flock-ed)."""

    pid: int
    start: int
    port: int
    client: Any
    lock_fd: int

    async def close(self) -> None:
        try:
            await self.client.close()
        finally:
            if self.lock_fd >= 0:
                os.close(self.lock_fd)
                self.lock_fd = -1


@dataclass
class _LoopState:
    conns: dict[str, _Conn] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)


@dataclass(frozen=True)
class _Host:
    """What booting needs, resolved once per driver object."""

    qemu: QemuBinary
    kernel: Kernel
    boot_kernel: Path
    initramfs: Initramfs
    accel: Accelerator


class QemuDriver(Driver):
    """Linux Machines as QEMU virtual machines.

    Options (all optional; strings are accepted so the plugin can pass them from its command line):

    * ``state_dir``: where Machines are recorded (default ``<vz state>/drivers/qemu``).
    * ``image_dir``: image store root (default: the shared vz image cache).
    * ``qemu``: path of ``qemu-system-x86_64`` (default: found on PATH).
    * ``kernel``: the guest kernel (default: the newest ``/boot/vmlinuz-*`` with a module tree);
      ``modules``: its module tree (default ``/lib/modules/<release>``).
    * ``busybox``: a statically linked busybox for the initramfs (default ``/bin/busybox``).
    * ``accelerator``: ``auto`` (KVM when it can run the guest kernel, else TCG), ``kvm`` (fail when KVM cannot)
      or ``tcg``.
    * ``sessions``: virtio-serial agent ports per Machine, i.e. how many host processes can talk to one Machine
      at the same time (default 3).
    * ``stop_timeout``: seconds the main process gets after SIGTERM on Stop (default 10); the VM is forced off
      15 s after that.
    * ``boot_timeout``: seconds a boot may take until the agent answers (default 300; TCG is slow).
    * ``insecure_registries``: comma-separated registry hosts reached over plain HTTP (loopback tests).
    * ``agent_binary``: a prebuilt guest agent (default: built from the bundled sources once).
    """

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        image_dir: str | os.PathLike[str] | None = None,
        qemu: str = "",
        kernel: str = "",
        modules: str = "",
        busybox: str = "",
        accelerator: str = "auto",
        sessions: int | str = 3,
        stop_timeout: float | str = 10.0,
        boot_timeout: float | str = 300.0,
        insecure_registries: str | tuple[str, ...] | list[str] = (),
        agent_binary: str = "",
        **unknown: Any,
    ) -> None:
        if unknown:
            raise InvalidArgumentError(
                f"unknown qemu option(s): {', '.join(sorted(unknown))}; known: {', '.join(_OPTIONS)}"
            )
        if accelerator not in ACCELERATORS:
            raise InvalidArgumentError(
                f"accelerator={accelerator!r} is unknown; use one of {', '.join(ACCELERATORS)}",
                details={"option": "accelerator"},
            )
        try:
            self._sessions = int(sessions)
            self._stop_timeout = float(stop_timeout)
            self._boot_timeout = float(boot_timeout)
        except ValueError as exc:
            raise InvalidArgumentError(f"qemu options sessions/stop_timeout/boot_timeout: {exc}") from None
        if not 1 <= self._sessions <= 7:
            raise InvalidArgumentError("sessions must be between 1 and 7", details={"option": "sessions"})
        if self._stop_timeout < 0 or self._boot_timeout <= 0:
            raise InvalidArgumentError("stop_timeout must be >= 0 and boot_timeout > 0")
        root = Path(state_dir) if state_dir else default_state_root() / "drivers" / DRIVER_NAME
        self._store = StateStore(root.absolute())
        self._image_dir = Path(image_dir).absolute() if image_dir else None
        if isinstance(insecure_registries, str):
            insecure_registries = tuple(r for r in insecure_registries.split(",") if r)
        self._insecure = tuple(insecure_registries)
        self._qemu_opt = qemu
        self._kernel_opt = kernel
        self._modules_opt = modules
        self._busybox_opt = busybox
        self._accel_opt = accelerator
        self._agent_opt = agent_binary
        self._images: Any = None
        self._qemu: QemuBinary | None = None
        self._kernel: Kernel | None = None
        self._accel: Accelerator | None = None
        self._host_cache: _Host | None = None
        self._limits = HostLimits(cpus=os.cpu_count() or 1, memory_bytes=_meminfo_total())
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ helpers

    @property
    def state_root(self) -> Path:
        return self._store.root

    def _ls(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopState()
        return state

    def _image_store(self) -> Any:
        if self._images is None:
            from vz_drivers._images import ImageStore

            self._images = ImageStore(self._image_dir, insecure_registries=self._insecure)
        return self._images

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
        if record.status != "running" or not record.qemu_pid:
            return False
        return proc_start_time(record.qemu_pid) == record.qemu_start_time

    def _load(self, workspace_id: str) -> MachineRecord | None:
        check_workspace_id(workspace_id)
        record = self._store.load(machine_key(workspace_id))
        if record is not None and record.workspace_id != workspace_id:
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

    # ------------------------------------------------------------------ host resources (qemu, kernel, initramfs)

    def _find_qemu(self) -> QemuBinary:
        if self._qemu is None:
            self._qemu = find_qemu(self._qemu_opt)
        return self._qemu

    def _find_kernel(self) -> Kernel:
        if self._kernel is None:
            kernel = find_kernel(self._kernel_opt or None, self._modules_opt or None)
            resolve_modules(kernel)  # every needed module present (or built in), before anything else
            self._kernel = kernel
        return self._kernel

    async def _accelerator(self) -> Accelerator:
        if self._accel is None:
            qemu = await asyncio.to_thread(self._find_qemu)
            kernel = await asyncio.to_thread(self._find_kernel)
            self._accel = await choose_accelerator(
                self._accel_opt, qemu=qemu.path, kernel=kernel, cache=cache_dir() / "qemu" / "accel"
            )
        return self._accel

    async def _agent_binary(self) -> Path:
        if self._agent_opt:
            return await asyncio.to_thread(_checked_executable, self._agent_opt)
        from vz_drivers._agent import ensure_agent_binary

        return Path(await asyncio.to_thread(ensure_agent_binary))

    async def _host(self) -> _Host:
        if self._host_cache is None:
            accel = await self._accelerator()
            qemu = self._find_qemu()
            kernel = self._find_kernel()
            agent = await self._agent_binary()
            busybox = await asyncio.to_thread(find_busybox, self._busybox_opt or None)
            await asyncio.to_thread(find_mke2fs)
            base = cache_dir() / "qemu"
            vmlinux = await asyncio.to_thread(extract_vmlinux, kernel, base / "kernels")
            initramfs = await asyncio.to_thread(build_initramfs, kernel, agent, base / "initramfs", busybox=busybox)
            self._host_cache = _Host(
                qemu=qemu, kernel=kernel, boot_kernel=vmlinux or kernel.image, initramfs=initramfs, accel=accel
            )
        return self._host_cache

    def _default_cpus(self, host: _Host) -> int:
        # Under TCG every vCPU is a host thread emulating a CPU: a second one speeds up little (boots are no
        # faster) and competes with everything else on the host. Under KVM vCPUs are nearly free.
        wanted = DEFAULT_CPUS if host.accel.name == "kvm" else 1
        return min(wanted, self._limits.cpus)

    # ------------------------------------------------------------------ discovery

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        runtime_version = ""
        with contextlib.suppress(DriverError):
            qemu = await asyncio.to_thread(self._find_qemu)
            runtime_version = qemu.version
            accel = await self._accelerator()
            runtime_version = f"{qemu.version} ({accel.name})"
        return DriverInfo(
            driver_name=DRIVER_NAME,
            driver_version=_version(),
            runtime_name="qemu",
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
        facts: dict[str, str] = {"state_dir": str(self._store.root), "machine": "q35", "shares": "virtio-9p"}
        accel_name, reason = "", ""
        try:
            qemu = await asyncio.to_thread(self._find_qemu)
            facts["qemu"] = qemu.path
            facts["qemu_version"] = qemu.version
            kernel = await asyncio.to_thread(self._find_kernel)
            facts["kernel"] = str(kernel.image)
            facts["kernel_release"] = kernel.release
            accel = await self._accelerator()
            accel_name, reason = accel.name, accel.reason
        except DriverError as exc:
            reason = f"unavailable: {exc.message}"
        if self._host_cache is not None:
            facts["boot_kernel"] = str(self._host_cache.boot_kernel)
            facts["initramfs"] = self._host_cache.initramfs.digest
        facts["agent_transport"] = f"virtio-serial, {self._sessions} port(s) per Machine"
        facts["egress_allow"] = "QEMU user networking (NAT through the host's sockets)"
        facts["egress_deny"] = "QEMU user networking with restrict=on (nothing leaves the guest)"
        return Extensions(
            target_os=("linux",),
            profiles=("developer",),
            tty=False,
            accelerator=accel_name,
            accelerator_reason=reason,
            snapshots=False,
            egress_policies=(EgressPolicy.ALLOW, EgressPolicy.DENY),
            facts=facts,
            resource_limits=True,
            storage_limits=True,
        )

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        await asyncio.to_thread(self._find_qemu)
        await asyncio.to_thread(self._find_kernel)
        await asyncio.to_thread(find_busybox, self._busybox_opt or None)
        await asyncio.to_thread(find_mke2fs)
        await self._accelerator()

    async def provisioning_preflight(self) -> None:
        await self.preflight()
        await self._host()
        await asyncio.to_thread(self._store.ensure)

    async def target_architecture(self, workspace_id: str) -> str:
        return "amd64"

    # ------------------------------------------------------------------ find / reuse

    async def find(self, workspace_id: str) -> MachineDetails | None:
        record = self._load(workspace_id)
        if record is None:
            return None
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
            if mount.type == "bind" and not await asyncio.to_thread(os.path.isdir, mount.host_path):
                raise FailedPreconditionError(
                    f"Machine {workspace_id!r}: the {mount.target} mount source {mount.source!r} no longer exists "
                    "on the host; restore it or recreate the Machine with `vz up --recreate`",
                    details={"workspace_id": workspace_id, "mount": mount.target},
                )

    # ------------------------------------------------------------------ create

    async def run_image(self, request: RunImageRequest) -> None:
        check_workspace_id(request.workspace_id)
        key = machine_key(request.workspace_id)
        valid = validate_request(request, self._limits)
        host = await self._host()
        # Image, users, disk size: resolved before anything of the Machine is touched.
        store = self._image_store()
        image = await store.resolve(request.image, platform=request.platform or "linux/amd64")
        if image.os != "linux" or image.architecture != "amd64":
            raise UnsupportedError(
                f"image {request.image!r} is for {image.os}/{image.architecture}; the qemu driver runs linux/amd64 "
                "Machines",
                details={"field": "image"},
            )
        rootfs = Path(await store.rootfs(image))
        user = request.user or image.config.user
        resolve_user(rootfs, user, field="user")
        identity_name = request.developer_identity()
        identity = resolve_user(rootfs, identity_name, field="remote_user" if request.remote_user else "user")
        usage = await asyncio.to_thread(tree_usage, rootfs)
        if valid.storage_bytes:
            needed = minimum_disk_size(usage)
            if valid.storage_bytes < needed:
                raise InvalidArgumentError(
                    f"host_requirements.storage_bytes={valid.storage_bytes} cannot hold the image {request.image!r}; "
                    f"ask for at least {needed} bytes",
                    details={"field": "host_requirements.storage_bytes"},
                )
            disk_bytes = valid.storage_bytes // 4096 * 4096
        else:
            disk_bytes = default_disk_size(usage)
        mounts = [
            replace(m, guest_target=guest_path(rootfs, m.target) if m.type != "tmpfs" else m.target)
            for m in valid.mounts
        ]
        argv: list[str]
        if request.entrypoint:
            argv = [request.entrypoint, *request.args]
        else:
            argv = [*image.config.entrypoint, *(request.args or image.config.cmd)]

        await asyncio.to_thread(self._store.ensure)
        async with self._locked(key):
            existing = self._load(request.workspace_id)
            if existing is not None and not request.allow_recreate:
                raise AlreadyExistsError(
                    f"Machine {request.workspace_id!r} already exists; use it, delete it, or recreate it with "
                    "`vz up --recreate`",
                    details={"workspace_id": request.workspace_id},
                )
            staging = self._store.root / "staging"
            await asyncio.to_thread(staging.mkdir, parents=True, exist_ok=True)
            new_disk = staging / f"{key}-{uuid.uuid4().hex[:8]}.img"
            try:
                await create_root_disk(rootfs, new_disk, disk_bytes, image=request.image)
                if existing is not None:
                    # The whole new configuration is valid and its disk exists: now the old Machine goes.
                    await self._halt(existing, graceful=False)
                    await asyncio.to_thread(self._remove_machine_dir, existing)
                record = MachineRecord(
                    workspace_id=request.workspace_id,
                    key=key,
                    machine_id=uuid.uuid4().hex,
                    created_at=_now(),
                    image_ref=request.image,
                    image_digest=image.digest,
                    argv=argv,
                    environment=dict(request.environment),
                    image_env=list(image.config.env),
                    working_dir=image.config.working_dir or "/",
                    user=user,
                    developer_identity=identity_name,
                    labels=valid.labels,
                    mounts=mounts,
                    cpus=valid.cpus or self._default_cpus(host),
                    memory_bytes=valid.memory_bytes or DEFAULT_MEMORY,
                    disk_bytes=disk_bytes,
                    egress=valid.egress,
                    extra={
                        "sessions": self._sessions,
                        "workspace_target": mounts[0].target if request.workspace_mount else "",
                        "identity_uid": identity.uid,
                        "identity_gid": identity.gid,
                    },
                )
                await asyncio.to_thread(self._create_machine_dir, record, new_disk)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    new_disk.unlink()
            try:
                await self._boot(record, host)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self._halt(record, graceful=False)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self._remove_machine_dir, record)
                raise

    def _create_machine_dir(self, record: MachineRecord, disk: Path) -> None:
        paths = self._store.paths(record.key)
        if paths.root.exists():
            # Leftovers of a crashed creation (no record): nothing there belongs to a live Machine.
            shutil.rmtree(paths.root, ignore_errors=True)
        for d in (paths.root, paths.cfg, paths.run):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.replace(disk, paths.disk)
        uid, gid = int(record.extra.get("identity_uid", 0)), int(record.extra.get("identity_gid", 0))
        mounts = []
        for m in record.mounts:
            if m.type == "volume":
                vdir = self._store.volume_dir(m.source)
                data = vdir / "data"
                if not data.exists():
                    data.mkdir(parents=True, mode=0o755)
                    (vdir / "name").write_text(m.source)
                    if uid or gid:
                        os.chown(data, uid, gid)
                m = replace(m, host_path=str(data))
            mounts.append(m)
        record.mounts = mounts
        ws_target = record.extra.get("workspace_target")
        for m in mounts:
            if m.target == ws_target and m.type == "bind" and not m.read_only and (uid or gid):
                _chown_tree(Path(m.host_path), uid, gid)
        self._store.save(record)

    def _remove_machine_dir(self, record: MachineRecord) -> None:
        paths = self._store.paths(record.key)
        with contextlib.suppress(FileNotFoundError):
            paths.record.unlink()
        shutil.rmtree(paths.root, ignore_errors=True)

    # ------------------------------------------------------------------ boot

    def _write_config(self, record: MachineRecord, paths: MachinePaths) -> list[Share]:
        shares: list[Share] = []
        guest_mounts: list[GuestMount] = []
        for m in record.mounts:
            if m.type == "tmpfs":
                guest_mounts.append(GuestMount(target=m.target, read_only=m.read_only, options=m.options))
                continue
            tag = f"vzm{len(shares)}"
            if not os.path.isdir(m.host_path):
                raise FailedPreconditionError(
                    f"Machine {record.workspace_id!r}: the {m.target} mount source {m.source!r} no longer exists on "
                    "the host; restore it or recreate the Machine",
                    details={"workspace_id": record.workspace_id, "mount": m.target},
                )
            shares.append(Share(tag=tag, path=m.host_path, read_only=m.read_only))
            guest_mounts.append(GuestMount(target=m.guest_target or m.target, tag=tag, read_only=m.read_only))
        hostname = "vz-" + record.key[:12]
        config = GuestConfig(
            hostname=hostname,
            mounts=tuple(guest_mounts),
            env=env_list(record.image_env, record.environment),
            argv=tuple(record.argv),
            user=record.user,
            workdir=record.working_dir or "/",
            stop_timeout=self._stop_timeout,
            sessions=int(record.extra.get("sessions", 1)),
            network=True,
            resolv_conf=record.egress == "allow",
        )
        paths.cfg.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(paths.cfg / "config.sh", render(config).encode(), 0o600)
        atomic_write(paths.cfg / "hosts", hosts_file(hostname).encode(), 0o644)
        atomic_write(paths.cfg / "resolv.conf", resolv_file().encode(), 0o644)
        paths.run.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in paths.run.glob("port-*.lock"):
            # Holders of a previous boot's ports keep the old (unlinked) files; this boot starts with fresh ones.
            stale.unlink()
        return shares

    async def _boot(self, record: MachineRecord, host: _Host) -> None:
        paths = self._store.paths(record.key)
        await self._drop_conn(record.key)
        shares = await asyncio.to_thread(self._write_config, record, paths)
        spec = VmSpec(
            name="vz-" + record.key[:12],
            accelerator=host.accel.name,
            cpus=record.cpus,
            memory_mib=max(record.memory_bytes // _MIB, 1),
            kernel=host.boot_kernel,
            initrd=host.initramfs.path,
            disk=paths.disk,
            config_dir=paths.cfg,
            shares=tuple(shares),
            egress=record.egress,
            sessions=int(record.extra.get("sessions", 1)),
        )
        pid, start = await launch(host.qemu.path, spec, paths.run)
        record.qemu_pid, record.qemu_start_time = pid, start
        record.accelerator = host.accel.name
        record.status = "running"
        record.started_at = _now()
        record.exit_code = 0
        record.error = ""
        await asyncio.to_thread(self._store.save, record)
        try:
            await self._wait_ready(record, paths)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await self._kill(record)
            record.status = "stopped"
            record.qemu_pid = 0
            record.qemu_start_time = 0
            record.error = exc.message if isinstance(exc, DriverError) else "boot failed"
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._store.save, record)
            raise

    async def _wait_ready(self, record: MachineRecord, paths: MachinePaths) -> None:
        """Wait for the agent's answer on a port (its READY/HELLO), or for QEMU to die, whichever comes first."""
        connect = asyncio.ensure_future(self._connect(record, timeout=self._boot_timeout))
        died = asyncio.ensure_future(_wait_gone(record.qemu_pid, record.qemu_start_time))
        try:
            await asyncio.wait({connect, died}, return_when=asyncio.FIRST_COMPLETED)
            if connect.done() and not connect.cancelled() and connect.exception() is None:
                self._ls().conns[record.key] = connect.result()
                return
            if not connect.done():
                connect.cancel()
                with contextlib.suppress(BaseException):
                    await connect
            elif not died.done():
                # The connection broke: when the VM is going down, its console says why.
                await asyncio.wait({died}, timeout=5)
        finally:
            died.cancel()
        console = await asyncio.to_thread(_tail, paths.console)
        if died.done() and not died.cancelled():
            failed = [line for line in console.splitlines() if "VZ-INIT-FAILED:" in line]
            detail = failed[-1].split("VZ-INIT-FAILED:", 1)[1].strip() if failed else "see the console log"
            raise RuntimeFailureError(
                f"Machine {record.workspace_id!r} stopped while booting: {detail} ({paths.console})",
                runtime_message=console,
            )
        exc = connect.exception()
        assert exc is not None
        if isinstance(exc, UnavailableError) and "did not answer the handshake" in exc.message:
            raise RuntimeTimeoutError(
                f"Machine {record.workspace_id!r} did not become ready within {self._boot_timeout:g} s "
                f"(console log: {paths.console})",
                runtime_message=console,
            ) from None
        raise exc

    async def _connect(self, record: MachineRecord, *, timeout: float) -> _Conn:  # noqa: ASYNC109
        """Take the first free agent port of the Machine (a cross-process flock) and complete the handshake."""
        paths = self._store.paths(record.key)
        ports = int(record.extra.get("sessions", 1))
        for port in range(ports):
            fd = os.open(paths.port_lock(port), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                from vz_drivers._agent import AgentClient

                reader, writer = await open_unix(paths.agent_socket(port))
                client = await AgentClient.from_streams(reader, writer, wait_ready=True, timeout=timeout)
            except OSError as exc:
                os.close(fd)
                raise UnavailableError(
                    f"cannot reach the guest agent of Machine {record.workspace_id!r}: {exc.strerror or exc}"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            return _Conn(pid=record.qemu_pid, start=record.qemu_start_time, port=port, client=client, lock_fd=fd)
        raise UnavailableError(
            f"all {ports} agent sessions of Machine {record.workspace_id!r} are held by other vz processes; retry "
            "when one finishes (the driver option sessions sets how many a new Machine gets)",
            details={"workspace_id": record.workspace_id},
        )

    async def _conn(self, record: MachineRecord) -> _Conn:
        state = self._ls()
        conn = state.conns.get(record.key)
        if conn is not None and self._current(conn, record):
            return conn
        lock = state.locks.setdefault("conn:" + record.key, asyncio.Lock())
        async with lock:
            conn = state.conns.get(record.key)
            if conn is not None:
                if self._current(conn, record):
                    return conn
                state.conns.pop(record.key, None)
                await conn.close()
            conn = await self._connect(record, timeout=30.0)
            state.conns[record.key] = conn
            return conn

    @staticmethod
    def _current(conn: _Conn, record: MachineRecord) -> bool:
        return conn.pid == record.qemu_pid and conn.start == record.qemu_start_time and not conn.client.closed

    async def _drop_conn(self, key: str) -> None:
        conn = self._ls().conns.pop(key, None)
        if conn is not None:
            await conn.close()

    # ------------------------------------------------------------------ start / stop / delete

    async def start(self, workspace_id: str) -> None:
        record = self._require(workspace_id)
        async with self._locked(record.key):
            record = self._require(workspace_id)
            if self._alive(record):
                return
            host = await self._host()
            await self._halt(record, graceful=False)
            await self._boot(record, host)

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
            await self._halt(record, graceful=False)
            await asyncio.to_thread(self._remove_machine_dir, record)

    async def _halt(self, record: MachineRecord, *, graceful: bool) -> None:
        """Stop the VM (cleanly when ``graceful``: the agent stops everything, syncs, unmounts and powers off),
        then make sure QEMU is gone; the root disk stays."""
        if self._alive(record):
            if graceful:
                await self._graceful(record)
            await self._kill(record)
        await self._drop_conn(record.key)
        if record.status != "stopped" or record.qemu_pid:
            record.status = "stopped"
            record.qemu_pid = 0
            record.qemu_start_time = 0
            if self._store.paths(record.key).record.exists():
                await asyncio.to_thread(self._store.save, record)

    async def _graceful(self, record: MachineRecord) -> None:
        pid, start = record.qemu_pid, record.qemu_start_time
        try:
            async with asyncio.timeout(self._stop_timeout + 15):
                conn = await self._conn(record)
                with contextlib.suppress(DriverError):
                    status = await conn.client.status()
                    if status.main_exit is not None:
                        record.exit_code = status.main_exit.exit_code
                if conn.port == 0:
                    await conn.client.shutdown(grace=self._stop_timeout)
                else:
                    # Only the agent on port 0 is PID 1; SIGTERM makes it stop everything and power off.
                    spec = ExecSpec(workspace_id=record.workspace_id, argv=("/bin/busybox", "kill", "-TERM", "1"))
                    async with contextlib.aclosing(conn.client.exec(spec, _no_input(), root_override="/")) as ev:
                        async for _ in ev:
                            pass
                await _wait_gone(pid, start)
        except (DriverError, TimeoutError):
            pass
        finally:
            await self._drop_conn(record.key)

    async def _kill(self, record: MachineRecord) -> None:
        """Force QEMU off (SIGKILL to the recorded process, after checking it is still that process)."""
        pid, start = record.qemu_pid, record.qemu_start_time
        if not pid or proc_start_time(pid) != start:
            return
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            if proc_start_time(pid) == start:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)
        await _wait_gone(pid, start)

    # ------------------------------------------------------------------ exec / logs

    async def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        if not spec.argv:
            raise InvalidArgumentError("exec needs a non-empty argv", details={"field": "argv"})
        if spec.tty:
            raise UnsupportedError(
                "the qemu driver does not run tty execs (the extension service does not advertise tty)"
            )
        record = self._require(spec.workspace_id)
        if not self._alive(record):
            raise FailedPreconditionError(
                f"Machine {spec.workspace_id!r} is stopped; start it first (`vz up`)",
                details={"workspace_id": spec.workspace_id},
            )
        conn = await self._conn(record)
        full = replace(spec, user=spec.user or record.user, workdir=spec.workdir or record.working_dir)
        # aclosing: a caller that stops early (cancellation) kills the command now, not at garbage collection.
        async with contextlib.aclosing(conn.client.exec(full, stdin)) as events:
            async for event in events:
                yield event

    async def logs(self, workspace_id: str) -> AsyncIterator[bytes]:
        record = self._require(workspace_id)
        if not self._alive(record):
            raise FailedPreconditionError(
                f"Machine {workspace_id!r} is stopped; start it to read its logs",
                details={"workspace_id": workspace_id},
            )
        conn = await self._conn(record)
        async with contextlib.aclosing(conn.client.logs()) as chunks:
            async for chunk in chunks:
                yield chunk

    async def close(self) -> None:
        state = self._ls()
        conns = list(state.conns.values())
        state.conns.clear()
        for conn in conns:
            await conn.close()

    # ------------------------------------------------------------------ diagnostics, cleanup

    async def qmp_status(self, workspace_id: str) -> dict[str, Any]:
        """QEMU's own view of a running Machine (QMP ``query-status``); ``FailedPreconditionError`` when stopped."""
        record = self._require(workspace_id)
        if not self._alive(record):
            raise FailedPreconditionError(f"Machine {workspace_id!r} is stopped")
        async with await QmpClient.connect(self._store.paths(record.key).qmp) as qmp:
            status: dict[str, Any] = await qmp.execute("query-status")
            return status

    async def remove_everything(self) -> None:
        """Delete every Machine of this state directory and its volumes (tests, uninstall)."""
        for record in list(self._store.records()):
            await self.delete(record.workspace_id)
        if self._store.machines_dir.is_dir():
            shutil.rmtree(self._store.machines_dir, ignore_errors=True)
        shutil.rmtree(self._store.volumes_dir, ignore_errors=True)
        shutil.rmtree(self._store.root / "staging", ignore_errors=True)
        await self.close()


async def _no_input() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


async def _wait_gone(pid: int, start: int) -> None:
    """Wait (on a pidfd, no polling) until process ``pid`` with start time ``start`` has exited."""
    if proc_start_time(pid) != start:
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
        if proc_start_time(pid) == start:
            await done
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_bytes()[-limit:].decode(errors="replace")
    except OSError:
        return ""


def _checked_executable(path: str) -> Path:
    p = Path(path)
    if not p.is_file() or not os.access(p, os.X_OK):
        raise UnavailableError(f"agent_binary {path} is not an executable file")
    return p.absolute()


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
