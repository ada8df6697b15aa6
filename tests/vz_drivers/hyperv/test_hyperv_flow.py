"""The hyperv backend inside the shared agent-Machine layer, end to end, with Hyper-V played by the stand-in.

The stand-in host's "VM" is a real ``vz-agent`` process on this host: START launches it (listening on a Unix
socket the test backend connects to instead of a Hyper-V socket), a graceful STOP or TURN_OFF ends it like the
guest powering off. Everything else is the real driver: RunImage's order, the record, the liveness hooks
(``alive`` through Get-VM, ``wait_gone``, ``kill``), readiness, exec, the log kept at Stop, Start again, Delete
(VM and socket service removed with the Machine's directory). The disk itself is a placeholder here (the real
one is built and booted in test_hyperv_guest.py).
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hyperv_standin import WINDOWS, FakeAccount, FakeShare, FakeVm, StandInHyperV

from vz_core import ExecExit, ExecOutput, ExecSpec, Mount, MountType, RunImageRequest
from vz_core.errors import DriverError, FailedPreconditionError, PermissionDeniedError, RuntimeFailureError
from vz_drivers._agent import AgentClient, AgentIdentityError
from vz_drivers._machine import AgentLink, AgentMachineDriver
from vz_drivers.hyperv import _scripts as ps
from vz_drivers.hyperv._driver import HypervBackend
from vz_drivers.hyperv._records import HypervPaths, HypervRecord
from vz_drivers.hyperv._shares import describe, mount_spec, state_tag


class AgentVms(StandInHyperV):
    """The stand-in Hyper-V host whose running VMs are agent processes of this host."""

    def __init__(self, agent_binary: str, workdir: Path) -> None:
        super().__init__()
        self.agent_binary = agent_binary
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def socket_of(self, name: str) -> Path:
        return self.workdir / f"{name[-8:]}.sock"

    def _power_on(self, vm: FakeVm) -> None:
        sock = self.socket_of(vm.name)
        sock.unlink(missing_ok=True)
        self.procs[vm.name] = subprocess.Popen(
            [
                self.agent_binary,
                "serve",
                "--listen",
                f"unix:{sock}",
                "--key-from-host",  # as the guest's vz_agent runs it (its socket is the host's only here)
                "--init",
                "--log",
                str(self.workdir / "main.log"),
                "--",
                "sh",
                "-c",
                "echo main says hello; exec sleep 1000000",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _power_off(self, vm: FakeVm) -> None:
        proc = self.procs.pop(vm.name, None)
        if proc is not None:
            proc.terminate()  # the guest's poweroff: SIGTERM to the agent, which stops its main process
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    async def _start(self, args: Any, timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is not None and vm.state != "Running":
            self._power_on(vm)
        return await super()._start(args, timeout)

    async def _stop(self, args: Any, timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is not None:
            self._power_off(vm)
        return await super()._stop(args, timeout)

    async def _turn_off(self, args: Any, timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is not None:
            self._power_off(vm)
        return await super()._turn_off(args, timeout)

    async def _remove(self, args: Any, timeout: float) -> Any:  # noqa: ASYNC109
        vm = self._find(args)
        if vm is not None:
            self._power_off(vm)
        return await super()._remove(args, timeout)


class LocalAgentBackend(HypervBackend):
    """The real backend, but the agent is reached over the stand-in VM's Unix socket, and the disk is a stub.

    The guest's mount commands are recorded, not run: this "guest" is a process of the test host (the real
    mounts run in the guest under QEMU + OVMF against Samba: test_hyperv_shares_guest.py)."""

    vms: AgentVms
    mounted: list[tuple[ps.SharesMade, str, list[ExecSpec]]]

    async def guest_mount(
        self, record: HypervRecord, link: AgentLink, made: ps.SharesMade, password: str, **kw: Any
    ) -> None:
        specs = [
            mount_spec(record.workspace_id, made, share, uid=record.identity_uid, gid=record.identity_gid)
            for share in self.shares_of(record).shares
        ]
        self.mounted.append((made, password, specs))

    async def build_raw_disk(self, record: HypervRecord, layers: Any, work: Path) -> Path:
        raw = work / "disk.img"
        await asyncio.to_thread(raw.write_bytes, b"\0" * (1 << 20))
        return raw

    async def boot_image(self) -> Any:
        from vz_drivers._guest import find_boot_tools

        return find_boot_tools(), None

    async def open_channel(
        self, record: HypervRecord, *, booting: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = self.vms.socket_of(record.vm_name)
        while True:
            try:
                return await asyncio.open_unix_connection(str(sock))
            except OSError:
                if not booting:
                    raise
                await asyncio.sleep(0.05)


async def _none() -> AsyncIterator[bytes]:
    return
    yield b""


async def _run(driver: AgentMachineDriver[HypervRecord, HypervPaths], ws: str, *argv: str) -> tuple[str, ExecExit]:
    out, final = b"", None
    async for event in driver.exec(ExecSpec(workspace_id=ws, argv=argv), _none()):
        if isinstance(event, ExecOutput):
            out += event.data
        elif isinstance(event, ExecExit):
            final = event
    assert final is not None
    return out.decode(), final


async def test_a_machine_through_the_shared_layer(tmp_path: Path, image_dir: Path, agent_binary: str) -> None:
    vms = AgentVms(agent_binary, tmp_path)
    backend = LocalAgentBackend(
        state_dir=tmp_path / "state", image_dir=image_dir, runner=vms, host=WINDOWS, stop_timeout=1
    )
    backend.vms = vms
    backend.mounted = []
    backend.stop_slack = 5
    driver: AgentMachineDriver[HypervRecord, HypervPaths] = AgentMachineDriver(backend)
    ws = "proj/env/../machine ü"
    try:
        await driver.run_image(RunImageRequest(workspace_id=ws, image="vz:default", environment={"TOKEN": "t0k"}))
        record = backend.book.load(next(iter(backend.book.machines_dir.iterdir())).name)
        assert record is not None and record.vm_id
        # The booting handshake handed the boot's identity key to the agent: it proves that key on a new
        # connection, and a host expecting another key refuses it.
        sock = str(vms.socket_of(record.vm_name))
        async with await AgentClient.connect_unix(sock, identity_key=backend.identity_key(record)) as client:
            assert await client.ping() >= 0
        with pytest.raises(AgentIdentityError):
            await AgentClient.connect_unix(sock, identity_key=secrets.token_bytes(32))
        disk = backend.book.paths(record.key).disk
        assert disk.is_file() and disk.stat().st_mode & 0o077 == 0  # the disk holds the Machine's secrets
        assert list(vms.vms) == [record.vm_name] and list(vms.registry) == [record.service_id]
        found = await driver.find(ws)
        assert found is not None and found.state.status == "running"
        text, final = await _run(driver, ws, "sh", "-c", "echo hi from the agent")
        assert (text, final) == ("hi from the agent\n", ExecExit(0))

        await driver.stop(ws)
        assert vms.vms[record.vm_name].state == "Off" and record.vm_name not in vms.procs
        found = await driver.find(ws)
        assert found is not None and found.state.status == "stopped"
        with pytest.raises(FailedPreconditionError, match="is stopped"):
            await _run(driver, ws, "true")
        kept = b"".join([chunk async for chunk in driver.logs(ws)])
        assert b"main says hello" in kept
        assert "stop" in [name for name, _ in vms.calls] and vms.forced == []  # the graceful path sufficed

        await driver.start(ws)
        assert [name for name, _ in vms.calls].count("create") == 1  # the VM is reused, only started
        text, _ = await _run(driver, ws, "echo", "again")
        assert text == "again\n"

        await driver.delete(ws)
        assert vms.forced == [record.vm_name]  # Delete turns a running Machine off (graceful_replace is off)
        assert vms.vms == {} and vms.registry == {} and vms.procs == {}
        assert await driver.find(ws) is None
        assert list(backend.book.machines_dir.iterdir()) == []
    finally:
        await driver.close()
        for vm in list(vms.vms.values()):
            vms._power_off(vm)


def _files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


async def test_workspace_and_mounts_are_smb_shares_of_the_machine(
    tmp_path: Path, image_dir: Path, agent_binary: str
) -> None:
    vms = AgentVms(agent_binary, tmp_path)
    state = tmp_path / "state"
    backend = LocalAgentBackend(state_dir=state, image_dir=image_dir, runner=vms, host=WINDOWS, stop_timeout=1)
    backend.vms, backend.mounted, backend.stop_slack = vms, [], 5
    driver: AgentMachineDriver[HypervRecord, HypervPaths] = AgentMachineDriver(backend)
    work, ref = tmp_path / "work", tmp_path / "ref"
    work.mkdir()
    ref.mkdir()
    ws = "proj/shares"
    request = RunImageRequest(
        workspace_id=ws,
        image="vz:default",
        workspace_mount=Mount(type=MountType.BIND, source=str(work), target="/workspaces/p"),
        mounts=(
            Mount(type=MountType.BIND, source=str(ref), target="/ref", read_only=True),
            Mount(type=MountType.VOLUME, source="cache", target="/cache"),
            Mount(type=MountType.TMPFS, source="", target="/scratch"),
        ),
    )
    # A crash left the shares and account of a Machine of this state directory that no longer exists.
    gone = "f" * 32
    tag = state_tag(backend.book.root)
    vms.accounts[f"vz-{gone[:16]}"] = FakeAccount("x", describe(gone, tag), "S-1-5-21-9")
    vms.shares[f"vz-{gone}-0$"] = FakeShare(str(ref), describe(gone, tag), [], True, True)
    # ... and one of another vz home on the same host, which is not this driver's to touch.
    other = "e" * 32
    vms.shares[f"vz-{other}-0$"] = FakeShare(str(ref), describe(other, "0123456789ab"), [], True, True)
    try:
        await driver.run_image(request)
        record = backend.book.load(next(iter(backend.book.machines_dir.iterdir())).name)
        assert record is not None
        prefix, account = f"vz-{record.key}-", f"vz-{record.key[:16]}"
        assert sorted(vms.shares) == [f"{prefix}0$", f"{prefix}1$", f"{prefix}2$", f"vz-{other}-0$"]
        assert f"vz-{gone[:16]}" not in vms.accounts  # the crash's leftovers were removed, the other home's kept
        volume = str(backend.book.volume_dir("cache") / "data")
        expected = {
            f"{prefix}0$": (str(work), "Change", "Modify"),
            f"{prefix}1$": (str(ref), "Read", "ReadAndExecute"),
            f"{prefix}2$": (volume, "Change", "Modify"),
        }
        sid = vms.accounts[account].sid
        for name, (path, right, ace) in expected.items():
            share = vms.shares[name]
            assert (share.path, share.access, share.temporary, share.encrypt) == (
                path,
                [(f"DEVBOX\\{account}", right, "Allow")],
                True,
                True,
            )
            assert vms.aces[path] == {sid: ace}
        assert vms.firewall[f"vz-{record.key}-smb"]["alias"] == "vEthernet (Default Switch)"
        # Shares first, then the VM; the guest mounted once its agent answered, with this boot's password.
        create_at = [n for n, _ in vms.calls].index("create")
        assert [n for n, _ in vms.calls].index("share") < create_at
        ((_made, password, specs),) = backend.mounted
        assert vms.accounts[account].password == password and vms.accounts[account].enabled
        assert [s.argv[6] for s in specs] == ["/workspaces/p", "/ref", "/cache"]  # tmpfs stays in the guest
        assert specs[0].argv[5] == f"//172.20.96.1/{prefix}0$"
        options = [s.argv[7].split(",") for s in specs]
        assert [o[0] for o in options] == ["rw", "ro", "rw"]
        assert {"vers=3.1.1", "seal", f"username={account}", "domain=DEVBOX", "uid=0", "gid=0"} <= set(options[1])
        # The password is in no exec request, no record, no file of the state directory.
        assert all(password not in " ".join(s.argv) for s in specs)
        assert _files_containing(tmp_path, password) == []  # state, VM files, logs, sockets' directory

        await driver.stop(ws)
        assert not any(n.startswith(prefix) for n in vms.shares) and f"vz-{record.key}-smb" not in vms.firewall
        assert all(sid not in aces for aces in vms.aces.values())
        assert not vms.accounts[account].enabled  # a stopped Machine's account cannot log on

        # A share a crash left for this Machine is replaced at the next start; the password is new.
        vms.shares[f"{prefix}7$"] = FakeShare(str(ref), "left", [], True, True)
        await driver.start(ws)
        (_, second, _) = backend.mounted[-1]
        assert second != password and vms.accounts[account].password == second
        assert f"{prefix}7$" not in vms.shares and len([n for n in vms.shares if n.startswith(prefix)]) == 3

        await driver.delete(ws)
        assert account not in vms.accounts and not any(n.startswith(prefix) for n in vms.shares)
        assert all(sid not in aces for aces in vms.aces.values()) and vms.firewall == {}
        assert f"vz-{other}-0$" in vms.shares
    finally:
        await driver.close()
        for vm in list(vms.vms.values()):
            vms._power_off(vm)


async def test_shares_are_refused_unless_host_enforced_and_their_password_never_shows(
    tmp_path: Path, image_dir: Path, agent_binary: str
) -> None:
    vms = AgentVms(agent_binary, tmp_path)
    backend = LocalAgentBackend(
        state_dir=tmp_path / "state", image_dir=image_dir, runner=vms, host=WINDOWS, stop_timeout=1
    )
    backend.vms, backend.mounted, backend.stop_slack = vms, [], 5
    driver: AgentMachineDriver[HypervRecord, HypervPaths] = AgentMachineDriver(backend)
    ref = tmp_path / "ref"
    ref.mkdir()
    request = RunImageRequest(
        workspace_id="ro",
        image="vz:default",
        mounts=(Mount(type=MountType.BIND, source=str(ref), target="/ref", read_only=True),),
    )
    try:
        # A host policy that adds an entry to new shares (here: Everyone may read) is not what vz asked for.
        vms.extra_access = ("Everyone", "Read", "Allow")
        with pytest.raises(RuntimeFailureError, match=r"access list .*expected only Read for DEVBOX"):
            await driver.run_image(request)
        assert vms.vms == {} and vms.shares == {} and backend.mounted == []  # nothing booted, nothing left
        vms.extra_access = None
        # A PowerShell error quoting the password says everything but the password.
        vms.echo_password = True
        with pytest.raises(DriverError) as caught:
            await driver.run_image(request)
        assert "the value *** was refused" in caught.value.message
        assert not any(
            args.get("password", "") in str(caught.value) + caught.value.runtime_message
            for name, args in vms.calls
            if name == "share"
        )
        vms.echo_password = False
        # Shares are made at every start: a Hyper-V Administrator in a normal prompt is told to elevate.
        await driver.run_image(request)
        await driver.stop("ro")
        backend._probe = None
        vms.elevated = False
        with pytest.raises(PermissionDeniedError, match="needs an elevated process"):
            await driver.start("ro")
        assert vms.vms[next(iter(vms.vms))].state == "Off"
    finally:
        vms.elevated = True
        await driver.close()
        await driver.remove_everything()
        for vm in list(vms.vms.values()):
            vms._power_off(vm)
