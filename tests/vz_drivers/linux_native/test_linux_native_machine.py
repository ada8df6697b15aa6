"""What runs inside a linux_native Machine: exec semantics, mounts, resources, identity, logs, egress."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from machine_testlib import process_gone, request, run, sh

from vz_core import ExecExit, ExecOutput, ExecSpec, HostRequirements, Mount, MountType
from vz_core.errors import FailedPreconditionError, NotFoundError, UnsupportedError
from vz_drivers._machine import machine_key
from vz_drivers.linux_native import LinuxNativeDriver

pytestmark = pytest.mark.root


async def test_exec_is_binary_safe_and_keeps_streams_apart(driver: LinuxNativeDriver) -> None:
    await driver.run_image(request("exec"))
    payload = bytes([0, 0xFF, 0x80, 10, 13, 1]) * 1000
    result = await run(driver, "exec", "cat", stdin=payload)
    assert result.stdout == payload and result.stderr == b"" and result.exit.success
    result = await sh(driver, "exec", "cat >&2", stdin=b"to stderr")
    assert result.stdout == b"" and result.stderr == b"to stderr"
    args = ["with space", "'quoted\"", "$HOME;$(echo unwanted)", "", "ünï"]
    result = await run(driver, "exec", "printf", "%s\\000", *args)
    assert result.stdout.split(b"\0")[:-1] == [a.encode() for a in args]
    result = await sh(driver, "exec", "echo oops >&2; exit 7")
    assert result.exit == ExecExit(7, "") and result.stderr == b"oops\n"
    result = await sh(driver, "exec", "kill -KILL $$")
    assert result.exit.signal and not result.exit.success


async def test_exec_user_workdir_and_environment(driver: LinuxNativeDriver) -> None:
    await driver.run_image(request("who", environment={"FROM_RUN": "run-value"}))
    assert (await run(driver, "who", "id", "-un", user="nobody")).stdout == b"nobody\n"
    assert (await run(driver, "who", "id", "-un")).stdout == b"root\n"
    assert (await run(driver, "who", "pwd", workdir="/tmp")).stdout == b"/tmp\n"
    result = await sh(driver, "who", 'echo "$FROM_RUN $FROM_EXEC"', env={"FROM_EXEC": "exec-value"})
    assert result.stdout == b"run-value exec-value\n"
    with pytest.raises(UnsupportedError):
        await _tty(driver)


async def _tty(driver: LinuxNativeDriver) -> None:
    async def nothing() -> AsyncIterator[bytes]:
        return
        yield b""

    async for _ in driver.exec(ExecSpec("who", ("true",), tty=True), nothing()):
        pass


async def test_cancelled_exec_kills_the_whole_tree_and_the_machine_keeps_running(driver: LinuxNativeDriver) -> None:
    await driver.run_image(request("cancel"))
    script = 'sleep 1000 & echo "pid $!"; sh -c "sleep 1000 & echo pid \\$!; wait" & echo ready; wait'

    async def forever() -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""

    seen = bytearray()
    gen = driver.exec(ExecSpec("cancel", ("sh", "-c", script)), forever())
    async for event in gen:
        assert isinstance(event, ExecOutput)
        seen.extend(event.data)
        if b"ready" in seen and seen.count(b"pid ") >= 2:
            break
    await gen.aclose()  # type: ignore[attr-defined]
    pids = [line.split()[1].decode() for line in bytes(seen).splitlines() if line.startswith(b"pid ")]
    deadline = time.monotonic() + 10
    while True:
        alive = await sh(driver, "cancel", 'for p in "$@"; do [ -e /proc/$p ] && echo $p; done; true', *pids)
        if not alive.stdout or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert alive.stdout == b"", f"processes survived the cancellation: {alive.stdout!r}"
    assert (await driver.find("cancel")).state.status == "running"  # type: ignore[union-attr]


async def test_mounts_bind_ro_volume_tmpfs(driver: LinuxNativeDriver, tmp_path: Path) -> None:
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    (rw / "from-host").write_text("host")
    (ro / "file").write_text("read only")
    mounts = (
        Mount(MountType.BIND, str(ro), "/mnt/ro", read_only=True),
        Mount(MountType.VOLUME, "ln-test-volume", "/mnt/vol"),
        Mount(MountType.TMPFS, "", "/mnt/tmp"),
    )
    wid = "mounts"
    await driver.run_image(request(wid, workspace_mount=Mount(MountType.BIND, str(rw), "/workspace"), mounts=mounts))
    assert (await run(driver, wid, "cat", "/workspace/from-host")).stdout == b"host"
    assert (await sh(driver, wid, "echo inside > /workspace/from-machine")).exit.success
    assert (rw / "from-machine").read_text() == "inside\n"
    assert (await run(driver, wid, "cat", "/mnt/ro/file")).stdout == b"read only"
    denied = await sh(driver, wid, "echo x > /mnt/ro/new")
    assert denied.exit.exit_code != 0 and b"Read-only" in denied.stderr
    assert not (ro / "new").exists()
    await sh(driver, wid, "echo v > /mnt/vol/data; echo t > /mnt/tmp/data")
    await driver.stop(wid)
    await driver.start(wid)
    assert (await run(driver, wid, "cat", "/mnt/vol/data")).stdout == b"v\n"
    assert (await run(driver, wid, "ls", "-A", "/mnt/tmp")).stdout == b""
    found = await driver.find(wid)
    assert found is not None
    assert {(m.type, m.destination) for m in found.mounts} == {
        ("bind", "/workspace"),
        ("bind", "/mnt/ro"),
        ("volume", "/mnt/vol"),
        ("tmpfs", "/mnt/tmp"),
    }
    await driver.run_image(
        request(wid, workspace_mount=Mount(MountType.BIND, str(rw), "/workspace"), mounts=mounts, allow_recreate=True)
    )
    assert (await run(driver, wid, "cat", "/mnt/vol/data")).stdout == b"v\n"
    assert (rw / "from-machine").exists()


async def test_resources_are_what_the_machine_sees(driver: LinuxNativeDriver) -> None:
    await driver.run_image(request("res", host_requirements=HostRequirements(cpus=1, memory_bytes=256 << 20)))
    assert (await run(driver, "res", "nproc")).stdout == b"1\n"
    assert (await run(driver, "res", "cat", "/sys/devices/system/cpu/online")).stdout == b"0\n"
    meminfo = (await run(driver, "res", "cat", "/proc/meminfo")).stdout.decode()
    total_kib = int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemTotal:")))
    assert abs(total_kib - (256 << 10)) <= 128 << 10
    # The limit is real: allocating beyond it kills the allocating process, not the Machine.
    hog = await sh(driver, "res", "head -c 400m /dev/zero | tail > /dev/null")
    assert not hog.exit.success
    assert (await driver.find("res")).state.status == "running"  # type: ignore[union-attr]


async def test_identity_owns_the_workspace_and_reuse_preflight_checks_it(
    driver: LinuxNativeDriver, tmp_path: Path
) -> None:
    before = await driver.find("ident")
    assert before is None
    with pytest.raises(NotFoundError):
        await driver.reuse_preflight("ident", "dev")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "existing").write_text("x")
    await driver.run_image(
        request("ident", user="nobody", remote_user="dev", workspace_mount=Mount(MountType.BIND, str(ws), "/workspace"))
    )
    assert (await run(driver, "ident", "stat", "-c", "%U", "/workspace", "/workspace/existing")).stdout == b"dev\ndev\n"
    assert (await run(driver, "ident", "id", "-un")).stdout == b"nobody\n"
    found = await driver.find("ident")
    await driver.reuse_preflight("ident", "dev")
    with pytest.raises(FailedPreconditionError, match="--recreate"):
        await driver.reuse_preflight("ident", "nobody")
    with pytest.raises(FailedPreconditionError, match="--recreate"):
        await driver.reuse_preflight("ident", "root")
    assert await driver.find("ident") == found
    await driver.run_image(request("ident-root", workspace_mount=Mount(MountType.BIND, str(ws), "/workspace")))
    await driver.reuse_preflight("ident-root", "root")


async def test_logs_are_finite_merged_and_exact(driver: LinuxNativeDriver) -> None:
    await driver.run_image(
        request(
            "logs",
            entrypoint="sh",
            args=("-c", 'printf %s "$1"; printf %s "$2" >&2; exec sleep 100000', "sh", "out-bytes", "err-bytes"),
        )
    )
    deadline = time.monotonic() + 10
    data = b""
    while len(data) < 18 and time.monotonic() < deadline:
        data = b"".join([chunk async for chunk in driver.logs("logs")])
        await asyncio.sleep(0.02)
    assert sorted([data[:9], data[9:]]) == [b"err-bytes", b"out-bytes"]
    await driver.stop("logs")
    # A stopped Machine's completed log comes from the host, and reading it does not start the Machine.
    stopped = b"".join([chunk async for chunk in driver.logs("logs")])
    assert stopped == data
    found = await driver.find("logs")
    assert found is not None and found.state.status == "stopped"


async def test_logs_of_a_stopped_machine_never_follow_a_planted_link(driver: LinuxNativeDriver, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"host-only bytes")
    await driver.run_image(request("planted", entrypoint="sh", args=("-c", "echo mine; exec sleep 100000")))
    await driver.stop("planted")
    # The log lives in /.vz/run, which the Machine can write: it could leave a link there.
    log = driver._store.paths(machine_key("planted")).log
    log.unlink()
    log.symlink_to(secret)
    assert b"".join([chunk async for chunk in driver.logs("planted")]) == b""


def _listen(netns: str) -> subprocess.Popen[bytes]:
    """A one-shot TCP listener on port 8080 in ``netns`` that prints what it received."""
    script = (
        "import socket,sys\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 8080));"
        " s.listen(); print('listening', flush=True)\n"
        "c,_=s.accept(); print(c.recv(100).decode().strip(), flush=True)\n"
    )
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns, "python3", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"listening\n"
    return proc


def _exists(path: Path) -> bool:
    return path.is_symlink() or path.exists()


def _slots_held(subnet: str) -> list[str]:
    """The host's vz links holding an address of ``subnet`` (Machines of any driver with egress allowed)."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    net = ipaddress.IPv4Network(subnet)
    held = []
    for line in out.splitlines():
        fields = line.split()
        if fields[1].startswith("vz") and ipaddress.IPv4Interface(fields[3]).ip in net:
            held.append(fields[1])
    return held


