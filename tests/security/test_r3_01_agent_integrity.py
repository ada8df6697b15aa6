"""#26 item 1: a Machine's root cannot reach into its own guest agent, and the host notices an agent that is not
the one it started.

The attack that worked: a program in the Machine attached to the agent (PID 1) with ptrace, cleared
close-on-exec on its listening socket and exec'd its own "agent" in place; every later `vz exec` and `vz stop`
talked to the impostor. A plain PTRACE_ATTACH left the agent stopped and the host's reader hung.

Now the seccomp filter of both profiles refuses ptrace and process_vm_*, the agent makes itself non-dumpable
(the kernel then refuses ptrace, /proc/1/mem, process_vm_*, /proc/1/fd, pidfd_getfd and kcmp to any process
without CAP_SYS_PTRACE, which linux_native refuses to grant), and every handshake asks the agent to prove, with
an HMAC over a fresh challenge, that it holds the boot's identity key the host handed it on a descriptor the
Machine never sees. The black-box tests run a real static program inside real Machines through the real `vz`
and daemon; the handshake tests talk to real agent processes, and to a real Machine whose agent does not hold
the key the host expects. A qemu guest (its root owns the guest kernel) gets Yama's ptrace_scope=3 and its
PID-1 agent the boot's key over its virtio-serial port: attach-mode access is refused there too, and an agent
without the expected key is refused and its VM killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_drivers"))
from machine_testlib import request, sh

from vz_core.errors import FailedPreconditionError, UnsupportedError
from vz_drivers._agent import AgentClient, AgentIdentityError, identity_proof
from vz_drivers._machine import machine_key, proc_start_time
from vz_drivers.linux_native import LinuxNativeDriver, cleanup_state

PROBE_SOURCE = Path(__file__).resolve().parent / "agent_probe" / "probe.c"
REFUSED = {"EPERM", "EACCES"}
# Every way into another process the probe tries (pidfd_open only makes a handle: it is not one of them).
INTRUSIONS = (
    "ptrace_attach",
    "ptrace_seize",
    "process_vm_readv",
    "process_vm_writev",
    "proc_mem_write",
    "proc_environ",
    "proc_fd",
    "pidfd_getfd",
    "kcmp",
)
IDENTITY_ERROR = "the Machine's agent failed its identity check"


@pytest.fixture(scope="module")
def agent_binary() -> str:
    from vz_drivers.agent import ensure_agent_binary

    return str(ensure_agent_binary())


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe, built statically with the host's C compiler (it runs in any image, vz:default included)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("building the probe needs gcc with a static C library (Debian: gcc, libc6-dev)")
    out = tmp_path_factory.mktemp("r3-01-probe") / "probe"
    subprocess.run([gcc, "-static", "-O1", "-o", str(out), str(PROBE_SOURCE)], check=True, capture_output=True)
    return out


# ---------------------------------------------------------------------------------------------- through `vz`


def _vz(home: Path, *args: str, cwd: Path, agent: str) -> subprocess.CompletedProcess[bytes]:
    beside = Path(sys.executable).parent / "vz"
    exe = str(beside) if beside.exists() else (shutil.which("vz") or "vz")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_")}
    env["VZ_HOME"] = str(home)
    env["VZ_AGENT_BINARY"] = agent
    # The timeout guards against a hung run only (the old agent, once stopped by a tracer, never answered).
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, timeout=240, check=False)


def _ok(home: Path, *args: str, cwd: Path, agent: str) -> bytes:
    proc = _vz(home, *args, cwd=cwd, agent=agent)
    assert proc.returncode == 0, f"vz {' '.join(args)} → {proc.returncode}: {proc.stderr.decode()}"
    assert b"Traceback" not in proc.stderr
    return proc.stdout


def _project(root: Path, probe: Path, profile: str) -> Path:
    root.mkdir(parents=True)
    shutil.copy2(probe, root / "probe")
    machine: dict[str, object] = {
        "name": "web",
        "profile": profile,
        "driver": "linux_native",
        "image": "vz:default",
        "workspace": {"projection": "read-only", "target": "/workspace"},
    }
    (root / "vz.json").write_text(json.dumps({"version": 1, "project_id": "r3-agent", "machines": [machine]}))
    return root


def _results(output: bytes) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in output.decode().splitlines() if " " in line)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("profile", ["developer", "hardened"])
def test_root_in_a_machine_cannot_reach_into_its_agent(
    tmp_path: Path, probe: Path, agent_binary: str, profile: str
) -> None:
    if os.geteuid() != 0:
        pytest.fail("linux_native needs root (namespaces, cgroups, runc)")
    home = tmp_path / "home"
    wt = _project(tmp_path / "wt", probe, profile)
    try:
        _ok(home, "up", cwd=wt, agent=agent_binary)
        # The probe runs as the Machine's root (uid 0, the Machine's full capability set).
        assert _ok(home, "exec", "--", "id", "-u", cwd=wt, agent=agent_binary) == b"0\n"
        _assert_refused(_ok(home, "exec", "--", "/workspace/probe", cwd=wt, agent=agent_binary))
        # The agent was neither stopped nor traced, and still answers.
        status = _ok(
            home, "exec", "--", "grep", "-E", "^(State|TracerPid):", "/proc/1/status", cwd=wt, agent=agent_binary
        )
        fields = dict(line.split(":", 1) for line in status.decode().splitlines())
        assert fields["TracerPid"].strip() == "0", status
        assert fields["State"].split()[0] in ("S", "R"), status
        assert _ok(home, "exec", "--", "echo", "still here", cwd=wt, agent=agent_binary) == b"still here\n"
        # A graceful stop through the real agent: stopped, with no error recorded.
        _ok(home, "stop", cwd=wt, agent=agent_binary)
        report = json.loads(_ok(home, "status", "--json", cwd=wt, agent=agent_binary))
        machines = [m for env in report["environments"] for m in env["machines"]]
        assert [m["state"] for m in machines] == ["stopped"], report
    finally:
        _vz(home, "delete", cwd=wt, agent=agent_binary)


def test_cap_sys_ptrace_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    from vz_core import RunImageRequest
    from vz_drivers.linux_native._host import host_facts
    from vz_drivers.linux_native._validate import validate_request

    req = RunImageRequest(workspace_id="w", image="vz:default", cap_add=("SYS_PTRACE",))
    with pytest.raises(UnsupportedError, match="CAP_SYS_PTRACE would let the Machine's root"):
        validate_request(req, host_facts(), machine_key("w"))


def test_both_seccomp_profiles_refuse_ptrace_and_process_vm() -> None:
    from vz_drivers.linux_native._seccomp import seccomp_profile
    from vz_drivers.linux_native._spec import DEVELOPER_CAPABILITIES, HARDENED_CAPABILITIES

    for caps in (DEVELOPER_CAPABILITIES, HARDENED_CAPABILITIES):
        assert "CAP_SYS_PTRACE" not in caps
        profile = seccomp_profile(caps)
        allowed = {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for n in rule["names"]}
        assert not allowed & {"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"}


# ---------------------------------------------------------------------------------------------- the handshake


def _start_agent(tmp_path: Path, agent_binary: str, key: bytes | None) -> tuple[Path, subprocess.Popen[bytes]]:
    """A real agent serving a Unix socket; ``key`` (or none) handed over on its stdin, as linux_native does."""
    sock = tmp_path / "agent.sock"
    ready_r, ready_w = socket.socketpair()
    args = [agent_binary, "serve", "--listen", f"unix:{sock}", "--ready-fd", "0"]
    if key is not None:
        args += ["--key-fd", "0"]
        ready_r.sendall(key.hex().encode() + b"\n")
    proc = subprocess.Popen(args, stdin=ready_w.fileno(), stderr=subprocess.PIPE)
    ready_w.close()
    try:
        assert ready_r.recv(16) == b"ready\n", "the agent did not start"
    except BaseException:
        _stop(proc)
        raise
    finally:
        ready_r.close()
    return sock, proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


async def test_an_agent_without_the_key_fails_the_identity_check(tmp_path: Path, agent_binary: str) -> None:
    sock, proc = _start_agent(tmp_path, agent_binary, None)
    try:
        with pytest.raises(AgentIdentityError, match=IDENTITY_ERROR) as caught:
            await AgentClient.connect_unix(sock, identity_key=secrets.token_bytes(32))
        assert "recreate the Machine" in caught.value.message
        assert isinstance(caught.value, FailedPreconditionError) and not caught.value.retryable
        # A host that asks nothing still gets an agent (the other drivers' channels until they hand over keys).
        async with await AgentClient.connect_unix(sock) as client:
            assert await client.ping() >= 0
    finally:
        _stop(proc)


async def test_an_agent_with_another_key_fails_and_the_right_key_passes(tmp_path: Path, agent_binary: str) -> None:
    key = secrets.token_bytes(32)
    sock, proc = _start_agent(tmp_path, agent_binary, key)
    try:
        with pytest.raises(AgentIdentityError, match="its proof does not match"):
            await AgentClient.connect_unix(sock, identity_key=secrets.token_bytes(32))
        async with await AgentClient.connect_unix(sock, identity_key=key) as client:
            assert "identity" in client.info.features
            proof = client.info.raw["proof"]
            # The key never crosses the wire: only the HMAC over this connection's fresh challenge does.
            assert key.hex() not in json.dumps(dict(client.info.raw))
            assert isinstance(proof, str) and len(proof) == 64
        assert identity_proof(key, "a") != identity_proof(key, "b")
    finally:
        _stop(proc)


# ------------------------------------------------------------------------- a Machine whose agent lacks the key


@pytest.fixture
async def driver(tmp_path: Path, agent_binary: str) -> AsyncIterator[LinuxNativeDriver]:
    if os.geteuid() != 0:
        pytest.fail("linux_native needs root")
    options = {"image_dir": str(tmp_path / "images"), "agent_binary": agent_binary, "stop_timeout": 30}
    drv = LinuxNativeDriver(state_dir=tmp_path / "state", **options)
    try:
        yield drv
    finally:
        await drv.close()
        await cleanup_state(str(tmp_path / "state"), **options)


def _assert_refused(output: bytes) -> None:
    got = _results(output)
    for what in INTRUSIONS:
        assert got.get(what) in REFUSED, f"{what}: {got.get(what)!r} (want one of {sorted(REFUSED)}); all: {got}"


@pytest.mark.root
async def test_without_a_seccomp_filter_the_kernel_still_protects_the_agent(
    driver: LinuxNativeDriver, probe: Path
) -> None:
    """``security_opt: seccomp=unconfined`` (developer profile, a deliberate opt-out, not in vz.json): ptrace and
    process_vm_* are then plain system calls, and the kernel's checks alone (the agent is not dumpable, the
    Machine holds no CAP_SYS_PTRACE) refuse them on the agent."""
    await driver.run_image(request("free", security_opt=("seccomp=unconfined",)))
    status = await sh(driver, "free", "grep ^Seccomp: /proc/1/status")
    assert status.stdout.endswith(b"\t0\n"), status
    copied = await sh(
        driver, "free", "cat > /probe && chmod 755 /probe", stdin=await asyncio.to_thread(probe.read_bytes)
    )
    assert copied.exit.success, copied
    result = await sh(driver, "free", "/probe")
    _assert_refused(result.stdout)
    assert (await sh(driver, "free", "grep TracerPid /proc/1/status")).stdout.split() == [b"TracerPid:", b"0"]


@pytest.mark.root
async def test_the_host_stops_a_machine_whose_agent_fails_the_check(driver: LinuxNativeDriver) -> None:
    """A real Machine whose agent does not hold the key the host expects (what any process exec'd in place of the
    agent is): the exec is refused with the clear error, nothing is sent to it, the Machine is stopped by the
    kernel's means, and Find says so (status never says "running" for it)."""
    await driver.run_image(request("m"))
    assert (await sh(driver, "m", "echo ok")).stdout == b"ok\n"
    backend = driver._backend
    record = backend.book.load(machine_key("m"))
    assert record is not None and record.pid
    pid = record.pid
    assert backend.agent_keys is not None
    backend.agent_keys._keeper.put(  # the host now expects a key this agent never received
        record.key, record.machine_id + backend.agent_keys._SUFFIX, {"key": secrets.token_hex(32)}
    )
    await driver._drop_link(record.key)
    with pytest.raises(FailedPreconditionError, match=IDENTITY_ERROR):
        await sh(driver, "m", "echo should not run")
    found = await driver.find("m")
    assert found is not None and found.state.status == "stopped"
    assert IDENTITY_ERROR in found.state.error
    assert proc_start_time(pid) != record.pid_start, "the Machine's init still runs"


