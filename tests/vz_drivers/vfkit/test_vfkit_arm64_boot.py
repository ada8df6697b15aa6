"""The arm64 vfkit guest bundle, built here and booted under qemu-system-aarch64 (TCG): what vfkit boots on Apple
silicon, checked on Linux.

The bundle comes from ``vz guest build --arch arm64 --format vfkit`` (``build_bundle``: Debian bookworm's arm64
kernel, an uncompressed ARM64 Image as vfkit's linux bootloader requires, with its modules, a static arm64
busybox, all fetched with ``apt-get download`` and pinned by SHA-256, and the guest agent cross-compiled for
linux/arm64). It is built twice and must be the same bytes. The guest answers the agent protocol over
virtio-serial (this host has no vhost-vsock; vfkit uses virtio-vsock) and brings eth0 up by DHCP, as vfkit's
NAT hands it out: here from a dnsmasq the test runs on a tap inside a network namespace it creates (nothing
else can answer there). A second boot in a namespace without a DHCP server must fail, saying so on the console.
The root disk is written from an image's layers by the drivers' writer (``create_root_disk``): the image's user
``dev`` runs ``id`` as 1000:1000 and a setuid-root program gains euid 0. Everything (namespace, tap, dnsmasq,
QEMU) is removed by the module's fixtures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from guest_layers_testlib import EXPECTED_ID, ID_SCRIPT, base_layer, euid_binary, upper_layer, write_layers

from vz_core import ExecExit, ExecOutput, ExecSpec
from vz_drivers._guest import (
    MANIFEST,
    Bundle,
    GuestConfig,
    build_bundle,
    create_root_disk,
    hosts_file,
    open_bundle,
    render,
    verify_bundle,
)

DEBS = Path(os.environ.get("VZ_GUEST_DEBS", str(Path.home() / ".cache" / "vz" / "guest-debs")))
SUBNET = "10.213.7"
MAC = "52:54:00:7a:01:02"

pytestmark = pytest.mark.slow


def _require() -> None:
    missing = [
        tool
        for tool in ("qemu-system-aarch64", "mke2fs", "dnsmasq", "ip", "apt-get", "dpkg-deb", "go")
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()
    ]
    if missing:
        pytest.fail(f"missing: {', '.join(missing)}; run scripts/install-deps.sh")
    if os.geteuid() != 0:
        pytest.fail("the arm64 boot test creates a network namespace and a tap: run it as root")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Bundle, Bundle]:
    """The arm64 vfkit bundle, built twice (the second time with a fresh agent build directory)."""
    from vz_drivers._agent import ensure_agent_binary

    _require()
    base = tmp_path_factory.mktemp("bundles")
    agent = ensure_agent_binary("arm64")
    first = build_bundle("arm64", "vfkit", base / "one", agent=agent, debs=DEBS)
    again = ensure_agent_binary("arm64", cache_dir=base / "agent")  # built once more from the same sources
    second = build_bundle("arm64", "vfkit", base / "two", agent=again, debs=DEBS)
    return first, second


def test_building_twice_gives_the_same_bytes(bundles: tuple[Bundle, Bundle]) -> None:
    first, second = bundles
    names = sorted(p.name for p in first.root.iterdir())
    assert names == sorted(p.name for p in second.root.iterdir()) == ["Image", "initramfs.cpio", MANIFEST]
    for name in names:
        assert (first.root / name).read_bytes() == (second.root / name).read_bytes(), name
    assert first.digest == second.digest
    packages = {p["name"]: p for p in first.manifest["packages"]}  # type: ignore[attr-defined]
    assert set(packages) == {"linux-image-6.1.0-57-arm64", "busybox-static"}
    assert all(len(p["sha256"]) == 64 for p in packages.values())
    # arm64 boot protocol header: "ARM\x64" at 0x38 (Documentation/arm64/booting.rst); a gzip'd Image would
    # start with 1f 8b and hang vfkit's bootloader.
    head = (first.root / "Image").read_bytes()[:64]
    assert head[0x38:0x3C] == b"ARMd" and head[:2] != b"\x1f\x8b"


def test_a_changed_byte_is_refused_naming_the_file(bundles: tuple[Bundle, Bundle], tmp_path: Path) -> None:
    from vz_core.errors import FailedPreconditionError

    copy = tmp_path / "bundle"
    shutil.copytree(bundles[0].root, copy)
    cached = open_bundle(str(copy), tmp_path / "cache")
    assert cached.root == tmp_path / "cache" / bundles[0].digest
    data = bytearray((copy / "initramfs.cpio").read_bytes())
    data[len(data) // 2] ^= 1
    (copy / "initramfs.cpio").write_bytes(bytes(data))
    with pytest.raises(FailedPreconditionError, match=r"initramfs\.cpio does not match its manifest"):
        verify_bundle(copy)
    # the cached copy is verified before every use: a change there is refused too
    (cached.root / "Image").write_bytes(b"changed")
    with pytest.raises(FailedPreconditionError, match="Image does not match its manifest"):
        open_bundle(str(bundles[0].root), tmp_path / "cache")


# ------------------------------------------------------------------------------------------------ boots


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    """A network namespace of this test with a tap ``vztap0`` (the host side of the guest's virtio-net)."""
    name = f"vzdhcp-{uuid.uuid4().hex[:8]}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "tuntap", "add", "dev", "vztap0", "mode", "tap")
        _ip("-n", name, "addr", "add", f"{SUBNET}.1/24", "dev", "vztap0")
        _ip("-n", name, "link", "set", "vztap0", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


@contextlib.contextmanager
def _dnsmasq(ns: str, work: Path) -> Iterator[Path]:
    """This test's own DHCP server, on the namespace's tap only; killed on exit."""
    leases = work / "leases"
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            shutil.which("dnsmasq") or "/usr/sbin/dnsmasq",
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--port=0",  # DHCP only: no DNS server
            "--interface=vztap0",
            "--bind-interfaces",
            f"--dhcp-range={SUBNET}.50,{SUBNET}.60,255.255.255.0,1h",
            f"--dhcp-option=option:router,{SUBNET}.1",
            f"--dhcp-option=option:dns-server,{SUBNET}.1",
            f"--dhcp-leasefile={leases}",
            "--pid-file=",
            "--user=root",
            f"--log-facility={work / 'dnsmasq.log'}",
            "--log-dhcp",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield leases
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()


@pytest.fixture(scope="module")
def euid_arm64(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The setuid-root test program for linux/arm64 (Go, static)."""
    _require()
    return euid_binary("arm64", tmp_path_factory.mktemp("euid"))


def _machine_files(tmp_path: Path, bundle_root: Path, euid: bytes) -> tuple[Path, Path]:
    """The Machine's root disk, written from an image's layers by the drivers' writer (an arm64 busybox
    userland with the user ``dev``, plus a setuid-root program and a file of 1000's), and its configuration."""
    # the userland is the bundle's own busybox, taken out of its initramfs with the cpio tool
    unpack = tmp_path / "initrd"
    unpack.mkdir()
    with open(bundle_root / "initramfs.cpio", "rb") as fh:
        subprocess.run(["cpio", "-idm", "--quiet", "bin/busybox"], stdin=fh, cwd=unpack, check=True)
    layers = write_layers([base_layer((unpack / "bin" / "busybox").read_bytes()), upper_layer(euid)], tmp_path)
    disk = tmp_path / "disk.img"
    asyncio.run(create_root_disk(layers, disk, 256 * 1024 * 1024, image="arm64-test"))
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    # what the vfkit backend renders (network by DHCP, resolv.conf from the lease), with the agent on
    # virtio-serial instead of vsock
    config = GuestConfig(
        hostname="vz-arm64", network=True, dhcp=True, resolv_conf=True, argv=("/bin/busybox", "sleep", "100000")
    )
    (cfg / "config.sh").write_text(render(config))
    (cfg / "hosts").write_text(hosts_file("vz-arm64"))
    return disk, cfg


def _qemu_argv(bundle: Bundle, disk: Path, cfg: Path, run: Path) -> list[str]:
    return [
        "qemu-system-aarch64",
        "-machine",
        "virt",
        "-cpu",
        "cortex-a57",
        "-accel",
        "tcg,thread=multi",
        "-smp",
        "1",
        "-m",
        "512M",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        str(bundle.file("kernel")),
        "-initrd",
        str(bundle.file("initrd")),
        "-append",
        "console=ttyAMA0 quiet panic=-1",
        "-serial",
        f"file:{run / 'console.log'}",
        "-device",
        "virtio-serial-pci,id=vser",
        "-chardev",
        "socket,id=agent0,path=agent.sock,server=on,wait=off",
        "-device",
        "virtserialport,bus=vser.0,nr=1,chardev=agent0,name=vz.agent.0",
        "-drive",
        f"file={disk},if=none,id=root,format=raw",
        "-device",
        "virtio-blk-pci,drive=root",
        "-fsdev",
        f"local,id=fscfg,path={cfg},security_model=none,readonly=on",
        "-device",
        "virtio-9p-pci,fsdev=fscfg,mount_tag=vzcfg",
        "-netdev",
        "tap,id=net0,ifname=vztap0,script=no,downscript=no",
        "-device",
        f"virtio-net-pci,netdev=net0,mac={MAC}",
    ]


@contextlib.asynccontextmanager
async def _boot(
    ns: str, bundle: Bundle, tmp_path: Path, euid: bytes
) -> AsyncIterator[tuple[asyncio.subprocess.Process, Path]]:
    disk, cfg = await asyncio.to_thread(_machine_files, tmp_path, bundle.root, euid)
    run = tmp_path / "run"
    run.mkdir()
    qemu = await asyncio.create_subprocess_exec(
        "ip",
        "netns",
        "exec",
        ns,
        *_qemu_argv(bundle, disk, cfg, run),
        cwd=run,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        yield qemu, run
    finally:
        if qemu.returncode is None:
            qemu.kill()
            await qemu.wait()


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""


async def _run(client: object, *argv: str, user: str = "") -> tuple[bytes, int]:
    out, code = b"", -1
    spec = ExecSpec(workspace_id="arm64", argv=argv, user=user)
    async for event in client.exec(spec, _nothing()):  # type: ignore[attr-defined]
        if isinstance(event, ExecOutput):
            out += event.data
        elif isinstance(event, ExecExit):
            code = event.exit_code
    return out, code


async def test_the_bundle_boots_answers_the_agent_and_gets_its_network_by_dhcp(
    bundles: tuple[Bundle, Bundle], netns: str, tmp_path: Path, euid_arm64: bytes
) -> None:
    from vz_drivers._agent import AgentClient

    bundle = bundles[0]
    with _dnsmasq(netns, tmp_path) as leases:
        async with _boot(netns, bundle, tmp_path, euid_arm64) as (qemu, run):
            for _ in range(100):  # QEMU creates the socket right after it starts
                if (run / "agent.sock").exists() or qemu.returncode is not None:
                    break
                await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_unix_connection(str(run / "agent.sock"))
            try:
                client = await AgentClient.from_streams(reader, writer, wait_ready=True, timeout=300)
            except BaseException:
                console = (run / "console.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"the arm64 guest did not answer; console:\n{console}") from None
            try:
                assert await _run(client, "/bin/busybox", "uname", "-m") == (b"aarch64\n", 0)
                loaded, _ = await _run(client, "/bin/busybox", "cat", "/proc/modules")
                for name in (b"virtiofs", b"vmw_vsock_virtio_transport", b"virtio_console", b"virtio_net"):
                    assert name in loaded
                addr, code = await _run(client, "/bin/busybox", "ip", "-4", "addr", "show", "dev", "eth0")
                assert code == 0 and f"inet {SUBNET}.5".encode() in addr, addr
                route, _ = await _run(client, "/bin/busybox", "ip", "route")
                assert f"default via {SUBNET}.1 dev eth0".encode() in route, route
                resolv, _ = await _run(client, "/bin/busybox", "cat", "/etc/resolv.conf")
                assert f"nameserver {SUBNET}.1".encode() in resolv, resolv
                # the root disk holds the image's layers as they say: its user runs id, setuid root works
                out, code = await _run(client, "/bin/sh", "-c", ID_SCRIPT, user="dev")
                assert (out.decode(), code) == (EXPECTED_ID, 0)
                # traffic flows: the DHCP server's side of the tap answers
                assert (await _run(client, "/bin/busybox", "ping", "-c", "1", "-W", "5", f"{SUBNET}.1"))[1] == 0
                async with asyncio.timeout(60):
                    await client.shutdown(grace=5)
                    await qemu.wait()  # the agent powered the guest off: QEMU ends by itself
                assert qemu.returncode == 0
            finally:
                with contextlib.suppress(Exception):
                    await client.close()
        assert MAC in leases.read_text()  # the lease came from this test's dnsmasq


async def test_no_dhcp_lease_is_a_failed_boot_that_says_so(
    bundles: tuple[Bundle, Bundle], netns: str, tmp_path: Path, euid_arm64: bytes
) -> None:
    async with _boot(netns, bundles[0], tmp_path, euid_arm64) as (qemu, run):  # no DHCP server in the namespace now
        async with asyncio.timeout(600):
            await qemu.wait()  # the init reports the failure and powers the guest off
        console = (run / "console.log").read_text(errors="replace")
    assert "VZ-INIT-FAILED: no DHCP lease on eth0" in console, console[-2000:]
