"""The guest half of hyperv's shares, for real: the Hyper-V guest disk booted under QEMU + OVMF mounts SMB 3.1.1
shares (cifs, ``seal``) through the agent, exactly as the driver does after a boot on Hyper-V, from a Samba
server that plays the Windows host.

The server is ``smbd`` of Debian's ``samba`` on 127.0.0.1 (a port of its own, encryption required, SMB 3.1.1
only), started and stopped by the test; the guest reaches it as 10.0.2.2 on QEMU's user network. Its shares have
the names and access of the ones the SHARE script makes (``vz-<key>-<n>$``; the read-only one is ``read only``
on the server, as Windows' Read-only share permission is): so a write to the read-only share fails even when the
guest mounts it read-write, and writes to the read-write one land on the host. What Samba cannot show is
Windows' own SMB server and its ACLs; those are the Windows lane's.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hyperv_standin import WINDOWS, StandInHyperV

from vz_core import ExecExit, ExecOutput, ExecSpec, Mount, MountType, RunImageRequest
from vz_core.errors import RuntimeFailureError
from vz_drivers._agent import AgentClient
from vz_drivers._machine import AgentLink, machine_key
from vz_drivers.hyperv import _scripts as ps
from vz_drivers.hyperv._driver import HypervBackend
from vz_drivers.hyperv._records import HypervRecord
from vz_drivers.hyperv._shares import generate_password, machine_shares, mount_spec

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS.fd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Samba:
    port: int
    password: str
    proc: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def samba(root: Path, record: HypervRecord, password: str) -> Iterator[Samba]:
    """smbd on 127.0.0.1 serving the Machine's shares to its account (mapped to the local user running the test)."""
    smbd, pdbedit = shutil.which("smbd") or "/usr/sbin/smbd", shutil.which("pdbedit")
    if not Path(smbd).is_file() or pdbedit is None:
        pytest.fail("smbd/pdbedit missing: apt-get install samba (scripts/install-deps.sh)")
    names = machine_shares(record.key, record.mounts, Path("/state"))
    for d in ("private", "lock", "state", "cache", "pid", "ncalrpc"):
        (root / d).mkdir(parents=True, exist_ok=True)
    port = _free_port()
    conf = root / "smb.conf"
    lines = [
        "[global]",
        "netbios name = DEVBOX",
        "workgroup = DEVBOX",
        "server role = standalone server",
        f"smb ports = {port}",
        "interfaces = 127.0.0.1",
        "bind interfaces only = yes",
        "disable netbios = yes",
        "server min protocol = SMB3_11",
        "server smb encrypt = required",
        f"passdb backend = tdbsam:{root}/private/passdb.tdb",
        *(f"{d} = {root}/{d.split()[0]}" for d in ("private dir", "lock directory", "state directory")),
        f"cache directory = {root}/cache",
        f"pid directory = {root}/pid",
        f"ncalrpc dir = {root}/ncalrpc",
        f"log file = {root}/log.smbd",
        "log level = 1",
        "load printers = no",
        "printcap name = /dev/null",
        "disable spoolss = yes",
        "map to guest = never",
        f"username map = {root}/users.map",
    ]
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    for share in names.shares:
        lines += [f"[{share.name}]", f"path = {share.path}", f"read only = {'yes' if share.read_only else 'no'}"]
        lines += [f"valid users = {user}"]
    conf.write_text("\n".join(lines) + "\n")
    (root / "users.map").write_text(f"{user} = {names.account}\n")
    subprocess.run(
        [pdbedit, "-s", str(conf), "-a", "-u", user, "-t"],
        input=f"{password}\n{password}\n".encode(),
        capture_output=True,
        check=True,
        timeout=60,
    )
    log = root / "smbd.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [smbd, "--foreground", "--no-process-group", "-s", str(conf), "--debug-stdout"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # smbd signals its whole process group when it ends: never the test's
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "smbd did not listen"
            time.sleep(0.1)
        yield Samba(port, password, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _none() -> AsyncIterator[bytes]:
    return
    yield b""


async def _run(client: AgentClient, script: str, *, root: str | None = None) -> tuple[int, str]:
    out, code = b"", -1
    spec = ExecSpec(
        workspace_id="w", argv=("sh", "-c", script) if root is None else ("/bin/busybox", "sh", "-c", script)
    )
    async with contextlib.aclosing(client.exec(spec, _none(), root_override=root)) as events:
        async for event in events:
            if isinstance(event, ExecOutput):
                out += event.data
            elif isinstance(event, ExecExit):
                code = event.exit_code
    return code, out.decode(errors="replace")


async def test_the_guest_mounts_smb_shares_and_read_only_is_the_servers(
    tmp_path: Path, image_dir: Path, hyperv_bundle: str
) -> None:
    for tool in ("qemu-system-x86_64", "mformat", "mcopy", "objcopy", "mke2fs"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} missing: apt-get install ovmf qemu-utils mtools systemd-boot-efi e2fsprogs")
    work, ref = tmp_path / "work", tmp_path / "ref"
    work.mkdir()
    ref.mkdir()
    (ref / "readme.txt").write_text("from the host\n")
    backend = HypervBackend(
        state_dir=tmp_path / "state",
        image_dir=image_dir,
        guest=hyperv_bundle,
        runner=StandInHyperV(),
        host=WINDOWS,
    )
    request = RunImageRequest(
        workspace_id="smb guest",
        image="vz:default",
        workspace_mount=Mount(type=MountType.BIND, source=str(work), target="/workspaces/p"),
        mounts=(Mount(type=MountType.BIND, source=str(ref), target="/ref", read_only=True),),
        entrypoint="sh",
        args=("-c", "exec sleep 1000000"),
    )
    plan = await backend.plan(request, machine_key(request.workspace_id))
    record = plan.record
    assert record.switch  # the Machine has a network adapter: under QEMU the init's user-network setup
    build = tmp_path / "build"
    build.mkdir(mode=0o700)
    raw = await backend.build_raw_disk(record, plan.staged["layers"], build)
    shares = machine_shares(record.key, record.mounts, backend.book.root)
    password = generate_password()
    made = ps.SharesMade(
        account=f"DEVBOX\\{shares.account}",
        user=shares.account,
        domain="DEVBOX",
        host_address="10.0.2.2",
        shares=tuple(ps.SharedDir(s.name, s.path, ()) for s in shares.shares),
        replaced=(),
    )
    vars_copy = tmp_path / "OVMF_VARS.fd"
    shutil.copyfile(OVMF_VARS, vars_copy)
    console, sock = tmp_path / "console.log", tmp_path / "agent.sock"
    with samba(tmp_path / "samba", record, password) as server:
        argv = [
            "qemu-system-x86_64", "-machine", "q35", "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1",
            "-m", "512M", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-drive", f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
            "-drive", f"if=pflash,format=raw,file={vars_copy}",
            "-drive", f"file={raw},if=none,id=root,format=raw,cache=unsafe", "-device", "virtio-blk-pci,drive=root",
            "-chardev", f"file,id=console,path={console}", "-serial", "chardev:console",
            "-device", "virtio-serial-pci,id=vser",
            "-chardev", f"socket,id=agent0,path={sock},server=on,wait=off",
            "-device", "virtserialport,bus=vser.0,nr=1,chardev=agent0,name=vz.agent.0",
            "-nic", "user,model=virtio-net-pci",
        ]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        client: AgentClient | None = None
        try:
            while True:
                assert proc.returncode is None, "QEMU exited at once"
                try:
                    reader, writer = await asyncio.open_unix_connection(str(sock))
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    await asyncio.sleep(0.1)
            try:
                client = await AgentClient.from_streams(reader, writer, wait_ready=True, timeout=400)
            except BaseException:
                print(console.read_text(errors="replace")[-3000:])
                raise
            link = AgentLink(client=client, pid=0, pid_start=0)
            # A wrong password: the mount fails with the server's answer, and the message has no password in it.
            wrong = generate_password()
            with pytest.raises(
                RuntimeFailureError, match=r"could not mount /workspaces/p .*mounting .* failed"
            ) as caught:
                await backend.guest_mount(record, link, made, wrong, address="10.0.2.2", port=server.port)
            assert wrong not in str(caught.value) and password not in str(caught.value)

            # The driver's own mount path: every share at its target, the password on stdin only.
            try:
                await backend.guest_mount(record, link, made, password, address="10.0.2.2", port=server.port)
            except BaseException:
                print(console.read_text(errors="replace")[-3000:], server.log.read_text(errors="replace")[-3000:])
                raise
            code, text = await _run(client, "grep cifs /proc/mounts")
            assert code == 0, text
            assert f"//10.0.2.2/{shares.shares[0].name} /workspaces/p cifs rw," in text
            assert f"//10.0.2.2/{shares.shares[1].name} /ref cifs ro," in text
            assert "vers=3.1.1" in text and "seal" in text and "password" not in text and password not in text

            # Writes to the read-write share land on the host; the read-only one is read-only.
            code, text = await _run(
                client, "echo written in the guest > /workspaces/p/hello.txt && cat /ref/readme.txt"
            )
            assert (code, text) == (0, "from the host\n")
            assert (work / "hello.txt").read_text() == "written in the guest\n"
            code, text = await _run(client, "echo x > /ref/nope.txt")
            assert code != 0 and not (ref / "nope.txt").exists()

            # Read-only is the server's: the same share mounted read-write by the guest still refuses writes.
            forced = replace(shares.shares[1], target="/tmp/forced-rw", read_only=False)
            spec = mount_spec("w", made, forced, uid=0, gid=0, address="10.0.2.2", port=server.port)
            out, code = b"", -1

            async def pw() -> AsyncIterator[bytes]:
                yield (password + "\n").encode()

            async with contextlib.aclosing(client.exec(spec, pw(), root_override="/")) as events:
                async for event in events:
                    if isinstance(event, ExecOutput):
                        out += event.data
                    elif isinstance(event, ExecExit):
                        code = event.exit_code
            assert code == 0, out
            code, text = await _run(client, "grep forced-rw /proc/mounts; echo x > /tmp/forced-rw/nope.txt")
            assert " cifs rw," in text and code != 0, text
            assert not (ref / "nope.txt").exists()

            await asyncio.wait_for(client.shutdown(grace=2), 60)
            await asyncio.wait_for(proc.wait(), 120)
        finally:
            if client is not None:
                await client.close()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
