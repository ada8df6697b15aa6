"""The arm64 vz guest, booted under qemu-system-aarch64 (TCG): what vfkit boots on Apple silicon, checked here.

Pieces (fetch_arm64_guest.sh, pinned by SHA-256, Debian archive only): Debian bookworm's arm64 kernel (an
uncompressed ARM64 Image, which is what vfkit's linux bootloader requires) with its modules, a static arm64
busybox, and the vz guest agent cross-compiled for linux/arm64. The initramfs is the vz one (the qemu driver's
builder: busybox, the modules, the agent as init); the guest answers the agent protocol over virtio-serial
(vfkit will use virtio-vsock once the agent serves it; see docs/drivers/vfkit.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from vz_core import ExecExit, ExecOutput, ExecSpec

GUEST_DIR = Path(os.environ.get("VZ_ARM64_GUEST_DIR", str(Path.home() / ".cache" / "vz" / "arm64-guest")))
RELEASE = "6.1.0-57-arm64"
FETCH = "sh tests/vz_drivers/vfkit/fetch_arm64_guest.sh"

pytestmark = pytest.mark.slow


def _require() -> Path:
    root = GUEST_DIR / "root"
    missing = [
        what
        for what, ok in (
            ("qemu-system-aarch64", shutil.which("qemu-system-aarch64") is not None),
            ("mke2fs", shutil.which("mke2fs") is not None),
            (f"the arm64 kernel {RELEASE}", (root / "boot" / f"vmlinuz-{RELEASE}").is_file()),
            ("its modules.dep", (root / "lib" / "modules" / RELEASE / "modules.dep").is_file()),
            ("arm64 busybox", (root / "bin" / "busybox").is_file()),
        )
        if not ok
    ]
    if missing:
        pytest.fail(f"missing: {', '.join(missing)}; run `{FETCH}` (as root; Debian archive only)")
    return root


def test_the_debian_arm64_kernel_is_an_uncompressed_image() -> None:
    image = (_require() / "boot" / f"vmlinuz-{RELEASE}").read_bytes()[:64]
    # arm64 boot protocol header: "ARM\x64" at 0x38 (Documentation/arm64/booting.rst). A gzip'd Image would start
    # with 1f 8b and hang vfkit's bootloader.
    assert image[0x38:0x3C] == b"ARMd"
    assert image[:2] != b"\x1f\x8b"


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""


def _machine_files(tmp_path: Path, root: Path) -> tuple[Path, Path]:
    """The Machine's root disk and configuration share."""
    from vz_drivers._guest import GuestConfig, hosts_file, render

    # The Machine's root: an arm64 busybox userland on an ext4 raw disk, like a vfkit Machine's virtio-blk disk.
    rootfs = tmp_path / "rootfs"
    for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "run"):
        (rootfs / d).mkdir(parents=True)
    shutil.copy2(root / "bin" / "busybox", rootfs / "bin" / "busybox")
    (rootfs / "bin" / "sh").symlink_to("busybox")
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\n")
    (rootfs / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    disk = tmp_path / "disk.img"
    with open(disk, "wb") as fh:
        fh.truncate(256 * 1024 * 1024)
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-E", "root_owner=0:0", "-d", str(rootfs), str(disk)], check=True
    )
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    config = GuestConfig(hostname="vz-arm64", network=False, argv=("/bin/busybox", "sleep", "100000"))
    (cfg / "config.sh").write_text(render(config))
    (cfg / "hosts").write_text(hosts_file("vz-arm64"))

    return disk, cfg


async def test_the_arm64_guest_boots_and_answers_the_agent(tmp_path: Path) -> None:
    from vz_drivers._agent import AgentClient, ensure_agent_binary
    from vz_drivers._guest import Kernel, build_initramfs
    from vz_drivers.vfkit._guest import GUEST_MODULES

    root = _require()
    agent = await asyncio.to_thread(ensure_agent_binary, "arm64")
    kernel = Kernel(
        image=root / "boot" / f"vmlinuz-{RELEASE}", release=RELEASE, modules_dir=root / "lib/modules" / RELEASE
    )
    # vfkit's module set (virtio-fs, virtio-vsock, hvc0, ...) plus 9p, which carries the configuration under QEMU
    # here: every module must resolve in the pinned kernel and load in the guest, or the init stops.
    modules = (*GUEST_MODULES, "9pnet_virtio", "9p")
    initramfs = await asyncio.to_thread(
        build_initramfs, kernel, agent, tmp_path / "initramfs", busybox=root / "bin" / "busybox", modules=modules
    )

    disk, cfg = await asyncio.to_thread(_machine_files, tmp_path, root)

    run = tmp_path / "run"
    run.mkdir()
    argv = [
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
        str(kernel.image),
        "-initrd",
        str(initramfs.path),
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
    ]
    qemu = await asyncio.create_subprocess_exec(
        *argv,
        cwd=run,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    client = None
    try:
        for _ in range(100):  # QEMU creates the socket right after it starts
            if (run / "agent.sock").exists() or qemu.returncode is not None:
                break
            await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_unix_connection(str(run / "agent.sock"))
        try:
            client = await AgentClient.from_streams(reader, writer, wait_ready=True, timeout=240)
        except BaseException:
            console = (run / "console.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"the arm64 guest did not answer; console:\n{console}") from None
        out = b""
        code = -1
        async for event in client.exec(
            ExecSpec(workspace_id="arm64", argv=("/bin/busybox", "uname", "-m")), _nothing()
        ):
            if isinstance(event, ExecOutput):
                out += event.data
            elif isinstance(event, ExecExit):
                code = event.exit_code
        assert (out, code) == (b"aarch64\n", 0)
        loaded = b""
        async for event in client.exec(
            ExecSpec(workspace_id="arm64", argv=("/bin/busybox", "cat", "/proc/modules")), _nothing()
        ):
            if isinstance(event, ExecOutput):
                loaded += event.data
        for name in (b"virtiofs", b"vmw_vsock_virtio_transport", b"virtio_console"):
            assert name in loaded
        async with asyncio.timeout(60):
            await client.shutdown(grace=5)
            await qemu.wait()  # the agent powered the guest off: QEMU ends by itself
        assert qemu.returncode == 0
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if qemu.returncode is None:
            qemu.kill()
            await qemu.wait()
