"""The qemu driver: Linux Machines as QEMU virtual machines (KVM where it can run the guest, otherwise TCG).

A Machine boots a stock Linux kernel with an initramfs vz builds (busybox, the needed kernel modules, the guest
agent); the image's root filesystem becomes an ext4 root disk on virtio-blk; the guest agent runs as PID 1 from
the initramfs and executes every command chrooted into that disk. The host reaches the agent over virtio-serial
ports (one agent session per port; each host process takes a free port), the workspace, bind mounts and volumes
over virtio-9p, and networking is QEMU user networking (``restrict=on`` under ``vz.egress=deny``; under ``allow``
QEMU runs in a network namespace of its own whose only way out is a guarded veth: ``_egress.py``) or, for a
version 2 Machine, tap devices in its route domain.

QEMU runs detached (``-daemonize``, own session) and is found again through the Machine's record (pid plus
kernel start time), its QMP socket and its agent sockets: a relaunched driver finds every Machine in its real
state. The agent sockets are created by QEMU in a host directory the guest cannot reach, and are used only when
QEMU itself listens on them. See docs/drivers/qemu.md.

Everything every agent-Machine driver does the same way lives in ``vz_drivers._machine``; this module is the
QEMU backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import shutil
import stat
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vz_core import ExecOutput, ExecSpec, RunImageRequest
from vz_core.errors import DriverError, FailedPreconditionError, InvalidArgumentError, UnavailableError
from vz_core.paths import cache_dir
from vz_core.platform.locks import lock_file
from vz_drivers._agent import AgentClient
from vz_drivers._guest import (
    LOG_PATH,
    GuestConfig,
    GuestMount,
    Initramfs,
    Kernel,
    build_initramfs,
    default_disk_size,
    env_list,
    extract_vmlinux,
    find_busybox,
    find_kernel,
    find_mke2fs,
    hosts_file,
    install_root_disk,
    minimum_disk_size,
    render,
    resolv_file,
    resolve_modules,
    stage_root_disk,
    tree_usage,
    unstage_root_disk,
)
from vz_drivers._machine import (
    AgentLink,
    AgentMachineDriver,
    Backend,
    MachinePlan,
    atomic_write,
    no_input,
    open_agent_socket,
    record_fields,
    tail,
)
from vz_drivers.qemu._accel import Accelerator, choose_accelerator
from vz_drivers.qemu._attach import TOPOLOGY_FACT, parse_network_label, remove_taps
from vz_drivers.qemu._egress import EgressNamespace
from vz_drivers.qemu._qemu import QemuBinary, Share, VmSpec, find_qemu, launch
from vz_drivers.qemu._qmp import QmpClient
from vz_drivers.qemu._records import QemuBook, QemuPaths, QemuRecord
from vz_drivers.qemu._validate import HostLimits, guest_path, rules_for, validate_request
from vz_drivers.qemu.registration import DECLARATION

_SHM = Path("/dev/shm")

__all__ = ["DRIVER_NAME", "QemuBackend", "QemuDriver"]

DRIVER_NAME = "qemu"
DEFAULT_MEMORY = 512 * 1024 * 1024
DEFAULT_CPUS = 2
_MIB = 1024 * 1024


def _meminfo_total() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def diagnose_boot(console: str, qemu_log: str, console_path: Path) -> tuple[str, str]:
    """Why a Machine's boot ended (a short reason) and the logs that explain it.

    In order: the guest init's own ``VZ-INIT-FAILED:`` line, a kernel panic, QEMU's last message (for example
    "terminating on signal 15 from pid N (command)" when something on the host stopped it), then the guest agent's
    last message (it powers the VM off when it cannot serve)."""
    lines = console.splitlines()
    failed = [line for line in lines if "VZ-INIT-FAILED:" in line]
    panics = [line for line in lines if "Kernel panic" in line]
    qemu_lines = [line.strip() for line in qemu_log.splitlines() if line.strip()]
    agent = [line for line in lines if "vz-agent:" in line]
    if failed:
        detail = failed[-1].split("VZ-INIT-FAILED:", 1)[1].strip()
    elif panics:
        detail = "the guest kernel panicked: " + panics[0].split("Kernel panic", 1)[1].lstrip(" -")
    elif qemu_lines:
        detail = "QEMU said: " + qemu_lines[-1]
    elif agent:
        detail = "the guest agent said: " + agent[-1].split("vz-agent:", 1)[1].strip()
    else:
        detail = "see the console log"
    log = console + (f"\n--- QEMU's log:\n{qemu_log}" if qemu_log.strip() else "")
    return f"{detail} ({console_path})", log


@dataclass(frozen=True)
class _Host:
    """What booting needs, resolved once per driver object."""

    qemu: QemuBinary
    kernel: Kernel
    boot_kernel: Path
    initramfs: Initramfs
    accel: Accelerator


def _guarded(record: QemuRecord) -> bool:
    """Whether the Machine's QEMU runs in a namespace of its own: egress ``allow`` over user networking (no
    route-domain attachment)."""
    return record.egress == "allow" and parse_network_label(record.labels) is None


class QemuBackend(Backend[QemuRecord, QemuPaths]):
    """QEMU virtual machines booting the vz initramfs, agent over virtio-serial, shares over virtio-9p."""

    name = DRIVER_NAME
    display = "the qemu driver"
    runtime_name = "qemu"
    stop_slack = 15.0
    keep_log_on_stop = True
    workspace_snapshots = True
    storage_limits = True
    book: QemuBook

    declaration = DECLARATION

    def __init__(self, options: Mapping[str, Any] | None = None, /, **raw: Any) -> None:
        super().__init__(DECLARATION.options_of(options, raw))
        opts = self.options
        self.book = QemuBook(self.state_root)
        self.boot_timeout: float = opts.boot_timeout
        self.sessions: int = opts.sessions
        self._qemu_opt: str = opts.qemu
        self._kernel_opt: str = opts.kernel
        self._modules_opt: str = opts.modules
        self._busybox_opt: str = opts.busybox
        self._accel_opt: str = opts.accelerator
        self._qemu: QemuBinary | None = None
        self._kernel: Kernel | None = None
        self._accel: Accelerator | None = None
        self._host_cache: _Host | None = None
        self.egress_ns = EgressNamespace(opts.subnet)
        self.limits = HostLimits(cpus=os.cpu_count() or 1, memory_bytes=_meminfo_total())
        self.rules = rules_for(self.limits)

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

    async def host(self) -> _Host:
        if self._host_cache is None:
            accel = await self._accelerator()
            qemu = self._find_qemu()
            kernel = self._find_kernel()
            agent = await self.agent_binary()
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
        return min(wanted, self.limits.cpus)

    # ------------------------------------------------------------------ facts

    async def runtime_version(self) -> str:
        runtime_version = ""
        with contextlib.suppress(DriverError):
            qemu = await asyncio.to_thread(self._find_qemu)
            runtime_version = qemu.version
            accel = await self._accelerator()
            runtime_version = f"{qemu.version} ({accel.name})"
        return runtime_version

    async def extension_facts(self) -> tuple[dict[str, str], str, str]:
        facts: dict[str, str] = {"state_dir": str(self.book.root), "machine": "q35", "shares": "virtio-9p"}
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
        facts["agent_transport"] = f"virtio-serial, {self.sessions} port(s) per Machine"
        facts["egress_allow"] = (
            "QEMU user networking from a network namespace of the Machine's own, joined to the host by a veth "
            f"from {self.egress_ns.subnet} behind the host guard (never the host, another Machine or link-local)"
        )
        facts["egress_deny"] = "QEMU user networking with restrict=on (nothing leaves the guest)"
        facts["topology"] = TOPOLOGY_FACT
        return facts, accel_name, reason

    async def preflight(self) -> None:
        await asyncio.to_thread(self._find_qemu)
        await asyncio.to_thread(self._find_kernel)
        await asyncio.to_thread(find_busybox, self._busybox_opt or None)
        await asyncio.to_thread(find_mke2fs)
        await self._accelerator()

    async def provisioning_preflight(self) -> None:
        await self.preflight()
        await self.host()
        await asyncio.to_thread(self.book.ensure)

    # ------------------------------------------------------------------ create

    async def plan(self, request: RunImageRequest, key: str) -> MachinePlan[QemuRecord]:
        valid = validate_request(request, self.limits)
        parse_network_label(valid.labels)  # a bad vz.network label is refused before anything is created
        host = await self.host()
        image = await self.images.resolve(request, architecture="amd64", display=self.display)
        usage = await asyncio.to_thread(tree_usage, image.rootfs)
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
            replace(m, guest_target=guest_path(image.rootfs, m.target) if m.type != "tmpfs" else m.target)
            for m in valid.mounts
        ]
        fields = record_fields(request, key, image, valid)
        fields.update(
            mounts=mounts,
            cpus=valid.cpus or self._default_cpus(host),
            memory_bytes=valid.memory_bytes or DEFAULT_MEMORY,
        )
        fields["extra"]["sessions"] = self.sessions
        record = QemuRecord(**fields, disk_bytes=disk_bytes)
        if _guarded(record):
            self.egress_ns.config()  # root and the network tools, before anything is created
        return MachinePlan(record, staged={"rootfs": image.rootfs, "layers": image.layers})

    async def stage(self, plan: MachinePlan[QemuRecord]) -> None:
        await stage_root_disk(plan, self.book.staging, plan.record.disk_bytes)

    def unstage(self, plan: MachinePlan[QemuRecord]) -> None:
        unstage_root_disk(plan)

    def make_machine_dir(self, record: QemuRecord, plan: MachinePlan[QemuRecord]) -> None:
        paths = self.book.paths(record.key)
        install_root_disk(plan, paths.disk, paths.cfg)

    # ------------------------------------------------------------------ boot

    def _write_config(self, record: QemuRecord, paths: QemuPaths) -> list[Share]:
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
            stop_timeout=self.stop_timeout,
            sessions=int(record.extra.get("sessions", 1)),
            network=True,
            resolv_conf=record.egress == "allow" and parse_network_label(record.labels) is None,
        )
        cfg = self._config_dir(record, paths)
        # config.sh holds the environment values (secrets): on a memory filesystem, removed once the agent serves.
        atomic_write(cfg / "config.sh", render(config).encode(), 0o600)
        atomic_write(cfg / "hosts", hosts_file(hostname).encode(), 0o644)
        atomic_write(cfg / "resolv.conf", resolv_file().encode(), 0o644)
        paths.run.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in paths.run.glob("port-*.lock"):
            # Holders of a previous boot's ports keep the old (unlinked) files; this boot starts with fresh ones.
            stale.unlink()
        return shares

    def _config_dir(self, record: QemuRecord, paths: QemuPaths) -> Path:
        """The directory of the ``vzcfg`` share: a private one on the host's memory filesystem (``/dev/shm``), so
        that config.sh (it holds the environment values) never reaches a disk; ``cfg/`` where there is none."""
        if not _SHM.is_dir() or not os.access(_SHM, os.W_OK):
            paths.cfg.mkdir(parents=True, exist_ok=True, mode=0o700)
            return paths.cfg
        path = self._shm_path(record)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise UnavailableError(f"{path} is not a private directory of this user; remove it and retry")
        return path

    def _shm_path(self, record: QemuRecord) -> Path:
        name = hashlib.sha256(f"{self.book.root}\0{record.key}".encode()).hexdigest()[:24]
        return _SHM / f"vz-qemu-{os.getuid()}-{name}"

    def _forget_config(self, record: QemuRecord, *, everything: bool) -> None:
        """Remove config.sh once the guest read it (the agent serves), or the whole share directory."""
        paths = self.book.paths(record.key)
        for cfg in (self._shm_path(record), paths.cfg):
            try:
                st = os.lstat(cfg)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue  # never follow a link, never touch another user's directory
            if everything and cfg != paths.cfg:
                shutil.rmtree(cfg, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    (cfg / "config.sh").unlink()

    async def release(self, record: QemuRecord) -> None:
        await asyncio.to_thread(self._forget_config, record, everything=True)
        network = parse_network_label(record.labels)
        if network is not None:
            await remove_taps(network)  # a leftover tap of the Machine (QEMU normally takes them along)
        elif _guarded(record):
            with contextlib.suppress(UnavailableError):  # nothing was made where it is unavailable
                await self.egress_ns.release(record.key)

    async def boot(self, record: QemuRecord) -> None:
        host = await self.host()
        paths = self.book.paths(record.key)
        shares = await asyncio.to_thread(self._write_config, record, paths)
        spec = VmSpec(
            name="vz-" + record.key[:12],
            accelerator=host.accel.name,
            cpus=record.cpus,
            memory_mib=max(record.memory_bytes // _MIB, 1),
            kernel=host.boot_kernel,
            initrd=host.initramfs.path,
            disk=paths.disk,
            config_dir=self._config_dir(record, paths),
            shares=tuple(shares),
            egress=record.egress,
            sessions=int(record.extra.get("sessions", 1)),
            network=parse_network_label(record.labels),
        )
        self.new_identity_key(record)  # handed to the PID-1 agent in the first HELLO on port 0 (connect)
        if not _guarded(record):
            record.pid, record.pid_start = await launch(host.qemu.path, spec, paths.run)
        else:
            # QEMU (and so slirp's every connection) in the Machine's own namespace behind the host guard.
            wrapper = await self.egress_ns.prepare(record.key)
            try:
                record.pid, record.pid_start = await launch(host.qemu.path, spec, paths.run, wrapper=wrapper)
            finally:
                await self.egress_ns.forget(record.key)  # QEMU holds the namespace now: it goes when QEMU goes
        record.accelerator = host.accel.name

    def diagnose(self, record: QemuRecord) -> tuple[str, str]:
        paths = self.book.paths(record.key)
        return diagnose_boot(tail(paths.console), tail(paths.qemu_log), paths.console)

    async def connect(self, record: QemuRecord, *, booting: bool) -> AgentLink:
        """Take the first free agent port of the Machine (a cross-process flock) and complete the handshake.

        While booting the agent may not serve yet: the handshake waits for it (the driver bounds the wait)."""
        paths = self.book.paths(record.key)
        ports = int(record.extra.get("sessions", 1))
        what = f"Machine {record.workspace_id!r}"
        for port in range(ports):
            fd = os.open(paths.port_lock(port), os.O_RDWR | os.O_CREAT, 0o600)
            if not lock_file(fd, blocking=False):
                os.close(fd)
                continue
            try:
                # The PID-1 agent holds the guest end of every port: it takes the boot's identity key in the first
                # HELLO of the booting connection on port 0 (only the host writes to a virtio-serial port) and
                # proves it on every later connection, whichever port it comes on.
                key = self.identity_key(record)
                reader, writer = await open_agent_socket(paths.agent_socket(port), record.pid, what=what)
                client = await AgentClient.from_streams(
                    reader,
                    writer,
                    wait_ready=True,
                    timeout=None if booting else 30.0,
                    identity_key=key,
                    hand_over_key=booting,
                )
            except BaseException:
                os.close(fd)
                raise
            if booting:
                # The guest init sourced config.sh before it started the agent.
                await asyncio.to_thread(self._forget_config, record, everything=False)
            return AgentLink(
                client=client,
                pid=record.pid,
                pid_start=record.pid_start,
                port=port,
                release=functools.partial(os.close, fd),
            )
        raise UnavailableError(
            f"all {ports} agent sessions of Machine {record.workspace_id!r} are held by other vz processes; retry "
            "when one finishes (the driver option sessions sets how many a new Machine gets)",
            details={"workspace_id": record.workspace_id},
        )

    async def read_log(self, record: QemuRecord, link: AgentLink) -> AsyncGenerator[bytes, None]:
        if link.port == 0:
            async with contextlib.aclosing(link.client.logs()) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        # Only the PID-1 agent (port 0) keeps the log; the others read its files in the initramfs root.
        script = f"cat {LOG_PATH}.1 2>/dev/null; cat {LOG_PATH} 2>/dev/null; true"
        spec = ExecSpec(workspace_id=record.workspace_id, argv=("/bin/busybox", "sh", "-c", script))
        async with contextlib.aclosing(link.client.exec(spec, no_input(), root_override="/")) as events:
            async for event in events:
                if isinstance(event, ExecOutput) and event.stream == "stdout":
                    yield event.data

    # ------------------------------------------------------------------ stop and remove

    async def shutdown(self, record: QemuRecord, link: AgentLink) -> None:
        if link.port == 0:
            await link.client.shutdown(grace=self.stop_timeout)
            return
        # Only the agent on port 0 is PID 1; SIGTERM makes it stop everything and power off.
        spec = ExecSpec(workspace_id=record.workspace_id, argv=("/bin/busybox", "kill", "-TERM", "1"))
        async with contextlib.aclosing(link.client.exec(spec, no_input(), root_override="/")) as events:
            async for _ in events:
                pass

    async def remove_host_state(self) -> None:
        shutil.rmtree(self.book.staging, ignore_errors=True)

    # ------------------------------------------------------------------ diagnostics

    async def qmp_status(self, record: QemuRecord) -> dict[str, Any]:
        async with await QmpClient.connect(self.book.paths(record.key).qmp) as qmp:
            status: dict[str, Any] = await qmp.execute("query-status")
            return status


class QemuDriver(AgentMachineDriver[QemuRecord, QemuPaths]):
    """Linux Machines as QEMU virtual machines.

    Its options (types, defaults, bounds and help) are declared once, in ``vz_drivers.qemu.registration``;
    ``QemuDriver(options)`` takes the declaration's ``Options`` (or keyword values, checked the same way).
    """

    def __init__(self, options: Mapping[str, Any] | None = None, /, **raw: Any) -> None:
        self._qemu_backend = QemuBackend(options, **raw)
        super().__init__(self._qemu_backend)

    async def qmp_status(self, workspace_id: str) -> dict[str, Any]:
        """QEMU's own view of a running Machine (QMP ``query-status``); ``FailedPreconditionError`` when stopped."""
        record = self._require(workspace_id)
        if not self._alive(record):
            raise FailedPreconditionError(f"Machine {workspace_id!r} is stopped")
        return await self._qemu_backend.qmp_status(record)