@pytest.mark.root
async def test_status_and_stop_of_a_machine_whose_agent_fails_the_check(
    driver: LinuxNativeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    await driver.run_image(request("s"))
    backend = driver._backend
    record = backend.book.load(machine_key("s"))
    assert record is not None and backend.agent_keys is not None
    backend.agent_keys._keeper.put(
        record.key, record.machine_id + backend.agent_keys._SUFFIX, {"key": secrets.token_hex(32)}
    )
    await driver._drop_link(record.key)
    found = await driver.find("s")  # what `vz status` asks
    assert found is not None and found.state.status == "stopped" and IDENTITY_ERROR in found.state.error
    # Stop of a Machine whose check failed during the stop itself: it is killed, not shut down gracefully through
    # the impostor (the stop timeout of 30 s is never waited out: the shutdown request is never sent).
    await driver.run_image(request("t"))
    record = backend.book.load(machine_key("t"))
    assert record is not None
    backend.agent_keys._keeper.put(
        record.key, record.machine_id + backend.agent_keys._SUFFIX, {"key": secrets.token_hex(32)}
    )
    await driver._drop_link(record.key)
    sent: list[object] = []
    original = backend.shutdown

    async def spy(rec: Any, link: Any) -> None:
        sent.append(rec)
        await original(rec, link)

    monkeypatch.setattr(backend, "shutdown", spy)
    await driver.stop("t")
    assert sent == []
    found = await driver.find("t")
    assert found is not None and found.state.status == "stopped" and IDENTITY_ERROR in found.state.error


# ------------------------------------------------------------------------------------------------ qemu guests

QEMU_REFUSED = (
    "ptrace_attach",
    "ptrace_seize",
    "process_vm_readv",
    "process_vm_writev",
    "proc_mem_write",
    "pidfd_getfd",
)
"""What Yama's scope 3 refuses a VM guest's root (read-mode access, /proc/1/fd, /proc/1/environ and kcmp, stays
open to it: it holds CAP_SYS_PTRACE in its own kernel; docs/security.md says so)."""


def _has_guest_kernel() -> bool:
    return any(Path("/boot").glob("vmlinuz-*"))


@pytest.mark.slow
async def test_a_qemu_guests_root_cannot_attach_to_or_reach_into_its_agent(
    tmp_path: Path, agent_binary: str, probe: Path
) -> None:
    if shutil.which("qemu-system-x86_64") is None or not await asyncio.to_thread(_has_guest_kernel):
        pytest.fail("the qemu part needs qemu-system-x86_64 and a guest kernel in /boot")
    from vz_drivers.qemu import QemuDriver
    from vz_drivers.qemu import cleanup_state as qemu_cleanup

    state, images = tmp_path / "qemu-state", tmp_path / "images"
    drv = QemuDriver(state_dir=state, image_dir=images, agent_binary=agent_binary, stop_timeout=5)
    try:
        await drv.run_image(request("vm"))
        scope = await sh(drv, "vm", "cat /proc/sys/kernel/yama/ptrace_scope")
        assert scope.stdout == b"3\n", scope
        data = await asyncio.to_thread(probe.read_bytes)
        assert (await sh(drv, "vm", "cat > /probe && chmod 755 /probe", stdin=data)).exit.success
        got = _results((await sh(drv, "vm", "/probe")).stdout)
        for what in QEMU_REFUSED:
            assert got.get(what) in REFUSED, f"{what}: {got.get(what)!r}; all: {got}"
        assert (await sh(drv, "vm", "grep TracerPid /proc/1/status")).stdout.split() == [b"TracerPid:", b"0"]
        # The PID-1 agent took the boot's key in the first HELLO on its virtio-serial port and proves it on a new
        # connection; when the host expects another key, the VM is killed and reported stopped with the error.
        record = drv._backend.book.load(machine_key("vm"))
        assert record is not None and drv._backend.agent_keys is not None
        await drv._drop_link(record.key)
        assert (await sh(drv, "vm", "echo proven")).stdout == b"proven\n"

        # The session ports 1..N: the Machine's root tries to put its own agent (a real vz-agent, without the key)
        # on them: it stops whatever other process holds a port and serves there. Every port is held by the
        # PID-1 agent, so the port stays busy, and a host process that finds port 0 taken (``second``: another
        # driver object, as another vz process would be) reaches the PID-1 agent on port 1, which proves the key.
        agent = await asyncio.to_thread(Path(agent_binary).read_bytes)
        assert (await sh(drv, "vm", "cat > /impostor && chmod 755 /impostor", stdin=agent)).exit.success
        takeover = (
            "for p in /proc/[0-9]*; do pid=${p#/proc/}; [ $pid = 1 ] && continue; "
            'tr "\\0" "\\n" < $p/cmdline 2>/dev/null | grep -q "^--device$" && kill -9 $pid && echo killed $pid; done; '
            "sleep 1; n=0; for dev in $(tr '\\0' '\\n' < /proc/1/cmdline | grep '^/dev/vport'; "
            "ls /dev/vport* 2>/dev/null); do n=$((n + 1)); "
            "/impostor serve --device $dev --root / > /tmp/impostor-$n.log 2>&1 & echo $! >> /tmp/impostor.pids; "
            "done; sleep 2; cat /tmp/impostor-*.log; "
            'for pid in $(cat /tmp/impostor.pids); do [ -d /proc/$pid ] && echo "an impostor runs: $pid"; done; true'
        )
        taken = (await sh(drv, "vm", takeover)).stdout.decode()
        assert "an impostor runs" not in taken and "device or resource busy" in taken, taken
        second = QemuDriver(state_dir=state, image_dir=images, agent_binary=agent_binary, stop_timeout=5)
        try:
            assert (await sh(second, "vm", "echo on a session port")).stdout == b"on a session port\n"
            (port,) = {link.port for link in second._ls().links.values()}
            assert port == 1  # port 0 is drv's

            # A session port's handshake is challenged too: with another key expected, the host refuses the agent
            # there and kills the VM.
            keys = second._backend.agent_keys
            assert keys is not None
            keys._keeper.put(record.key, record.machine_id + keys._SUFFIX, {"key": secrets.token_hex(32)})
            await second._drop_link(record.key)
            with pytest.raises(FailedPreconditionError, match=IDENTITY_ERROR):
                await sh(second, "vm", "echo should not run")
        finally:
            await second.close()
        found = await drv.find("vm")
        assert found is not None and found.state.status == "stopped" and IDENTITY_ERROR in found.state.error
        assert proc_start_time(record.pid) != record.pid_start, "the VM still runs"
    finally:
        await drv.close()
        await qemu_cleanup(str(state), image_dir=str(images), agent_binary=agent_binary)


@pytest.mark.parametrize(
    "cap",
    ["SYS_MODULE", "CAP_DAC_READ_SEARCH", "sys_rawio", "SYS_BOOT", "SYS_TIME", "BPF", "PERFMON", "SYSLOG", "MAC_ADMIN"],
)
def test_capabilities_that_act_on_the_host_are_refused(cap: str) -> None:
    """A Machine's root is the host's root in the host's kernel: capabilities that act on the host itself (a
    kernel module, open_by_handle_at, raw I/O, the clock, BPF...) would reach past every namespace."""
    from vz_core import RunImageRequest
    from vz_drivers.linux_native._host import host_facts
    from vz_drivers.linux_native._validate import validate_request

    req = RunImageRequest(workspace_id="w", image="vz:default", cap_add=(cap,))
    with pytest.raises(UnsupportedError, match="is the host's root in the host's kernel"):
        validate_request(req, host_facts(), machine_key("w"))
