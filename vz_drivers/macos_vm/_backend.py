"""The macos_vm backend of the shared agent-Machine layer, and the driver built on it.

A Machine is a headless macOS VM run by a helper process (``_helper``) that the backend launches detached
(its pid is the record's: the Machine runs while it lives). Its disk and auxiliary storage are APFS clones
of an installed base (``_install``); the guest agent runs as a launchd daemon and is reached through the
helper's relay socket in the Machine's ``chan`` directory (``_provision``). Everything that needs no Mac
(validation, base pinning, the VM plan) happens in ``plan`` after the host check, so a request on any other
host fails with ``UnsupportedError`` before anything is created.

Backend layout under ``<state>/machines/<key>/`` besides the shared files: ``disk.img``, ``aux.img``,
``hardware-model.bin``, ``machine-identifier.bin``, ``state.vzvmsave`` (a saved VM state, ``stop_mode=save``),
``helper.log``, ``run/plan.json``, ``run/control.sock``, ``run/cfg/`` (the start's
``boot.sh`` and agent, shared read-only into the guest), ``chan/agent.sock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from vz_core import EgressPolicy, RunImageRequest
from vz_core.errors import (
    FailedPreconditionError,
    RuntimeFailureError,
    UnavailableError,
    UnsupportedError,
)
from vz_drivers._machine import (
    AgentLink,
    AgentMachineDriver,
    Backend,
    MachinePaths,
    MachinePlan,
    MachineRecord,
    RecordBook,
    Rules,
    atomic_write,
    now,
    open_agent_socket,
    proc_start_time,
    subpath,
    tail,
    validate_common,
)
from vz_drivers.macos_vm._bases import PinPolicy, load_bases, resolve_base
from vz_drivers.macos_vm._clone import CloneFn
from vz_drivers.macos_vm._control import decode, encode
from vz_drivers.macos_vm._host import MacHost, read_host
from vz_drivers.macos_vm._install import BaseStore, InstalledBase
from vz_drivers.macos_vm._macho import check_darwin_arm64
from vz_drivers.macos_vm._plan import MIB, Share, VmPlan, VmRequest, plan_vm
from vz_drivers.macos_vm._provision import (
    AGENT_IN_CONFIG,
    BOOT_SCRIPT,
    LABEL,
    BootConfig,
    RamDisk,
    SharedMount,
    boot_config,
    launchd_plist,
    provision_script,
)
from vz_drivers.macos_vm._realize import Frameworks, framework_limits, load_frameworks
from vz_drivers.macos_vm.registration import DECLARATION

__all__ = ["STATUS", "MacosVmBackend", "MacosVmDriver", "MacosVmPaths", "MacosVmRecord"]

STATUS = "DEV (written to Virtualization.framework's documented API; not verified on a Mac)"
DRIVER = "macos_vm"
_RAM_DISK_DEFAULT = 64 * MIB
_TMPFS_OPTIONS = r"size=[0-9]+[kKmMgG]?|ro|rw"
_GUEST_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
"""macOS's default PATH (/etc/paths)."""
_SUN_PATH = 104
"""macOS ``sockaddr_un.sun_path`` bytes, the terminating NUL included."""
_SIZE_UNITS = {"": 1, "k": 1024, "m": MIB, "g": 1024 * MIB}


@dataclass(kw_only=True)
class MacosVmRecord(MachineRecord):
    base_id: str = ""
    base_sha256: str = ""
    mac_address: str = ""
    stop_mode: str = "shutdown"


@dataclass(frozen=True)
class MacosVmPaths(MachinePaths):
    disk = subpath("disk.img")
    aux = subpath("aux.img")
    hardware_model = subpath("hardware-model.bin")
    machine_identifier = subpath("machine-identifier.bin")
    saved_state = subpath("state.vzvmsave")
    helper_log = subpath("helper.log")
    plan = subpath("run", "plan.json")
    control = subpath("run", "control.sock")
    cfg = subpath("run", "cfg")
    agent = subpath("chan", "agent.sock")


def _tmpfs_size(options: tuple[str, ...]) -> int:
    for opt in options:
        if opt.startswith("size="):
            number = opt[5:]
            unit = number[-1].lower() if number[-1].isalpha() else ""
            return int(number.rstrip("kKmMgG")) * _SIZE_UNITS[unit]
    return _RAM_DISK_DEFAULT


def _mac_address() -> str:
    # Locally administered, unicast (the framework's randomLocallyAdministeredAddress does the same).
    octets = bytearray(secrets.token_bytes(6))
    octets[0] = (octets[0] | 0x02) & 0xFE
    return ":".join(f"{b:02x}" for b in octets)