def _nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout


def _rx_counter(netns: str) -> int:
    out = subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "list", "table", "inet", "vztest"], capture_output=True, text=True
    ).stdout
    return int(out.split("packets ")[1].split()[0])


async def test_egress_allow_reaches_a_test_destination_and_deny_refuses(
    driver: LinuxNativeDriver, netns_destination: tuple[str, str]
) -> None:
    address, netns = netns_destination
    connect = 'echo hello-from-machine | nc -w 3 "$1" 8080'
    listener = _listen(netns)
    try:
        await driver.run_image(request("egress-allow"))
        result = await sh(driver, "egress-allow", connect, address)
        assert result.exit.success, result.stderr
        assert listener.communicate(timeout=10)[0] == b"hello-from-machine\n"
    finally:
        with contextlib.suppress(ProcessLookupError):
            listener.kill()
        listener.wait()
    # The host's masquerade table and the Machine's veth live exactly as long as a Machine holds a slot.
    record = driver._store.load(machine_key("egress-allow"))
    assert record is not None
    host_if = Path(f"/sys/class/net/vz{record.key[:12]}")
    assert _exists(host_if) and "vz_10_231_0_0_16" in _nft_tables()
    await driver.delete("egress-allow")
    # The subnet's table is shared by every Machine of any driver holding a slot of it on this host (another
    # test's qemu or linux_native Machine may run meanwhile): it goes with the last of them, not before.
    assert not _exists(host_if)
    assert ("vz_10_231_0_0_16" in _nft_tables()) == bool(_slots_held("10.231.0.0/16"))
    seen = _rx_counter(netns)
    await driver.run_image(request("egress-deny", labels=("vz.egress=deny",)))
    for restart in (False, True):
        if restart:
            await driver.stop("egress-deny")
            await driver.start("egress-deny")
        started = time.monotonic()
        refused = await sh(driver, "egress-deny", connect, address)
        assert not refused.exit.success and time.monotonic() - started < 3
        assert b"refused" in refused.stderr.lower() or b"reset" in refused.stderr.lower(), refused.stderr
        assert (await run(driver, "egress-deny", "true")).exit.success
        assert _rx_counter(netns) == seen, "a denied Machine sent packets to the destination"


@pytest.mark.slow
async def test_stop_ends_every_process_of_the_machine(driver: LinuxNativeDriver) -> None:
    await driver.run_image(request("stop-all", entrypoint="sh", args=("-c", "trap '' TERM; sleep 100000 & wait")))
    record = driver._store.load(machine_key("stop-all"))
    assert record is not None
    pid = record.pid
    started = time.monotonic()
    await driver.stop("stop-all")
    assert time.monotonic() - started < 5 + 3, "stop waits at most stop_timeout before killing"
    assert process_gone(pid)
