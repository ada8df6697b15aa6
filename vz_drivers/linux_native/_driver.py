"""The linux_native driver: Linux Machines on a Linux host, run by runc with the guest agent as PID 1.

A Machine is an OCI container whose process is ``vz-agent`` in init mode: a child subreaper that runs the
image's main process (output to a bounded log on the host) and serves execs over a Unix socket. Exec therefore
never spawns runc: the driver talks to the agent over that socket and the agent forks the command inside the
Machine's namespaces and cgroup.

The agent's stdin is one end of a socket pair whose other end only the host holds (never stored anywhere). The
host writes the boot's identity key there before the Machine exists; the agent reads it first thing and keeps
it only in its memory, which no process of the Machine can read (the agent is not dumpable, the seccomp filter
refuses ptrace and process_vm_*, no Machine holds CAP_SYS_PTRACE). Every handshake then asks the agent to
prove it holds the key (docs/agent-protocol.md), so a program exec'd in its place is refused and the Machine
stopped. The agent binds its socket in ``/.vz/run`` (a host directory bind-mounted into the Machine), tells
the host it serves through the same stdin, and the host then moves the socket
into the Machine's ``chan/`` directory, which the Machine cannot see. Every connection checks, before it sends
anything, that the socket's listener is the Machine's init (``SO_PEERCRED``), so a socket or link a Machine
plants never receives a command meant for it or for another Machine.

The root filesystem is an overlay of the cached image rootfs (read-only lower) and a per-Machine upper
directory that survives Stop/Start and is discarded on recreation. Every start regenerates the OCI spec from
the Machine's record, so the record (not the runtime) is the source of truth, and a relaunched driver finds
every Machine in its real state (a Machine whose init died is reported stopped).

Everything every agent-Machine driver does the same way lives in ``vz_drivers._machine``; this module is the
runc backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vz_core import RunImageRequest
from vz_core.docker_engine import FACT_KEY as DOCKER_FACT
from vz_core.docker_engine import declare
from vz_core.errors import (
    DriverError,
    FailedPreconditionError,
    InvalidArgumentError,
    RuntimeFailureError,
    UnavailableError,
)
from vz_core.rules import default_memory_bytes, default_pids
from vz_drivers._agent import AgentClient
from vz_drivers._machine import (
    AgentLink,
    AgentMachineDriver,
    Backend,
    MachinePlan,
    atomic_write,
    open_agent_socket,
    proc_start_time,
    record_fields,
    tail,
)
from vz_drivers.linux_native import _criu
from vz_drivers.linux_native._attach import (
    FACT,
    FACT_KEY,
    connect_machine,
    disconnect_machine,
    network_slice,
    resolv_conf_for,
)
from vz_drivers.linux_native._cgroup import CgroupParent
from vz_drivers.linux_native._host import HostFacts, host_facts, read_meminfo
from vz_drivers.linux_native._mounts import is_mounted, mount_overlay, mounts_under, unmount
from vz_drivers.linux_native._network import NetworkConfig, remove_host_link, remove_host_table
from vz_drivers.linux_native._records import LinuxNativeBook, LinuxNativePaths, LinuxNativeRecord
from vz_drivers.linux_native._runc import Runc
from vz_drivers.linux_native._spec import RUN_DIR, build_spec
from vz_drivers.linux_native._validate import rules_for, validate_request
from vz_drivers.linux_native.registration import DECLARATION

__all__ = ["DRIVER_NAME", "LinuxNativeBackend", "LinuxNativeDriver"]

DRIVER_NAME = "linux_native"
_READY = b"ready\n"


class LinuxNativeBackend(Backend[LinuxNativeRecord, LinuxNativePaths]):
    """runc containers with their own namespaces, cgroup limits and overlay root layer."""

    name = DRIVER_NAME
    display = "linux_native"
    runtime_name = "runc"
    graceful_replace = True
    boot_timeout = 30.0
    """Seconds a container start may take until the agent answers (not an option: a container starts in well
    under a second; the bound only catches a wedged runc)."""
    verify_on_find = True
    workspace_snapshots = True
    shares_host_kernel = True
    book: LinuxNativeBook

    declaration = DECLARATION

    def __init__(self, options: Mapping[str, Any] | None = None, /, **raw: Any) -> None:
        super().__init__(DECLARATION.options_of(options, raw))
        opts = self.options
        self.book = LinuxNativeBook(self.state_root)
        self.facts: HostFacts = host_facts()
        self.rules = rules_for(self.facts)
        runc_path = opts.runc or shutil.which("runc") or ""
        try:
            self.runc = Runc(runc_path, self.book.runc_root, self.book.trust_file, opts.runc_sha256)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        cgroup_parent: str = opts.cgroup_parent
        if not cgroup_parent or "/" in cgroup_parent.strip("/") or cgroup_parent.startswith("."):
            raise InvalidArgumentError("cgroup_parent must be a single directory name such as 'vz'")
        self.cgroup_parent = cgroup_parent.strip("/")
        self.cgroups = CgroupParent(self.cgroup_parent)
        subnet: str = opts.subnet
        try:
            self.net = NetworkConfig(ip=self.facts.ip, nsenter=self.facts.nsenter, nft=self.facts.nft, subnet=subnet)
        except ValueError as exc:
            raise InvalidArgumentError(f"subnet {subnet!r}: {exc}", details={"option": "subnet"}) from None
        # Read ends of the readiness pipes of Machines being started by this process.
        self._ready: dict[str, int] = {}
        # Memory files holding the runc spec of Machines being created by this process (never on disk).
        self._specs: dict[str, int] = {}

    # ------------------------------------------------------------------ host resources

    def verify_runc(self) -> None:
        self.book.ensure()
        os.close(self.runc.verify())

    def _cgroup_path(self, record: LinuxNativeRecord) -> str:
        return f"/{self.cgroup_parent}/{record.container_id}"

    def limits(self, record: LinuxNativeRecord) -> tuple[int, int]:
        """The memory limit (bytes, swap included) and pids limit of the Machine's cgroup at its next start: what
        it asked for, else this host's defaults (``vz_core.rules``; a Machine recorded before the defaults existed
        gets them too)."""
        memory = record.memory_bytes or default_memory_bytes(self.facts.memory_bytes)
        pids = record.pids or default_pids(self.facts.task_limit)
        return memory, pids

    # ------------------------------------------------------------------ facts

    async def runtime_version(self) -> str:
        try:
            return await self.runc.get_version()
        except DriverError:
            return ""

    async def save_state_support(self) -> tuple[bool, str]:
        usable, detail = await _criu.support()
        return False, f"{_criu.NOT_BUILT} (CRIU here: {detail})" if usable else detail

    async def extension_facts(self) -> tuple[dict[str, str], str, str]:
        facts = {
            "runc": self.runc.path,
            "runc_version": self.runc.version,
            "cgroups": self.facts.cgroup_mode,
            "root_layer": "overlayfs" if self.facts.overlayfs else "unavailable",
            "memory_view": "/proc/meminfo generated from the memory limit",
            "cpu_view": "cpuset plus /sys/devices/system/cpu/online generated from the CPU count",
            "egress_allow": (
                f"veth + masquerade from {self.net.subnet}, IPv4 forwarding enabled on the host; never the host's "
                "addresses, its directly connected networks, link-local or another Machine (docs/network.md)"
            ),
            "egress_deny": "namespace with no link to the host; nftables rejects all but loopback",
            "seccomp": "Docker-style default filter, no user namespaces (developer: seccomp=unconfined opts out)",
            "state_dir": str(self.book.root),
            FACT_KEY: FACT,
            DOCKER_FACT: declare(
                "a linux_native Machine is a container without a user namespace (its root is the host's root), "
                "with no delegated cgroup subtree and no nft tables of its own, so an engine inside it would need "
                "a privileged container; use the qemu driver for a Machine that runs Docker"
            ),
        }
        return facts, "none", "Machines are containers sharing the host kernel; no hardware virtualization"

    async def preflight(self) -> None:
        if not self.facts.is_root:
            raise UnavailableError(
                "linux_native needs root (namespaces, cgroups, overlay mounts); run vz as root or pick another driver"
            )
        if not self.facts.overlayfs:
            raise UnavailableError(
                "overlayfs is not available in this kernel; load it with `modprobe overlay` (linux_native needs it "
                "for the Machine-local root layer)"
            )
        if self.facts.cgroup_mode == "none":
            raise UnavailableError("no cgroup filesystem is mounted at /sys/fs/cgroup; mount cgroups first")
        await asyncio.to_thread(self.verify_runc)

    async def provisioning_preflight(self) -> None:
        await self.preflight()
        missing = self.net.missing_tools("allow")
        if missing:
            raise UnavailableError("linux_native needs " + ", ".join(missing))
        await self.agent_binary()

    # ------------------------------------------------------------------ create

    async def plan(self, request: RunImageRequest, key: str) -> MachinePlan[LinuxNativeRecord]:
        valid = validate_request(request, self.facts, key)
        network_slice(valid.common.labels)  # a vz.network label is checked before anything is created
        image = await self.images.resolve(request, architecture=self.facts.architecture, display=self.display)
        await self.agent_binary()
        await asyncio.to_thread(self.verify_runc)
        common = valid.common
        ws_target = common.mounts[0].target if request.workspace_mount else None
        record = LinuxNativeRecord(
            **record_fields(request, key, image, common),
            container_id=f"vz-{key[:24]}",
            lower_dir=str(image.rootfs),
            uid=image.user_ids.uid,
            gid=image.user_ids.gid,
            additional_gids=list(image.user_ids.additional_gids),
            cpuset=valid.cpuset,
            profile=common.profile,
            cap_add=list(valid.cap_add),
            privileged=valid.privileged,
            no_new_privileges=valid.no_new_privileges,
            seccomp=valid.seccomp,
            pids=common.pids,
        )
        # Older records carry no workspace_target when there is no workspace mount.
        record.extra = {"workspace_target": ws_target} if ws_target else {}
        return MachinePlan(record)

    def make_machine_dir(self, record: LinuxNativeRecord, plan: MachinePlan[LinuxNativeRecord]) -> None:
        paths = self.book.paths(record.key)
        for d in (paths.upper, paths.work, paths.rootfs, paths.bundle, paths.etc):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(paths.run, 0o755)
        # The merged root directory takes the upper directory's owner and mode: copy the image's.
        lower = os.stat(record.lower_dir)
        os.chown(paths.upper, lower.st_uid, lower.st_gid)
        os.chmod(paths.upper, lower.st_mode & 0o7777)

    # ------------------------------------------------------------------ boot and the agent channel

    async def boot(self, record: LinuxNativeRecord) -> None:
        paths = self.book.paths(record.key)
        agent = str(await self.agent_binary())
        await self.release(record)
        await asyncio.to_thread(self._prepare_start, record, paths, agent)
        stderr_fd = os.open(paths.agent_stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        # The agent's stdin is a socket pair: the host writes the boot's identity key into it now (read by the agent
        # before anything runs in the Machine), the agent writes "ready" back once it serves. Nothing is stored.
        ready_r, ready_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._ready[record.key] = ready_r.detach()
        ready_w_fd = ready_w.detach()
        key = self.new_identity_key(record)
        line = key.hex().encode() + b"\n"
        try:
            os.write(self._ready[record.key], line)
        except BaseException:
            os.close(ready_w_fd)
            raise
        pid_file = paths.bundle / "init.pid"
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
        try:
            async with self.cgroups.creating():
                await self.runc.check(
                    "create",
                    "--bundle",
                    str(paths.bundle),
                    "--pid-file",
                    str(pid_file),
                    record.container_id,
                    what=f"creating Machine {record.workspace_id!r}",
                    stdin=ready_w_fd,
                    stdout=stderr_fd,
                    stderr=stderr_fd,
                    log=paths.runc_log,
                    new_session=True,
                    limit=60,
                )
        finally:
            os.close(stderr_fd)
            os.close(ready_w_fd)
            self._unpublish_spec(record.key, paths)
        pid = int(pid_file.read_text().strip())
        start_time = proc_start_time(pid)
        if start_time is None:
            raise RuntimeFailureError(f"Machine {record.workspace_id!r}: its init process vanished while starting")
        await connect_machine(self.net, pid=pid, key=record.key, egress=record.egress, labels=record.labels)
        await self.runc.check(
            "start", record.container_id, what=f"starting Machine {record.workspace_id!r}", log=paths.runc_log
        )
        record.pid = pid
        record.pid_start = start_time

    def _prepare_start(self, record: LinuxNativeRecord, paths: LinuxNativePaths, agent: str) -> None:
        if not Path(record.lower_dir).is_dir():
            raise FailedPreconditionError(
                f"the image {record.image_ref!r} of Machine {record.workspace_id!r} is no longer in the image cache; "
                "recreate the Machine with `vz up --recreate`"
            )
        hostname = "vz-" + record.key[:12]
        paths.etc.mkdir(parents=True, exist_ok=True, mode=0o700)
        paths.run.mkdir(parents=True, exist_ok=True, mode=0o755)
        paths.chan.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in (paths.inner_socket, paths.socket):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        atomic_write(paths.etc / "hostname", (hostname + "\n").encode(), 0o644)
        atomic_write(
            paths.etc / "hosts", f"127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{hostname}\n".encode(), 0o644
        )
        default_resolv = _resolv_conf() if record.egress == "allow" else ""
        atomic_write(paths.etc / "resolv.conf", resolv_conf_for(record.labels, default_resolv).encode(), 0o644)
        memory, pids = self.limits(record)
        atomic_write(paths.etc / "meminfo", _meminfo(memory).encode(), 0o644)
        if record.cpus:
            online = "0\n" if record.cpus == 1 else f"0-{record.cpus - 1}\n"
            atomic_write(paths.etc / "cpu-online", online.encode(), 0o644)
        if not is_mounted(paths.rootfs):
            paths.rootfs.mkdir(parents=True, exist_ok=True)
            mount_overlay(Path(record.lower_dir), paths.upper, paths.work, paths.rootfs)
        spec = build_spec(
            record,
            paths,
            agent_binary=agent,
            agent_args=_agent_args(record, self.stop_timeout),
            env=_merge_env(record.image_env, record.environment),
            cgroups_path=self._cgroup_path(record),
            hostname=hostname,
            swap_limit=self.facts.swap_limit,
            memory_bytes=memory,
            pids=pids,
        )
        self._publish_spec(record.key, paths, json.dumps(spec, indent=1).encode())

    def _publish_spec(self, key: str, paths: LinuxNativePaths, data: bytes) -> None:
        """Give runc the spec without writing it anywhere: it holds the environment values (secrets).

        The spec lives in a memory file of this process; ``bundle/config.json`` is a link to it, which runc
        follows once (``runc create``). ``_unpublish_spec`` closes it and removes the link right after.
        """
        self._unpublish_spec(key, paths)
        fd = os.memfd_create("vz-runc-spec", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o600)
            os.symlink(f"/proc/{os.getpid()}/fd/{fd}", paths.bundle / "config.json")
        except BaseException:
            os.close(fd)
            raise
        self._specs[key] = fd

    def _unpublish_spec(self, key: str, paths: LinuxNativePaths) -> None:
        with contextlib.suppress(FileNotFoundError):
            (paths.bundle / "config.json").unlink()
        fd = self._specs.pop(key, None)
        if fd is not None:
            os.close(fd)

    async def _agent_ready(self, record: LinuxNativeRecord) -> None:
        """Wait for the agent's "ready" on its stdin pipe; the pipe's end (the agent died) is an error too."""
        fd = self._ready.get(record.key)
        if fd is None:
            return
        loop = asyncio.get_running_loop()
        readable: asyncio.Event = asyncio.Event()
        loop.add_reader(fd, readable.set)
        data = b""
        try:
            while not data.endswith(b"\n"):
                await readable.wait()
                readable.clear()
                try:
                    chunk = os.read(fd, 64)
                except BlockingIOError:
                    continue
                if not chunk:
                    break
                data += chunk
        finally:
            loop.remove_reader(fd)
            self._close_ready(record.key)
        if data != _READY:
            raise UnavailableError(f"the guest agent of Machine {record.workspace_id!r} ended before serving")

    def _close_ready(self, key: str) -> None:
        fd = self._ready.pop(key, None)
        if fd is not None:
            os.close(fd)

    def _take_socket(self, paths: LinuxNativePaths) -> None:
        """Move the agent's freshly bound socket out of the Machine's reach (same filesystem: a rename)."""
        try:
            st = os.lstat(paths.inner_socket)
        except FileNotFoundError:
            raise UnavailableError(f"the guest agent's socket {paths.inner_socket} is missing") from None
        if not stat.S_ISSOCK(st.st_mode):
            raise UnavailableError(f"{paths.inner_socket} is not the guest agent's socket; refusing to use it")
        # rename() never follows a link: whatever is there now is moved, and checked again when connecting.
        os.rename(paths.inner_socket, paths.socket)

    async def connect(self, record: LinuxNativeRecord, *, booting: bool) -> AgentLink:
        paths = self.book.paths(record.key)
        if booting:
            await self._agent_ready(record)
            await asyncio.to_thread(self._take_socket, paths)
        what = f"Machine {record.workspace_id!r}"
        key = self.identity_key(record)
        reader, writer = await open_agent_socket(paths.socket, record.pid, what=what)
        client = await AgentClient.from_streams(reader, writer, timeout=10, identity_key=key)
        return AgentLink(client=client, pid=record.pid, pid_start=record.pid_start)

    def diagnose(self, record: LinuxNativeRecord) -> tuple[str, str]:
        log = tail(self.book.paths(record.key).agent_stderr, 2000)
        last = log.strip().splitlines()[-1] if log.strip() else "see the agent log"
        return last, log

    # ------------------------------------------------------------------ stop and remove

    async def release(self, record: LinuxNativeRecord) -> None:
        """Remove runc's container (and its cgroup) and unmount the root filesystem; idempotent."""
        self._close_ready(record.key)
        if (self.book.runc_root / record.container_id).exists():
            await self.runc.delete_force(record.container_id)
        if record.egress == "allow":
            await remove_host_link(self.net, record.key)
            await remove_host_table(self.net)
        await disconnect_machine(record.labels)
        paths = self.book.paths(record.key)
        if mounts_under(paths.rootfs):
            await asyncio.to_thread(unmount, paths.rootfs)

    def stopped_log(self, record: LinuxNativeRecord) -> Path:
        return self.book.paths(record.key).log

    def remove_tree(self, paths: LinuxNativePaths) -> None:
        if mounts_under(paths.root):
            unmount(paths.rootfs)
            if mounts_under(paths.root):
                raise RuntimeFailureError(f"{paths.root} still has mounts; refusing to remove it")
        shutil.rmtree(paths.root, ignore_errors=True)
        self._remove_cgroup_parent()

    def _remove_cgroup_parent(self) -> None:
        self.cgroups.remove_if_unused()

    async def remove_host_state(self) -> None:
        for cid in self.runc.list_ids():
            await self.runc.delete_force(cid)
            if cid.startswith("vz-"):
                await remove_host_link(self.net, cid.removeprefix("vz-"))
        await remove_host_table(self.net)
        await asyncio.to_thread(self._remove_cgroup_parent)


class LinuxNativeDriver(AgentMachineDriver[LinuxNativeRecord, LinuxNativePaths]):
    """Machines as runc containers with their own namespaces, cgroup limits and overlay root layer.

    Its options (types, defaults, bounds and help) are declared once, in ``vz_drivers.linux_native.registration``;
    ``subnet`` refuses loopback, link-local, multicast, reserved ranges and ranges the host already routes, when
    the driver is built. ``LinuxNativeDriver(options)`` takes the declaration's ``Options`` (or keyword values,
    checked the same way).
    """

    def __init__(self, options: Mapping[str, Any] | None = None, /, **raw: Any) -> None:
        backend = LinuxNativeBackend(options, **raw)
        super().__init__(backend)
        self._runc = backend.runc


def _agent_args(record: LinuxNativeRecord, stop_timeout: float) -> list[str]:
    """Arguments of the guest agent in init mode (the container's process)."""
    args = [
        "serve",
        "--listen",
        f"unix:{RUN_DIR}/agent.sock",
        "--key-fd",
        "0",
        "--ready-fd",
        "0",
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
