"""The hyperv driver: Linux Machines on Windows as Hyper-V Generation 2 virtual machines. Status: DEV.

A Machine is a VM named ``vz-<key>`` booting its own VHDX (GPT: an EFI system partition with a unified
kernel image of the vz guest and the Machine's configuration, plus the image's root filesystem as ext4; see
``vz_drivers.hyperv._guest``). The guest agent is PID 1 and listens on an AF_VSOCK port; the host reaches it
over a Hyper-V socket (``AF_HYPERV``, address = the VM's GUID + the port's service GUID
``<port:08x>-facb-11e6-bd58-64006a7986d3``, registered under GuestCommunicationServices when the VM is created
and removed with it). Networking is the Hyper-V switch given by the ``switch`` option ("Default Switch": NAT
with DHCP); ``vz.egress=deny`` leaves the adapter unconnected. The workspace, bind mounts and volumes are SMB
shares of the host that the guest mounts (``vz_drivers.hyperv._shares``: made before each boot, mounted through
the agent once it answers, removed when the Machine stops). Every Hyper-V operation is a fixed PowerShell
script (``vz_drivers.hyperv._scripts``) run by a ``ScriptRunner``.

Not verified on Windows yet: written to the documented Hyper-V module and tested here with a stand-in runner
that checks every script against the cmdlets' documented parameter sets; the guest disk is built and booted here
under QEMU + OVMF. On any other host Info answers and Preflight/RunImage fail with the reason before anything is
touched. See docs/drivers/hyperv.md.

A Hyper-V VM is not a process of ours. The shared layer keys agent connections on ``pid``/``pid_start``: here
``pid`` is ``VM_PID`` (a marker: "a VM") and ``pid_start`` the boot's start time in nanoseconds, so a new boot
never reuses an old connection. Liveness is the VM's state in Hyper-V: the backend hooks ``alive``, ``kill``
and ``wait_gone`` below.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import secrets
import shutil
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from vz_core import ExecExit, ExecOutput, RunImageRequest
from vz_core.errors import (
    DriverError,
    FailedPreconditionError,
    InvalidArgumentError,
    PermissionDeniedError,
    RuntimeFailureError,
    RuntimeTimeoutError,
    UnavailableError,
    UnsupportedError,
)
from vz_drivers._agent import AgentClient
from vz_drivers._guest import (
    BootTools,
    Bundle,
    GuestConfig,
    GuestMount,
    bundle_cache,
    check_bundle_options,
    default_disk_size,
    env_list,
    find_boot_tools,
    find_mke2fs,
    minimum_disk_size,
    open_bundle,
    to_vhdx,
    tree_usage,
)
from vz_drivers._machine import (
    AgentLink,
    AgentMachineDriver,
    Backend,
    MachinePlan,
    Rules,
    atomic_write,
    record_fields,
    validate_common,
)
from vz_drivers.hyperv import _scripts as ps
from vz_drivers.hyperv._guest import BootImage, build_boot_disk, render_config
from vz_drivers.hyperv._host import HostSupport, check_create_privileges, check_privileges, host_support
from vz_drivers.hyperv._ps import PowerShellRunner, Script, ScriptRunner
from vz_drivers.hyperv._records import HypervBook, HypervPaths, HypervRecord
from vz_drivers.hyperv._shares import (
    MachineShares,
    check_access,
    generate_password,
    machine_shares,
    mount_spec,
    orphans,
    redact,
    state_tag,
)
from vz_drivers.hyperv.registration import DECLARATION

__all__ = ["DRIVER_NAME", "STATUS", "VM_PID", "HypervBackend", "HypervDriver"]

DRIVER_NAME = "hyperv"
STATUS = (
    "DEV (written to the documented Hyper-V module; guest disk verified under QEMU + OVMF; not verified on Windows)"
)
VM_PID = 1
DEFAULT_MEMORY = 1024 * 1024 * 1024
DEFAULT_CPUS = 2
MIN_MEMORY = 256 * 1024 * 1024
_MEMORY_STEP = 2 * 1024 * 1024  # Hyper-V assigns memory in 2 MiB units
_SCRIPT_TIMEOUT = 120.0
_IDS_FILE = "hyperv.json"
_SHARED_FILE = "shares.active"


_RULES: dict[str, Any] = {
    "display": "the hyperv driver",
    "architecture": "amd64",
    "min_memory_bytes": MIN_MEMORY,
    "min_memory_why": "256 MiB a Hyper-V Linux guest needs",
    "platform_hint": " (Hyper-V Generation 2)",
    "userns_hint": ": a Machine is a whole virtual machine",
    "reserved_why": "belongs to the Machine's kernel",
    "bind_dirs_only": True,
}


class HypervBackend(Backend[HypervRecord, HypervPaths]):
    """Hyper-V Generation 2 VMs booting the vz guest from their own VHDX; the agent over Hyper-V sockets."""

    name = DRIVER_NAME
    display = "the hyperv driver"
    runtime_name = "hyper-v"
    stop_slack = 20.0
    keep_log_on_stop = True
    graceful_replace = False
    storage_limits = True
    mount_timeout = 60.0
    """Seconds one share mount in the guest may take (cifs retries an unreachable server for a long time)."""
    book: HypervBook

    declaration = DECLARATION

    def __init__(
        self,
        options: Mapping[str, Any] | None = None,
        /,
        *,
        runner: ScriptRunner | None = None,
        host: HostSupport | None = None,
        **raw: Any,
    ) -> None:
        super().__init__(DECLARATION.options_of(options, raw))
        opts = self.options
        self.boot_timeout = opts.boot_timeout
        self.book = HypervBook(self.state_root)
        self.switch: str = opts.switch
        self.secure_boot_template: str = opts.secure_boot_template
        check_bundle_options(opts.guest, opts.guest_sha256)
        self._guest_opt, self._guest_sha256 = opts.guest, opts.guest_sha256
        self.runner: ScriptRunner = runner if runner is not None else PowerShellRunner(opts.powershell)
        self.support = host if host is not None else host_support()
        self._probe: ps.HostProbe | None = None
        self._boot_image: BootImage | None = None
        self._pending_mounts: dict[str, tuple[ps.SharesMade, str]] = {}
        """Shares made for a boot that the guest has not mounted yet, with the boot's password (memory only)."""
        self.rules = Rules(cpus=os.cpu_count() or 1, memory_bytes=0, **_RULES)

    # ------------------------------------------------------------------ scripts

    async def _run(self, script: Script, timeout: float = _SCRIPT_TIMEOUT, **args: Any) -> Any:  # noqa: ASYNC109 - bounds the script
        return await self.runner.run(script, args, timeout=timeout)

    async def probe(self) -> ps.HostProbe:
        if self._probe is None:
            self._probe = ps.parse_probe(await self._run(ps.PROBE))
        return self._probe

    async def vm_state(self, record: HypervRecord) -> ps.VmState | None:
        """The Machine's VM as Hyper-V sees it now (None when it does not exist)."""
        value = await self._run(ps.STATE, name=record.vm_name, id=record.vm_id)
        return ps.parse_state(ps.STATE.name, value)

    # ------------------------------------------------------------------ facts

    async def runtime_version(self) -> str:
        if not self.support.supported:
            return ""
        with contextlib.suppress(DriverError):
            return (await self.probe()).module_version
        return ""

    async def extension_facts(self) -> tuple[dict[str, str], str, str]:
        support = self.support
        facts: dict[str, str] = {
            "status": STATUS,
            "state_dir": str(self.book.root),
            "host_os": support.system,
            "host_supported": "yes" if support.supported else f"no: {support.reason}",
            "vm": "Hyper-V Generation 2, UEFI, secure boot "
            + (f"on ({self.secure_boot_template})" if self.secure_boot_template else "off"),
            "boot_disk": "VHDX: GPT with an EFI system partition (unified kernel image) and an ext4 root",
            "agent_transport": "Hyper-V socket (AF_HYPERV on the host, AF_VSOCK in the guest)",
            "network": f"Hyper-V switch {self.switch!r} (egress deny: adapter not connected)",
            "shares": "workspace, bind and volume mounts as SMB 3.1.1 shares of the host (encrypted, one local "
            "account per Machine, read-only enforced by the share's access list), mounted by the guest (cifs)",
        }
        if support.supported:
            try:
                probe = await self.probe()
                facts["hyperv_module"] = probe.module_version or "missing"
                facts["user"] = probe.user
                facts["privileges"] = (
                    "elevated" if probe.elevated else "Hyper-V Administrators" if probe.hyperv_administrator else "none"
                )
                facts["switches"] = ", ".join(probe.switches)
            except DriverError as exc:
                facts["hyperv_module"] = f"unavailable: {exc.message}"
        return facts, "hyper-v" if support.supported else "", support.reason

    async def preflight(self) -> None:
        if not self.support.supported:
            raise UnsupportedError(self.support.reason, details={"driver": DRIVER_NAME, "host_os": self.support.system})
        check_privileges(await self.probe())

    async def provisioning_preflight(self) -> None:
        await self.preflight()
        check_create_privileges(await self.probe())
        await asyncio.to_thread(self._guest_tools)
        await asyncio.to_thread(self.book.ensure)

    # ------------------------------------------------------------------ the guest

    def _guest_tools(self) -> tuple[BootTools, Bundle]:
        tools = find_boot_tools()
        find_mke2fs()
        if not self._guest_opt:
            raise UnavailableError(
                "the hyperv driver needs the option guest=<bundle>: the vz guest bundle for amd64 (format hyperv), "
                "a directory or an https:// URL of its manifest.json; see docs/drivers/hyperv.md (`vz guest fetch` "
                "/ `vz guest build`)",
                details={"option": "guest"},
            )
        bundle = open_bundle(self._guest_opt, bundle_cache(), digest=self._guest_sha256)
        if bundle.format != "hyperv" or bundle.arch != "amd64":
            raise FailedPreconditionError(
                f"the guest bundle {self._guest_opt} is for {bundle.arch} {bundle.format}; this host needs amd64 "
                "hyperv (`vz guest build --arch amd64 --format hyperv`)",
                details={"option": "guest"},
            )
        return tools, bundle

    async def boot_image(self) -> tuple[BootTools, BootImage]:
        """The bundle's unified kernel image, verified against its manifest before every boot."""
        tools, bundle = await asyncio.to_thread(self._guest_tools)
        self._boot_image = BootImage(path=bundle.file("uki"), initramfs_digest=bundle.digest)
        return tools, self._boot_image

    # ------------------------------------------------------------------ create

    async def plan(self, request: RunImageRequest, key: str) -> MachinePlan[HypervRecord]:
        await self.preflight()
        check_create_privileges(await self.probe())
        probe = await self.probe()
        rules = replace(self.rules, cpus=probe.cpus or self.rules.cpus, memory_bytes=probe.memory_bytes)
        valid = validate_common(request, rules)
        shared = [m for m in valid.mounts if m.type != "tmpfs"]
        if shared and (valid.egress != "allow" or not self.switch):
            raise UnsupportedError(
                f"{self.display} shares host directories with the guest over SMB on the Machine's switch, and "
                + (
                    "label vz.egress=deny leaves the VM without a network adapter"
                    if valid.egress != "allow"
                    else "the driver option switch is empty (no network adapter)"
                )
                + f": drop the {shared[0].type} mount at {shared[0].target} or connect the Machine to a switch",
                details={"field": "workspace_mount" if request.workspace_mount else "mounts"},
            )
        if valid.memory_bytes % _MEMORY_STEP:
            raise InvalidArgumentError(
                f"host_requirements.memory_bytes={valid.memory_bytes}: Hyper-V assigns memory in 2 MiB steps",
                details={"field": "host_requirements.memory_bytes"},
            )
        if valid.egress == "allow" and self.switch and self.switch not in (await self.probe()).switches:
            raise UnavailableError(
                f"the Hyper-V switch {self.switch!r} does not exist (switches: "
                f"{', '.join((await self.probe()).switches) or 'none'}); set the driver option switch",
                details={"option": "switch"},
            )
        image = await self.images.resolve(request, architecture="amd64", display=self.display)
        usage = await asyncio.to_thread(tree_usage, image.rootfs)
        disk_bytes = valid.storage_bytes // 4096 * 4096 or default_disk_size(usage)
        if disk_bytes < minimum_disk_size(usage):
            raise InvalidArgumentError(
                f"host_requirements.storage_bytes={valid.storage_bytes} is too small for the image {request.image!r} "
                f"(its root filesystem needs {minimum_disk_size(usage)} bytes)",
                details={"field": "host_requirements.storage_bytes"},
            )
        port = 0x10000000 + secrets.randbelow(0x60000000)
        fields = record_fields(request, key, image, valid)
        fields["cpus"] = valid.cpus or min(DEFAULT_CPUS, rules.cpus)
        fields["memory_bytes"] = valid.memory_bytes or DEFAULT_MEMORY
        record = HypervRecord(
            **fields,
            disk_bytes=disk_bytes,
            vsock_port=port,
            switch=self.switch if valid.egress == "allow" else "",
            secure_boot=self.secure_boot_template or "Off",
        )
        return MachinePlan(record, staged={"rootfs": image.rootfs, "layers": image.layers})

    def _config(self, record: HypervRecord) -> str:
        mounts = tuple(
            GuestMount(target=m.target, read_only=m.read_only, options=m.options)
            for m in record.mounts
            if m.type == "tmpfs"
        )
        config = GuestConfig(
            hostname="vz-" + record.key[:12],
            mounts=mounts,
            env=env_list(record.image_env, record.environment),
            argv=tuple(record.argv),
            user=record.user,
            workdir=record.working_dir or "/",
            stop_timeout=self.stop_timeout,
            sessions=1,
            network=bool(record.switch),
            resolv_conf=record.egress == "allow",
        )
        return render_config(config, vsock_port=record.vsock_port)

    async def build_raw_disk(self, record: HypervRecord, layers: Sequence[tuple[str, Path]], work: Path) -> Path:
        """The Machine's raw boot disk ``work/disk.img`` (what becomes its VHDX; QEMU + OVMF boot it as is)."""
        tools, boot = await self.boot_image()
        raw = work / "disk.img"
        await build_boot_disk(
            tools,
            uki=boot.path,
            config=self._config(record),
            hostname="vz-" + record.key[:12],
            layers=layers,
            root_bytes=record.disk_bytes,
            image=record.image_ref,
            work=work,
            target=raw,
            seed=record.key,
        )
        return raw

    async def stage(self, plan: MachinePlan[HypervRecord]) -> None:
        record = plan.record
        tools, _ = await self.boot_image()
        work = self.book.staging / f"{record.key}-{uuid.uuid4().hex[:8]}"
        await asyncio.to_thread(work.mkdir, parents=True, mode=0o700)
        plan.staged["work"] = work
        raw = await self.build_raw_disk(record, plan.staged["layers"], work)
        vhdx = work / "disk.vhdx"
        await to_vhdx(tools, raw, vhdx)
        await asyncio.to_thread(os.chmod, vhdx, 0o600)  # it holds config.sh, i.e. the Machine's secrets
        await asyncio.to_thread(raw.unlink)
        plan.staged["disk"] = vhdx

    def unstage(self, plan: MachinePlan[HypervRecord]) -> None:
        work = plan.staged.get("work")
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)

    def make_machine_dir(self, record: HypervRecord, plan: MachinePlan[HypervRecord]) -> None:
        paths = self.book.paths(record.key)
        paths.vm_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.replace(plan.staged["disk"], paths.disk)
        self._write_ids(record)

    def _write_ids(self, record: HypervRecord) -> None:
        # What deleting needs once the record is gone (the shared layer removes the record first).
        shares = self.shares_of(record)
        ids = {
            "vm_name": record.vm_name,
            "vm_id": record.vm_id,
            "service_id": record.service_id,
            "shares": bool(shares.shares),
            "share_paths": shares.paths,
        }
        atomic_write(self.book.paths(record.key).root / _IDS_FILE, json.dumps(ids).encode(), 0o600)

    # ------------------------------------------------------------------ the VM

    async def create_vm(self, record: HypervRecord) -> ps.VmState:
        """Create the Machine's VM (and register its Hyper-V socket service); leftovers of a crash go first."""
        paths = self.book.paths(record.key)
        await self.remove_vm(record.vm_name, "", record.service_id)
        try:
            value = await self._run(
                ps.CREATE,
                name=record.vm_name,
                path=str(paths.vm_dir),
                disk=str(paths.disk),
                memory_bytes=record.memory_bytes,
                cpus=record.cpus,
                switch=record.switch,
                secure_boot_template="" if record.secure_boot == "Off" else record.secure_boot,
                com_pipe=f"\\\\.\\pipe\\{record.vm_name}-com1",
                notes=f"vz Machine {record.key} (created by vz; delete it with vz)",
                service_id=record.service_id,
                service_name=f"vz agent of {record.vm_name}",
            )
            state = ps.parse_state(ps.CREATE.name, value)
            if state is None:
                raise UnavailableError(f"Hyper-V created no VM {record.vm_name}")
        except BaseException:
            with contextlib.suppress(Exception):
                await self.remove_vm(record.vm_name, "", record.service_id)
            raise
        record.vm_id = state.id
        await asyncio.to_thread(self._write_ids, record)
        return state

    async def start_vm(self, record: HypervRecord) -> ps.VmState:
        state = ps.parse_state(ps.START.name, await self._run(ps.START, name=record.vm_name, id=record.vm_id))
        if state is None or not state.running:
            raise UnavailableError(
                f"Hyper-V did not start VM {record.vm_name} (state {state.state if state else 'missing'})",
                details={"vm": record.vm_name},
            )
        return state

    async def stop_vm(self, record: HypervRecord, *, graceful: bool) -> ps.VmState | None:
        """Stop the VM: graceful (shutdown integration service) bounded by ``stop_timeout`` + slack, then off."""
        if graceful:
            limit = self.stop_timeout + self.stop_slack
            with contextlib.suppress(DriverError):
                state = ps.parse_state(
                    ps.STOP.name, await self._run(ps.STOP, timeout=limit, name=record.vm_name, id=record.vm_id)
                )
                if state is None or state.off:
                    return state
        value = await self._run(ps.TURN_OFF, name=record.vm_name, id=record.vm_id)
        return ps.parse_state(ps.TURN_OFF.name, value)

    async def remove_vm(self, name: str, vm_id: str, service_id: str) -> ps.Removal:
        value = await self._run(ps.REMOVE, name=name, id=vm_id, service_id=service_id)
        return ps.parse_removal(value)

    # Liveness of a Machine that is not a host process (the shared layer's backend hooks).

    def alive(self, record: HypervRecord) -> bool:
        """Whether the VM runs, asked from Hyper-V (Get-VM). The hook is synchronous: the query runs on a loop of
        its own in a helper thread, so this blocks the caller for one PowerShell call."""
        if record.status != "running" or not record.vm_id:
            return False
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            state = pool.submit(asyncio.run, self.vm_state(record)).result()
        return state is not None and state.running

    async def kill(self, record: HypervRecord) -> None:
        await self.stop_vm(record, graceful=False)

    async def wait_gone(self, record: HypervRecord, limit: float | None = None) -> None:
        """Wait until the VM is off (polling Get-VM: Hyper-V offers no exit event to a script); at ``limit``,
        turn it off."""
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            state = await self.vm_state(record)
            if state is None or state.off:
                return
            if deadline is not None and time.monotonic() >= deadline:
                await self.kill(record)
                return
            await asyncio.sleep(2.0)  # each look is one PowerShell process

    # ------------------------------------------------------------------ boot and the agent

    async def boot(self, record: HypervRecord) -> None:
        if record.vm_id and await self.vm_state(record) is None:
            record.vm_id = ""  # removed behind vz's back (Hyper-V Manager): the Machine's disk is still here
        shares = self.shares_of(record)
        if shares.shares:
            await self.share(record, shares)  # before the VM starts: the guest mounts them once its agent answers
        if not record.vm_id:
            await self.create_vm(record)
        # A fresh identity key for this boot, handed to the agent in the first HELLO of the booting connection (the
        # agent takes it only from the host's CID over the Hyper-V socket) and proven on every later handshake.
        self.new_identity_key(record)
        await self.start_vm(record)
        record.pid, record.pid_start = VM_PID, time.time_ns()

    async def connect(self, record: HypervRecord, *, booting: bool) -> AgentLink:
        """Connect to the agent; the first connection of a boot also mounts the Machine's shares in the guest (the
        Machine is ready once they are mounted)."""
        link = await self.open_link(record, booting=booting)
        if booting:
            try:
                await self.mount_pending(record, link)
            except BaseException:
                await link.close()
                raise
        return link

    async def open_link(self, record: HypervRecord, *, booting: bool) -> AgentLink:
        """The agent's handshake on a new channel: the booting one hands over the boot's identity key, every one
        asks the agent to prove it."""
        reader, writer = await self.open_channel(record, booting=booting)
        client = await AgentClient.from_streams(
            reader,
            writer,
            timeout=None if booting else 30.0,
            identity_key=self.identity_key(record),
            hand_over_key=booting,
        )
        return AgentLink(client=client, pid=record.pid, pid_start=record.pid_start)

    async def open_channel(
        self, record: HypervRecord, *, booting: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to the agent's Hyper-V socket; while booting, retry until it listens (the driver bounds it)."""
        while True:
            try:
                sock = await asyncio.to_thread(_connect_hvsock, record.vm_id, record.service_id)
                break
            except OSError as exc:
                if not booting:
                    raise UnavailableError(
                        f"cannot reach the agent of Machine {record.workspace_id!r} over its Hyper-V socket: {exc}",
                        details={"workspace_id": record.workspace_id, "vm": record.vm_name},
                    ) from None
                await asyncio.sleep(0.5)
        try:
            return await asyncio.open_connection(sock=sock)
        except BaseException:
            sock.close()
            raise

    def diagnose(self, record: HypervRecord) -> tuple[str, str]:
        pipe = f"\\\\.\\pipe\\{record.vm_name}-com1"
        return (
            f"see the VM's serial console ({pipe}) and the Hyper-V-Worker event log of VM {record.vm_name}",
            "",
        )

    async def shutdown(self, record: HypervRecord, link: AgentLink) -> None:
        await link.client.close()
        await self.stop_vm(record, graceful=True)

    # ------------------------------------------------------------------ shares (see _shares)

    def shares_of(self, record: HypervRecord) -> MachineShares:
        return machine_shares(record.key, record.mounts, self.book.root)

    async def share(self, record: HypervRecord, shares: MachineShares) -> None:
        """Make the Machine's shares for this boot (leftovers of earlier ones go first) with a new password, check
        their access lists, and keep them with the password in memory until the guest mounts them."""
        probe = await self.probe()
        if not probe.elevated:
            raise PermissionDeniedError(
                f"Machine {record.workspace_id!r} mounts host directories, which are SMB shares made at every start "
                "(New-SmbShare, a local account, a firewall rule): that needs an elevated process; run vz from an "
                "elevated prompt",
                details={"workspace_id": record.workspace_id},
            )
        await self.sweep_shares()
        await asyncio.to_thread(self._write_ids, record)
        await asyncio.to_thread(atomic_write, self._shared_flag(record.key), b"", 0o600)
        password = generate_password()
        try:
            value = await self._run(
                ps.SHARE,
                prefix=shares.prefix,
                account=shares.account,
                password=password,
                description=shares.description,
                rule=shares.rule,
                switch=record.switch,
                paths=shares.paths,
                shares=shares.share_args(),
            )
            made = ps.parse_shares(value)
            check_access(made, shares)
        except DriverError as exc:
            with contextlib.suppress(Exception):
                await self.unshare(record.key, shares.paths, remove_account=False)
            raise _redacted(exc, password) from None
        self._pending_mounts[record.key] = (made, password)

    async def mount_pending(self, record: HypervRecord, link: AgentLink) -> None:
        """Mount the shares made for this boot in the guest (through the agent), then forget the password."""
        pending = self._pending_mounts.pop(record.key, None)
        if pending is None:
            return
        made, password = pending
        try:
            await self.guest_mount(record, link, made, password)
        except DriverError as exc:
            raise _redacted(exc, password) from None

    async def guest_mount(
        self,
        record: HypervRecord,
        link: AgentLink,
        made: ps.SharesMade,
        password: str,
        *,
        address: str = "",
        port: int = ps.SMB_PORT,
    ) -> None:
        """Mount every share of ``made`` at its target: one exec per share, as root outside the image's root, the
        password on its stdin. ``address``/``port``: the SMB server (default: the host on the Machine's switch)."""
        for share in self.shares_of(record).shares:
            spec = mount_spec(
                record.workspace_id,
                made,
                share,
                uid=record.identity_uid,
                gid=record.identity_gid,
                address=address,
                port=port,
            )
            output, code = b"", -1
            try:
                async with (
                    asyncio.timeout(self.mount_timeout),
                    contextlib.aclosing(
                        link.client.exec(spec, _one_chunk((password + "\n").encode()), root_override="/")
                    ) as events,
                ):
                    async for event in events:
                        if isinstance(event, ExecOutput):
                            output = (output + event.data)[-4000:]
                        elif isinstance(event, ExecExit):
                            code = event.exit_code
            except TimeoutError:
                raise RuntimeTimeoutError(
                    f"Machine {record.workspace_id!r}: mounting {share.target} from the SMB share {spec.argv[5]} did "
                    f"not finish within {self.mount_timeout:g} s (is TCP 445 of the host reachable from the switch? "
                    "see Troubleshooting in docs/drivers/hyperv.md)",
                    details={"workspace_id": record.workspace_id, "mount": share.target},
                ) from None
            if code != 0:
                raise RuntimeFailureError(
                    f"Machine {record.workspace_id!r}: the guest could not mount {share.target} from the SMB share "
                    f"{spec.argv[5]} (exit {code}): {redact(output.decode(errors='replace').strip(), password)}; "
                    "see Troubleshooting in docs/drivers/hyperv.md (firewall, SMB server, switch)",
                    details={"workspace_id": record.workspace_id, "mount": share.target},
                )

    async def unshare(self, key: str, paths: list[str], *, remove_account: bool) -> ps.Unshared:
        names = machine_shares(key, (), self.book.root)
        value = await self._run(
            ps.UNSHARE,
            prefix=names.prefix,
            account=names.account,
            rule=names.rule,
            paths=paths,
            remove_account=remove_account,
        )
        return ps.parse_unshare(value)

    async def sweep_shares(self) -> set[str]:
        """Remove shares and accounts of this state directory whose Machine is gone (left by a crash)."""
        listing = ps.parse_share_listing(await self._run(ps.LIST_SHARES))
        machines = self.book.machines_dir
        exists = {p.name for p in machines.iterdir()} if machines.is_dir() else set()
        keys = orphans(listing.shares, listing.accounts, state_tag(self.book.root), exists)
        for key in sorted(keys):
            paths = [path for name, path, _ in listing.shares if name.startswith(f"vz-{key}-")]
            await self.unshare(key, paths, remove_account=True)
        return keys

    def _shared_flag(self, key: str) -> Path:
        """Present while a Machine's shares exist (made by ``share``, gone with ``release``)."""
        return self.book.paths(key).root / _SHARED_FILE

    async def release(self, record: HypervRecord) -> None:
        """Once the VM is off: its shares, their ACEs and its firewall rule go, its account is disabled."""
        self._pending_mounts.pop(record.key, None)
        flag = self._shared_flag(record.key)
        if not flag.exists():
            return
        if not (await self.probe()).elevated:
            raise PermissionDeniedError(
                f"Machine {record.workspace_id!r} is off, but its SMB shares and their account are still there: "
                "removing them needs an elevated process; run `vz stop` from an elevated prompt",
                details={"workspace_id": record.workspace_id},
            )
        await self.unshare(record.key, self.shares_of(record).paths, remove_account=False)
        flag.unlink(missing_ok=True)

    # ------------------------------------------------------------------ remove

    def remove_tree(self, paths: HypervPaths) -> None:
        try:
            ids = json.loads((paths.root / _IDS_FILE).read_text())
        except (OSError, ValueError):
            ids = {}
        if ids:
            # Runs in a worker thread: the VM and its Hyper-V socket service go before the directory, then the
            # shares, their ACEs, the firewall rule and the Machine's account.
            asyncio.run(self.remove_vm(ids.get("vm_name", ""), ids.get("vm_id", ""), ids.get("service_id", "")))
            if ids.get("shares"):
                share_paths = [str(p) for p in ids.get("share_paths", [])]
                asyncio.run(self.unshare(paths.root.name, share_paths, remove_account=True))
        shutil.rmtree(paths.root, ignore_errors=True)

    async def remove_host_state(self) -> None:
        shutil.rmtree(self.book.staging, ignore_errors=True)
        if self.support.supported:
            await self.sweep_shares()


async def _one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _redacted(exc: DriverError, *secret_values: str) -> DriverError:
    """``exc`` with every secret value removed from its message, diagnostics and details."""
    return type(exc)(
        redact(exc.message, *secret_values),
        runtime_message=redact(exc.runtime_message, *secret_values),
        details={k: redact(v, *secret_values) for k, v in exc.details.items()},
        retryable=exc.retryable,
    )


HVSOCK_CONNECT_DEADLINE = 10.0
"""Seconds one connect to the agent's Hyper-V socket may take before it is abandoned (the socket is closed)."""


def _connect_hvsock(
    vm_id: str,
    service_id: str,
    *,
    deadline: float = HVSOCK_CONNECT_DEADLINE,
    new_socket: Callable[[], socket.socket] | None = None,
) -> socket.socket:
    """A connected Hyper-V socket to service ``service_id`` of VM ``vm_id`` (CPython 3.12+ on Windows).

    The connect is a plain blocking one, in a thread of its own, waited for up to ``deadline`` seconds; past
    that the socket is closed (which ends the blocked connect) and ``TimeoutError`` raised. No socket timeout:
    Python implements one as a non-blocking connect plus ``select``, which AF_HYPERV sockets are not documented
    to support (Microsoft, "Make your own integration services": Hyper-V sockets take the Winsock calls
    socket/connect/bind/listen/accept/send/recv; podman machine's hyperv provider and go-winio's hvsock dial
    with a blocking, overlapped connect, not select). ``new_socket`` makes the socket (tests: a stand-in)."""
    if new_socket is None:
        family = getattr(socket, "AF_HYPERV", None)
        if family is None:
            raise OSError("socket.AF_HYPERV is not available (Windows with Python 3.12 or newer is needed)")
        sock = socket.socket(family, socket.SOCK_STREAM, getattr(socket, "HV_PROTOCOL_RAW", 1))
    else:
        sock = new_socket()
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            sock.connect((vm_id, service_id))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=connect, name="vz-hvsock-connect", daemon=True)
    worker.start()
    worker.join(deadline)
    if not outcome:
        sock.close()  # ends the blocked connect; the thread then finishes on its own
        worker.join(deadline)
        raise TimeoutError(f"connecting to the Hyper-V socket of VM {vm_id} did not finish within {deadline:g} s")
    if outcome[0] is not None:
        sock.close()
        raise outcome[0]
    return sock


class HypervDriver(AgentMachineDriver[HypervRecord, HypervPaths]):
    """Linux Machines as Hyper-V Generation 2 VMs (Windows hosts; DEV). Options: see ``registration.py``."""

    def __init__(self, options: Mapping[str, Any] | None = None, /, **raw: Any) -> None:
        self.backend = HypervBackend(options, **raw)
        super().__init__(self.backend)

    async def run_image(self, request: RunImageRequest) -> None:
        if not request.image:
            raise InvalidArgumentError("RunImage needs an image", details={"field": "image"})
        await super().run_image(request)
