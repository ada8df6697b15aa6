"""The vfkit backend of the shared agent-Machine layer: what a vfkit Machine does differently.

* **Boot**: the private verified vfkit copy with the Machine's command line (``_cmdline``): linux bootloader
  (uncompressed kernel, the vz initramfs, ``console=hvc0``), raw root disk on virtio-blk, virtio-fs shares
  (configuration, workspace, bind mounts, volumes), virtio-net NAT, the console on virtio-serial into a log
  file, virtio-vsock for the agent (``connect``: vfkit listens on the host socket and forwards each connection
  to guest port 1024) and for readiness (``listen``: the guest connects to host port 1025, vfkit dials our
  socket), optionally Rosetta and nested virtualization, and the REST API on a private Unix socket.
* **Readiness** is the guest's ``ready`` line on the readiness socket, raced by the layer against vfkit's death.
* **Agent**: every host connection to the agent socket is a new vsock connection, i.e. an independent session;
  the socket's listening peer must be the recorded vfkit process.
* **Stop**: the agent stops everything and powers off (vfkit exits with the VM); if vfkit is still there, the
  REST state machine follows (``Stop``, ``HardStop`` after the grace, SIGKILL).
* **Diagnostics**: a failed start reports vfkit's exit status, its own output and the guest console tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from vz_core import RunImageRequest
from vz_core.errors import DriverError, FailedPreconditionError, UnavailableError, UnsupportedError
from vz_drivers._guest import (
    CONFIG_TAG,
    Bundle,
    GuestConfig,
    GuestMount,
    bundle_cache,
    check_bundle_options,
    env_list,
    find_mke2fs,
    hosts_file,
    install_root_disk,
    open_bundle,
    render,
    root_disk_size,
    stage_root_disk,
    tree_usage,
    unstage_root_disk,
)
from vz_drivers._machine import (
    AgentLink,
    Backend,
    MachinePlan,
    MountRecord,
    Rules,
    atomic_write,
    now,
    open_agent_socket,
    proc_start_time,
    validate_common,
)
from vz_drivers.vfkit._binary import VfkitBinary
from vz_drivers.vfkit._cmdline import AGENT_VSOCK_PORT, READY_VSOCK_PORT, Share, VfkitSpec, build_argv
from vz_drivers.vfkit._host import HostSupport, host_support
from vz_drivers.vfkit._process import (
    ReadyListener,
    VfkitProcess,
    boot_failure,
    exit_status,
    launch,
    process_alive,
    stop_vm,
)
from vz_drivers.vfkit._records import VfkitBook, VfkitPaths, VfkitRecord, socket_dir
from vz_drivers.vfkit._rest import VfkitRest
from vz_drivers.vfkit.registration import DECLARATION

__all__ = ["DRIVER_NAME", "STATUS", "VfkitBackend"]

DRIVER_NAME = DECLARATION.name

STATUS = "DEV (written to vfkit's documented interface; not verified on a Mac)"
DEFAULT_MEMORY = 1024 * 1024 * 1024
MIN_MEMORY = 256 * 1024 * 1024
ROSETTA_TAG = "vz-rosetta"
_MIB = 1024 * 1024


def _check_layer() -> None:
    """Refuse before anything is created when the shared Machine layer cannot track processes here.

    Machines are known by process identity (pid and start time) and their agent channel by its listening peer;
    the layer reads both from /proc or, on macOS, through psutil, kqueue and ``LOCAL_PEERPID``. Booting a vfkit
    it could not find again would leave a VM nobody manages.
    """
    if proc_start_time(os.getpid()) is None:
        raise UnsupportedError(
            f"the vfkit driver cannot manage Machines on {sys.platform}: the process start time of this process "
            f"cannot be read, so a Machine could not be found again; the driver is {STATUS}",
            details={"driver": DRIVER_NAME, "platform": sys.platform},
        )


class VfkitBackend(Backend[VfkitRecord, VfkitPaths]):
    """vfkit virtual machines (macOS): agent over virtio-vsock, shares over virtio-fs, REST API for state."""

    name = DRIVER_NAME
    display = "the vfkit driver"
    runtime_name = "vfkit"
    keep_log_on_stop = True
    stop_slack = 15.0
    book: VfkitBook

    declaration = DECLARATION

    def __init__(
        self,
        options: Mapping[str, Any] | None = None,
        /,
        *,
        host: HostSupport | None = None,
        **raw: Any,
    ) -> None:
        # Every option is checked once, by the declaration (vfkit takes no agent_binary: its agent is in the
        # initrd); the layer's common part reads the checked values.
        super().__init__(DECLARATION.options_of(options, raw))
        check_bundle_options(self.options.guest, self.options.guest_sha256)
        self.book = VfkitBook(self.state_root)
        self.binary = VfkitBinary(
            self.options.vfkit, state_root=self.state_root, pinned_sha256=self.options.vfkit_sha256
        )
        # ``host`` is only ever given by tests that run a stand-in vfkit; the driver reads the real host.
        self.host = host if host is not None else host_support()
        self.boot_timeout = self.options.boot_timeout
        arch = self.host.architecture if self.host.architecture in ("amd64", "arm64") else "arm64"
        self.rules = Rules(
            display=self.display,
            architecture=arch,
            cpus=os.cpu_count() or 1,
            memory_bytes=int(psutil.virtual_memory().total),
            min_memory_bytes=MIN_MEMORY,
            min_memory_why="256 MiB a Virtualization.framework guest needs",
            profiles=("developer",),
            platform_hint=" (vfkit runs guests of the host's architecture)",
            userns_hint=": a Machine is a whole virtual machine",
            reserved_why="belongs to the Machine's kernel",
            bind_dirs_only=True,
            max_mounts=24,
        )
        self._ready: dict[str, ReadyListener] = {}
        self._bundle: Bundle | None = None

    # ------------------------------------------------------------------ facts

    async def runtime_version(self) -> str:
        if not self.host.supported:
            return ""
        try:
            return (await asyncio.to_thread(self.binary.version))[0]
        except DriverError:
            return ""

    async def extension_facts(self) -> tuple[dict[str, str], str, str]:
        host = self.host
        facts: dict[str, str] = {
            "status": STATUS,
            "state_dir": str(self.book.root),
            "host_os": host.system,
            "host_supported": "yes" if host.supported else f"no: {host.reason}",
            "agent_transport": "virtio-vsock (vfkit socketURL, connect mode), one session per connection",
            "shares": "virtio-fs (read-only enforced in the guest)",
            "egress_allow": "virtio-net NAT (Virtualization.framework)",
            "egress_deny": "no network device at all (nothing can leave the guest; exec uses vsock)",
            "rosetta": "available" if host.rosetta else "not available",
            "nested": "possible" if host.nested else "not available",
            "guest": self.options.guest or "(not set)",
            "guest_sha256": self._bundle.digest
            if self._bundle
            else (self.options.guest_sha256 or "(not verified yet)"),
        }
        if host.supported:
            try:
                verified = await asyncio.to_thread(self.binary.verify)
                facts["vfkit"] = verified.source
                facts["vfkit_sha256"] = verified.sha256
                facts["vfkit_version"] = (await asyncio.to_thread(self.binary.version))[0]
            except DriverError as exc:
                facts["vfkit"] = f"unavailable: {exc.message}"
            return facts, "virtualization.framework", "vfkit (Apple Virtualization.framework)"
        return facts, "", host.reason

    async def preflight(self) -> None:
        if not self.host.supported:
            raise UnsupportedError(self.host.reason, details={"driver": DRIVER_NAME, "host_os": self.host.system})
        await asyncio.to_thread(self.binary.check_version)

    async def provisioning_preflight(self) -> None:
        await self.preflight()
        _check_layer()
        self._bundle = await asyncio.to_thread(self._open_guest)
        if self.options.rosetta == "on" and not self.host.rosetta:
            raise UnavailableError(
                "rosetta=on, but Rosetta for Linux is not installed (Apple silicon: `softwareupdate "
                "--install-rosetta`)",
                details={"option": "rosetta"},
            )
        if self.options.nested and not self.host.nested:
            raise UnsupportedError(
                "nested=on needs macOS 15 or newer on an M3 or newer chip", details={"option": "nested"}
            )
        if self.options.nested:
            await asyncio.to_thread(self.binary.check_nested)
        await asyncio.to_thread(find_mke2fs)
        await asyncio.to_thread(self.book.ensure)

    def _open_guest(self) -> Bundle:
        """The guest bundle, copied into the cache by digest and verified file by file (before every boot too)."""
        if not self.options.guest:
            raise UnavailableError(
                "the vfkit driver needs the option guest=<bundle>: the vz guest bundle for "
                f"{self.rules.architecture} (format vfkit), a directory or an https:// URL of its manifest.json; "
                "see docs/drivers/vfkit.md (`vz guest fetch` / `vz guest build`)",
                details={"option": "guest"},
            )
        bundle = open_bundle(self.options.guest, bundle_cache(), digest=self.options.guest_sha256)
        if bundle.format != "vfkit" or bundle.arch != self.rules.architecture:
            raise FailedPreconditionError(
                f"the guest bundle {self.options.guest} is for {bundle.arch} {bundle.format}; this host needs "
                f"{self.rules.architecture} vfkit (`vz guest build --arch {self.rules.architecture} --format vfkit`)",
                details={"option": "guest"},
            )
        return bundle

    # ------------------------------------------------------------------ create

    async def plan(self, request: RunImageRequest, key: str) -> MachinePlan[VfkitRecord]:
        # Host first: on a host that cannot run vfkit nothing else is looked at, and nothing is created.
        await self.provisioning_preflight()
        valid = validate_common(request, self.rules)
        # Every path must fit vfkit's option syntax before anything is created: build the command line once now.
        await asyncio.to_thread(self._check_command_line, key, valid.mounts)
        image = await self.images.resolve(request, architecture=self.rules.architecture, display=self.display)
        size = root_disk_size(await asyncio.to_thread(tree_usage, image.rootfs), valid.storage_bytes)
        record = VfkitRecord(
            workspace_id=request.workspace_id,
            key=key,
            machine_id=uuid.uuid4().hex,
            created_at=now(),
            image_ref=request.image,
            image_digest=image.digest,
            argv=image.argv,
            environment=dict(request.environment),
            image_env=image.env,
            working_dir=image.working_dir,
            user=image.user,
            developer_identity=image.identity_name,
            identity_uid=image.identity.uid,
            identity_gid=image.identity.gid,
            labels=valid.labels,
            mounts=list(valid.mounts),
            cpus=valid.cpus or min(2, self.rules.cpus),
            memory_bytes=valid.memory_bytes or DEFAULT_MEMORY,
            disk_bytes=size,
            egress=valid.egress,
            extra={"workspace_target": valid.mounts[0].target if request.workspace_mount and valid.mounts else ""},
        )
        return MachinePlan(record, staged={"rootfs": image.rootfs, "layers": image.layers})

    def _check_command_line(self, key: str, mounts: Sequence[MountRecord]) -> None:
        paths = self.book.paths(key)
        sockets = socket_dir(paths, key, create=False)
        shares = [Share(tag=CONFIG_TAG, path=str(paths.cfg), read_only=True)]
        for m in mounts:
            if m.type == "tmpfs":
                continue
            host = m.host_path if m.type == "bind" else str(self.book.volume_dir(m.source) / "data")
            shares.append(Share(tag=f"vzm{len(shares) - 1}", path=host, read_only=m.read_only))
        build_argv(
            str(self.book.root / "bin" / "vfkit"),
            self._spec(paths, sockets, cpus=1, memory_mib=1, shares=shares, network=True),
        )

    def _spec(
        self, paths: VfkitPaths, sockets: Path, *, cpus: int, memory_mib: int, shares: Sequence[Share], network: bool
    ) -> VfkitSpec:
        return VfkitSpec(
            cpus=cpus,
            memory_mib=memory_mib,
            kernel=str(self._bundle.file("kernel")) if self._bundle else "",
            initrd=str(self._bundle.file("initrd")) if self._bundle else "",
            cmdline=("console=hvc0", "quiet", "panic=-1", f"vz.cfg={CONFIG_TAG}"),
            disk=str(paths.disk),
            console_log=str(paths.console),
            rest_socket=str(sockets / "rest.sock"),
            agent_socket=str(sockets / "agent.sock"),
            ready_socket=str(sockets / "ready.sock"),
            shares=tuple(shares),
            rosetta_tag=ROSETTA_TAG if self._rosetta() else "",
            nested=self.options.nested,
            network=network,
        )

    async def stage(self, plan: MachinePlan[VfkitRecord]) -> None:
        await stage_root_disk(plan, self.book.staging, plan.record.disk_bytes)

    def unstage(self, plan: MachinePlan[VfkitRecord]) -> None:
        unstage_root_disk(plan)

    def make_machine_dir(self, record: VfkitRecord, plan: MachinePlan[VfkitRecord]) -> None:
        paths = self.book.paths(record.key)
        install_root_disk(plan, paths.disk, paths.cfg)

    # ------------------------------------------------------------------ boot

    def _write_config(self, record: VfkitRecord, paths: VfkitPaths) -> list[Share]:
        shares: list[Share] = [Share(tag=CONFIG_TAG, path=str(paths.cfg), read_only=True)]
        mounts: list[GuestMount] = []
        for m in record.mounts:
            if m.type == "tmpfs":
                mounts.append(GuestMount(target=m.target, read_only=m.read_only, options=m.options))
                continue
            if not os.path.isdir(m.host_path):
                raise FailedPreconditionError(
                    f"Machine {record.workspace_id!r}: the {m.target} mount source {m.source!r} no longer exists on "
                    "the host; restore it or recreate the Machine",
                    details={"workspace_id": record.workspace_id, "mount": m.target},
                )
            tag = f"vzm{len(shares) - 1}"
            shares.append(Share(tag=tag, path=m.host_path, read_only=m.read_only))
            mounts.append(GuestMount(target=m.guest_target or m.target, tag=tag, read_only=m.read_only))
        hostname = "vz-" + record.key[:12]
        config = GuestConfig(
            hostname=hostname,
            mounts=tuple(mounts),
            env=env_list(record.image_env, record.environment),
            argv=tuple(record.argv),
            user=record.user,
            workdir=record.working_dir or "/",
            stop_timeout=self.stop_timeout,
            rosetta_tag=ROSETTA_TAG if self._rosetta() else "",
            network=record.egress != "deny",
            # Virtualization.framework's NAT hands out the address, gateway and DNS forwarder by DHCP.
            dhcp=True,
            resolv_conf=record.egress != "deny",
            virtiofs=True,
            vsock=(AGENT_VSOCK_PORT, READY_VSOCK_PORT),
        )
        paths.cfg.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(paths.cfg / "config.sh", render(config).encode(), 0o600)
        atomic_write(paths.cfg / "hosts", hosts_file(hostname).encode(), 0o644)
        paths.run.mkdir(parents=True, exist_ok=True, mode=0o700)
        return shares

    def _rosetta(self) -> bool:
        return self.options.rosetta == "on" or (self.options.rosetta == "auto" and self.host.rosetta)

    def _sockets(self, record: VfkitRecord) -> Path:
        return Path(record.socket_dir) if record.socket_dir else self.book.paths(record.key).run

    async def boot(self, record: VfkitRecord) -> None:
        verified = await asyncio.to_thread(self.binary.verify)
        self._bundle = await asyncio.to_thread(self._open_guest)
        paths = self.book.paths(record.key)
        shares = await asyncio.to_thread(self._write_config, record, paths)
        sockets = await asyncio.to_thread(socket_dir, paths, record.key)
        record.socket_dir = str(sockets)
        for name in ("rest.sock", "agent.sock", "ready.sock"):
            with contextlib.suppress(FileNotFoundError):
                (sockets / name).unlink()  # vfkit cannot listen where a stale socket file remains
        for stale in (paths.console, paths.vfkit_status):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        spec = self._spec(
            paths,
            sockets,
            cpus=record.cpus,
            memory_mib=max(record.memory_bytes // _MIB, 1),
            shares=shares,
            network=record.egress != "deny",
        )
        argv = build_argv(verified.path, spec)
        # A fresh identity key for this boot, handed to the agent in the first HELLO of the booting connection (the
        # agent takes it only from the host's CID over vsock) and proven on every later handshake.
        self.new_identity_key(record)
        listener = ReadyListener(sockets / "ready.sock")
        await listener.__aenter__()
        try:
            process = await launch(argv, run_dir=paths.run, log=paths.vfkit_log, status=paths.vfkit_status)
        except BaseException:
            await listener.__aexit__(None, None, None)
            raise
        self._ready[record.key] = listener
        record.vfkit, record.vfkit_sha256 = verified.path, verified.sha256
        record.pid = process.pid
        start = proc_start_time(process.pid)
        if start is None:
            raise boot_failure(
                f"vfkit exited unexpectedly while booting Machine {record.workspace_id!r}",
                log=paths.vfkit_log,
                status=paths.vfkit_status,
                console=paths.console,
            )
        record.pid_start = start

    async def connect(self, record: VfkitRecord, *, booting: bool) -> AgentLink:
        from vz_drivers._agent import AgentClient

        if booting:
            listener = self._ready.pop(record.key, None)
            if listener is not None:
                try:
                    await listener.wait()  # the layer bounds this with boot_timeout and vfkit's death
                finally:
                    await listener.__aexit__(None, None, None)
        what = f"Machine {record.workspace_id!r}"
        reader, writer = await open_agent_socket(self._sockets(record) / "agent.sock", record.pid, what=what)
        client = await AgentClient.from_streams(
            reader,
            writer,
            wait_ready=True,
            timeout=30.0,
            identity_key=self.identity_key(record),
            hand_over_key=booting,
        )
        return AgentLink(client=client, pid=record.pid, pid_start=record.pid_start)

    def diagnose(self, record: VfkitRecord) -> tuple[str, str]:
        paths = self.book.paths(record.key)
        alive = bool(record.pid) and proc_start_time(record.pid) == record.pid_start
        what = "vfkit is running but the guest agent did not answer" if alive else "vfkit exited unexpectedly"
        error = boot_failure(what, log=paths.vfkit_log, status=paths.vfkit_status, console=paths.console)
        return error.message, error.runtime_message

    # ------------------------------------------------------------------ stop and remove

    def _process(self, record: VfkitRecord) -> VfkitProcess | None:
        if not record.pid or proc_start_time(record.pid) != record.pid_start:
            return None
        try:
            started = psutil.Process(record.pid).create_time()
        except psutil.Error:
            return None
        return VfkitProcess(pid=record.pid, start_time=started, executable=record.vfkit)

    async def shutdown(self, record: VfkitRecord, link: AgentLink) -> None:
        """The agent stops everything and powers the guest off; vfkit exits with the VM. Whatever remains is
        stopped through the REST API (Stop, then HardStop after the grace) and finally killed."""
        with contextlib.suppress(DriverError, TimeoutError):
            async with asyncio.timeout(self.stop_timeout + 5):
                await link.client.shutdown(grace=self.stop_timeout)
        process = self._process(record)
        if process is not None and process_alive(process.pid, process.start_time):
            rest = VfkitRest(str(self._sockets(record) / "rest.sock"))
            await stop_vm(process, rest, grace=5.0, hard_grace=5.0)

    async def vm_state(self, record: VfkitRecord) -> str:
        """vfkit's own view of a running Machine (``GET /vm/state``)."""
        return (await VfkitRest(str(self._sockets(record) / "rest.sock")).state()).state

    async def release(self, record: VfkitRecord) -> None:
        listener = self._ready.pop(record.key, None)
        if listener is not None:
            await listener.__aexit__(None, None, None)
        if record.pid:
            # vfkit is gone; its launcher's waiting shell writes the exit status just after. Let it finish, so
            # that nothing writes into the Machine's directory once Stop or Delete returned.
            await exit_status(self.book.paths(record.key).vfkit_status)

    def remove_tree(self, paths: VfkitPaths) -> None:
        # The record may already be gone: the socket directory is derived from the paths, not read from it.
        sockets = socket_dir(paths, paths.root.name, create=False)
        if sockets != paths.run:
            shutil.rmtree(sockets, ignore_errors=True)
        shutil.rmtree(paths.root, ignore_errors=True)

    async def remove_host_state(self) -> None:
        shutil.rmtree(self.book.staging, ignore_errors=True)