class MacosVmBackend(Backend[MacosVmRecord, MacosVmPaths]):
    """macOS Machines as Virtualization.framework VMs (Apple silicon hosts only)."""

    name = DRIVER
    display = "the macos_vm driver"
    runtime_name = "Virtualization.framework"
    keep_log_on_stop = True
    declaration = DECLARATION
    egress_policies = (EgressPolicy.ALLOW,)
    terminals = True  # the darwin agent serves terminals (pty.go + pty_darwin.go), as on Linux Machines

    def __init__(self, options: Mapping[str, Any], *, host: MacHost | None = None) -> None:
        super().__init__(options)
        opts = self.options
        self.host = host or read_host()
        self.book = RecordBook(self.state_root, MacosVmRecord, MacosVmPaths)
        self.bases = BaseStore(self.state_root)
        self.bases_file = Path(opts.bases_file) if opts.bases_file else None
        self.policy = PinPolicy(opts.allow_unpinned, opts.allow_unpinned_in_ci)
        self.disk_bytes: int = opts.disk_size
        self.boot_timeout = opts.boot_timeout
        self.stop_mode: str = opts.stop_mode
        self.python: str = opts.python or sys.executable
        self.frameworks: Callable[[], Frameworks] = load_frameworks
        """PyObjC's modules, imported on first use (only on a Mac)."""
        self.clonefile: CloneFn | None = None
        """``clonefile(2)`` (None: the C library's)."""
        memory = psutil.virtual_memory().total
        self.rules = Rules(
            display=self.display,
            architecture="arm64",
            cpus=os.cpu_count() or 1,
            memory_bytes=memory,
            min_memory_bytes=2 * 1024 * MIB,
            min_memory_why="the least any macOS guest boots with; the base may need more",
            profiles=("developer",),
            platform_hint=" (use platform darwin/arm64 or leave it empty)",
            reserved_why="belongs to the macOS system or to vz",
            bind_dirs_only=True,
            tmpfs_options=_TMPFS_OPTIONS,
            target_os="darwin",
        )

    def snapshots(self) -> bool:
        """The VM state can be saved and restored (macOS 14+ hosts)."""
        return self.host.save_restore

    # -- facts

    async def runtime_version(self) -> str:
        if self.host.unsupported:
            return ""
        return "macOS " + ".".join(map(str, self.host.macos))

    async def extension_facts(self) -> tuple[dict[str, str], str, str]:
        reason = self.host.unsupported or self.host.missing_bindings
        facts = {
            "status": STATUS,
            "state_dir": str(self.state_root),
            "host_supported": "yes" if not reason else f"no: {reason}",
            "agent_transport": "virtio-socket through the VM helper's relay socket",
            "shares": "virtio-fs (read-only enforced by VZSharedDirectory readOnly)",
            "network": "virtio-net NAT",
            "save_restore": "yes (macOS 14+)" if self.host.save_restore else "no (needs macOS 14+ on a supported host)",
            "stop_mode": self.stop_mode,
            "docker": "never (a macOS Machine has no Docker and no Linux sidecar)",
        }
        return facts, "" if reason else "virtualization.framework", reason

    async def preflight(self) -> None:
        if self.host.unsupported:
            raise UnsupportedError(self.host.unsupported, details={"driver": DRIVER, "host_os": self.host.system})
        if self.host.missing_bindings:
            raise UnavailableError(self.host.missing_bindings, details={"driver": DRIVER})
        if self.stop_mode == "save" and not self.host.save_restore:
            raise UnsupportedError(
                "stop_mode=save needs macOS 14 or newer on the host", details={"option": "stop_mode"}
            )

    async def provisioning_preflight(self) -> None:
        await self.preflight()
        await asyncio.to_thread(load_bases, self.bases_file)
        agent = await self.agent_binary()
        await asyncio.to_thread(check_darwin_arm64, agent)

    # -- create

    async def plan(self, request: RunImageRequest, key: str) -> MachinePlan[MacosVmRecord]:
        await self.preflight()
        common = validate_common(request, self.rules)
        if common.egress != "allow":
            raise UnsupportedError(
                "label vz.egress=deny is not enforced by the macos_vm driver (NAT networking only); remove it",
                details={"field": "labels"},
            )
        for name, values in (("cap_add", request.cap_add), ("security_opt", request.security_opt)):
            if values:
                raise UnsupportedError(
                    f"{name} is a Linux container setting; a macOS Machine has no Linux capabilities or security "
                    "options (commands may run as root inside the VM): remove it",
                    details={"field": name},
                )
        if common.storage_bytes:
            raise UnsupportedError(
                "host_requirements.storage_bytes is not supported: a macOS Machine's disk is a clone of its base "
                "(the driver option disk_size sets the base's size)",
                details={"field": "host_requirements.storage_bytes"},
            )
        self._check_socket_paths(key)
        bases = await asyncio.to_thread(load_bases, self.bases_file)
        base = resolve_base(request.image, bases, self.policy)
        installed = await asyncio.to_thread(self.bases.installed, base.base_id)
        if installed is not None:
            # Framework and base limits are known once the base is installed: check the request now.
            self._vm_plan(_probe_request(common.cpus, common.memory_bytes), installed)
        argv = [request.entrypoint, *request.args] if request.entrypoint else list(request.args)
        record = MacosVmRecord(
            workspace_id=request.workspace_id,
            key=key,
            machine_id=secrets.token_hex(16),
            created_at=now(),
            image_ref=request.image,
            image_digest=f"sha256:{base.sha256}" if base.sha256 else "",
            argv=argv,
            environment=dict(request.environment),
            image_env=[],
            working_dir=common.mounts[0].target if request.workspace_mount else "/",
            user=request.user or "root",
            developer_identity=request.developer_identity(),
            labels=common.labels,
            mounts=list(common.mounts),
            cpus=common.cpus,
            memory_bytes=common.memory_bytes,
            egress=common.egress,
            base_id=base.base_id,
            base_sha256=base.sha256,
            mac_address=_mac_address(),
            stop_mode=self.stop_mode,
            extra={"workspace_target": common.mounts[0].target if request.workspace_mount else ""},
        )
        return MachinePlan(record, {"base": base})

    def _check_socket_paths(self, key: str) -> None:
        paths = self.book.paths(key)
        for path in (paths.control, paths.agent):
            size = len(os.fsencode(path))
            if size >= _SUN_PATH:
                raise FailedPreconditionError(
                    f"the Machine's socket path {path} is {size} bytes, more than a Unix socket address holds "
                    f"({_SUN_PATH - 1}); set a shorter state directory: `vz driver configure macos_vm "
                    "state_dir=<shorter path>`",
                    details={"option": "state_dir", "path": str(path)},
                )

    def _vm_plan(self, request: VmRequest, base: InstalledBase) -> VmPlan:
        limits = framework_limits(self.frameworks(), base_min_cpus=base.min_cpus, base_min_memory=base.min_memory)
        return plan_vm(request, limits, host_macos=self.host.macos)

    async def stage(self, plan: MachinePlan[MacosVmRecord]) -> None:
        """Install the base once (long: the restore image is installed into a fresh disk), and check that it is
        provisioned; both happen before an old Machine is replaced."""
        base = plan.staged["base"]
        installed = await asyncio.to_thread(self.bases.installed, base.base_id)
        if installed is None:
            ipsw, digest = await asyncio.to_thread(self.bases.restore_image, base)
            installed = await self._install(base.base_id, ipsw, digest)
        if not installed.provisioned:
            script = await asyncio.to_thread(self._write_provisioning, installed)
            raise FailedPreconditionError(
                f"base {installed.base_id} is installed but not provisioned with the vz agent daemon; run once, as "
                f"an administrator: `sudo sh {script}` (see docs/drivers/macos_vm.md, Provisioning), then retry",
                details={"base": installed.base_id, "script": str(script)},
            )
        plan.staged["installed"] = installed
        identifier = self.frameworks().vz.VZMacMachineIdentifier.alloc().init()
        plan.staged["identifier"] = bytes(identifier.dataRepresentation())

    async def _install(self, base_id: str, ipsw: Path, digest: str) -> InstalledBase:
        root = self.bases.bases_dir / base_id
        await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True, mode=0o700)
        log = root / "install.log"
        argv = [
            self.python,
            "-m",
            "vz_drivers.macos_vm._helper",
            "install",
            "--base-dir",
            str(root),
            "--ipsw",
            str(ipsw),
            "--sha256",
            digest,
            "--disk-bytes",
            str(self.disk_bytes),
        ]
        out = await asyncio.to_thread(open, log, "ab")
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out)
            code = await proc.wait()
        finally:
            out.close()
        installed = await asyncio.to_thread(self.bases.installed, base_id)
        if code != 0 or installed is None:
            raise RuntimeFailureError(
                f"installing base {base_id} from {ipsw} failed (exit {code}); see {log}", runtime_message=tail(log)
            )
        return installed

    def _write_provisioning(self, base: InstalledBase) -> Path:
        files = base.root / "provision"
        files.mkdir(exist_ok=True, mode=0o700)
        atomic_write(files / f"{LABEL}.plist", launchd_plist(), 0o644)
        atomic_write(files / "vz-boot", BOOT_SCRIPT.encode(), 0o755)
        script = base.root / "provision.sh"
        text = provision_script(disk=str(base.disk), files_dir=str(files), marker=str(base.root / "provisioned"))
        atomic_write(script, text.encode(), 0o700)
        return script

    def make_machine_dir(self, record: MacosVmRecord, plan: MachinePlan[MacosVmRecord]) -> None:
        paths = self.book.paths(record.key)
        self.bases.clone_machine(
            plan.staged["installed"], paths.root, plan.staged["identifier"], clonefile=self.clonefile
        )

    # -- boot

    def _shares(self, record: MacosVmRecord) -> tuple[list[Share], list[RamDisk]]:
        shares: list[Share] = []
        ram: list[RamDisk] = []
        for index, mount in enumerate(record.mounts):
            if mount.type == "tmpfs":
                ram.append(RamDisk(mount.target, _tmpfs_size(mount.options)))
            else:
                shares.append(Share(f"vz{index}", mount.host_path, mount.read_only, mount.target))
        return shares, ram

    def _write_boot(self, record: MacosVmRecord, paths: MacosVmPaths, agent: Path) -> VmPlan:
        installed = self.bases.installed(record.base_id)
        if installed is None:
            raise FailedPreconditionError(
                f"base {record.base_id} of Machine {record.workspace_id!r} is no longer installed; recreate the "
                "Machine with `vz up --recreate`"
            )
        shares, ram = self._shares(record)
        request = VmRequest(
            cpus=record.cpus,
            memory_bytes=record.memory_bytes,
            disk=str(paths.disk),
            auxiliary_storage=str(paths.aux),
            hardware_model=str(paths.hardware_model),
            machine_identifier=str(paths.machine_identifier),
            mac_address=record.mac_address,
            shares=tuple(shares),
            config_dir=str(paths.cfg),
        )
        vm_plan = self._vm_plan(request, installed)
        shutil.rmtree(paths.cfg, ignore_errors=True)
        paths.cfg.mkdir(parents=True, mode=0o700)
        # The agent starts commands with exactly these variables: macOS's default PATH unless the request sets one.
        env = tuple(f"{k}={v}" for k, v in {"PATH": _GUEST_PATH, **record.environment}.items())
        boot = BootConfig(
            shares=tuple(SharedMount(s.tag, s.target) for s in shares),
            ram_disks=tuple(ram),
            env=env,
            main_argv=tuple(record.argv),
            main_user="" if record.user == "root" else record.user,
            main_workdir=record.working_dir,
            stop_timeout=self.stop_timeout,
        )
        atomic_write(paths.cfg / "boot.sh", boot_config(boot).encode(), 0o600)
        shutil.copyfile(agent, paths.cfg / AGENT_IN_CONFIG)
        os.chmod(paths.cfg / AGENT_IN_CONFIG, 0o500)
        atomic_write(paths.plan, json.dumps(vm_plan.to_json()).encode(), 0o600)
        return vm_plan

    async def boot(self, record: MacosVmRecord) -> None:
        paths = self.book.paths(record.key)
        agent = await self.agent_binary()
        await asyncio.to_thread(check_darwin_arm64, agent)
        await asyncio.to_thread(self._write_boot, record, paths, agent)
        for stale in (paths.control, paths.agent):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        argv = [
            self.python,
            "-m",
            "vz_drivers.macos_vm._helper",
            "run",
            "--plan",
            str(paths.plan),
            "--control",
            str(paths.control),
            "--agent",
            str(paths.agent),
            "--log",
            str(paths.helper_log),
        ]
        restore = record.stop_mode == "save" and paths.saved_state.is_file()
        if restore:
            argv += ["--restore", str(paths.saved_state)]
        # The identity key the agent proves on every handshake: a fresh one per cold boot, handed over in the first
        # HELLO (the agent takes it only from the host's CID over vsock); a restored VM's agent keeps the key it
        # took before it was saved.
        if not (restore and self.agent_keys is not None and self.agent_keys.get(record) is not None):
            self.new_identity_key(record)
        # The helper forks once its sockets listen: the parent prints the child's pid and exits 0, or says why
        # not on stderr and exits non-zero. The child (the Machine's process) keeps none of our pipes.
        launcher = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        said, complaint = await launcher.communicate()
        word = said.decode(errors="replace").strip()
        if launcher.returncode != 0 or not word.isdigit():
            why = complaint.decode(errors="replace").strip() or word or "no message"
            raise RuntimeFailureError(
                f"the macOS VM helper did not start: {why.splitlines()[-1]}",
                runtime_message=why[-4000:] + tail(paths.helper_log),
            )
        pid = int(word)
        start = proc_start_time(pid)
        if start is None:
            raise RuntimeFailureError(
                "the macOS VM helper exited right after starting", runtime_message=tail(paths.helper_log)
            )
        record.pid, record.pid_start = pid, start

    async def connect(self, record: MacosVmRecord, *, booting: bool) -> AgentLink:
        from vz_drivers._agent import AgentClient

        paths = self.book.paths(record.key)
        what = f"Machine {record.workspace_id!r}"
        while True:
            try:
                reader, writer = await open_agent_socket(paths.agent, record.pid, what=what)
                # One session per connection (the relay opens a new guest stream each time): no stream mode.
                client = await AgentClient.from_streams(
                    reader, writer, timeout=30.0, identity_key=self.identity_key(record), hand_over_key=booting
                )
                break
            except UnavailableError:
                # The relay closes a connection while the guest's agent is not listening yet (macOS boots for
                # tens of seconds); the driver bounds this with boot_timeout and watches the helper's death.
                if not booting:
                    raise
                await asyncio.sleep(1.0)
        if record.stop_mode == "save":
            with contextlib.suppress(FileNotFoundError):
                paths.saved_state.unlink()  # restored (or cold-booted): a saved state is used once
        return AgentLink(client=client, pid=record.pid, pid_start=record.pid_start)

    def diagnose(self, record: MacosVmRecord) -> tuple[str, str]:
        log = tail(self.book.paths(record.key).helper_log)
        lines = [line for line in log.splitlines() if line.strip()]
        return (lines[-1] if lines else "the VM helper wrote nothing"), log

    # -- stop

    async def control(self, record: MacosVmRecord, request: dict[str, Any], *, limit: float) -> dict[str, Any]:
        """One control request to the Machine's helper (``_control`` protocol)."""
        path = self.book.paths(record.key).control
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), 10)
        try:
            writer.write(encode({"id": 1, **request}))
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), limit)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        reply = decode(line) if line else {"ok": False, "error": "the helper closed the connection"}
        if not reply.get("ok"):
            raise RuntimeFailureError(f"the macOS VM helper refused {request['op']}: {reply.get('error')}")
        return reply

    async def shutdown(self, record: MacosVmRecord, link: AgentLink) -> None:
        """Save the VM's state (``stop_mode=save``) or ask the guest to power off, forced after ``stop_timeout``."""
        paths = self.book.paths(record.key)
        if record.stop_mode == "save" and self.host.save_restore:
            try:
                await self.control(
                    record, {"op": "save", "path": str(paths.saved_state)}, limit=self.stop_timeout + 120
                )
                return
            except (OSError, TimeoutError, RuntimeFailureError):
                with contextlib.suppress(FileNotFoundError):
                    paths.saved_state.unlink()
        await self.control(record, {"op": "stop", "timeout": self.stop_timeout}, limit=self.stop_timeout + 30)

    async def release(self, record: MacosVmRecord) -> None:
        paths = self.book.paths(record.key)
        for leftover in (paths.control, paths.agent):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()

    async def remove_host_state(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.bases.bases_dir, True)


def _probe_request(cpus: int, memory: int) -> VmRequest:
    return VmRequest(
        cpus=cpus,
        memory_bytes=memory,
        disk="",
        auxiliary_storage="",
        hardware_model="",
        machine_identifier="",
        mac_address="",
    )


class MacosVmDriver(AgentMachineDriver[MacosVmRecord, MacosVmPaths]):
    """macOS Machines on Apple silicon through Virtualization.framework. Options: see the declaration."""

    def __init__(self, options: Mapping[str, Any] | None = None, /, **raw: Any) -> None:
        super().__init__(MacosVmBackend(DECLARATION.options_of(options, raw)))

    @classmethod
    def with_backend(cls, backend: MacosVmBackend) -> MacosVmDriver:
        """The driver over an already built backend (one whose host facts or framework loader were chosen)."""
        driver = cls.__new__(cls)
        AgentMachineDriver.__init__(driver, backend)
        return driver

    async def remove_machines(self) -> None:
        """Delete every Machine of this state directory; installed bases and restore images stay (CI runners
        keep their base; ``remove_everything`` removes those too)."""
        for record in list(self._store.records()):
            await self.delete(record.workspace_id)
