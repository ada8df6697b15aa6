"""The Hyper-V guest disk, built here for real: GPT + ESP (unified kernel image, configuration) + ext4 root, its
VHDX, and the same raw disk booted under QEMU with OVMF (TCG) until the guest agent answers an exec.

Under QEMU the agent is reached over virtio-serial (the qemu driver's transport; there is no vhost-vsock here):
the init uses Hyper-V sockets only when ``hv_vmbus`` loads, i.e. on Hyper-V. The image's user runs ``id`` and
a setuid-root program in that boot (the layers: tests/vz_drivers/guest_layers_testlib.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from guest_layers_testlib import EXPECTED_ID, ID_SCRIPT, euid_binary, upper_layer
from hyperv_standin import WINDOWS, StandInHyperV

from vz_core import ExecExit, ExecOutput, ExecSpec, RunImageRequest
from vz_drivers._agent import AgentClient
from vz_drivers._guest import BOOT_CMDLINE, ESP_TYPE, LINUX_TYPE, find_boot_tools, hyperv_init, to_vhdx
from vz_drivers._images._build import build_oci_layout
from vz_drivers._images._default import default_layer, find_busybox
from vz_drivers._images._model import ImageConfig
from vz_drivers._machine import machine_key
from vz_drivers.hyperv._driver import HypervBackend
from vz_drivers.hyperv._records import HypervRecord

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS.fd")
SECRET = "s3cr3t value with 'quotes'"


def _require_tools() -> None:
    missing = [
        t
        for t in ("qemu-system-x86_64", "qemu-img", "mformat", "mcopy", "sgdisk", "objcopy", "mke2fs")
        if shutil.which(t) is None
    ]
    if not OVMF_CODE.is_file():
        missing.append(str(OVMF_CODE))
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: apt-get install ovmf qemu-utils mtools gdisk systemd-boot-efi")
    find_boot_tools()


@dataclass(frozen=True)
class Built:
    record: HypervRecord
    raw: Path
    vhdx: Path
    uki: Path
    work: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, image_dir: Path, hyperv_bundle: str) -> Iterator[Built]:
    """One Machine's boot disk, built through the backend (plan with a stand-in Windows host, then the real
    disk builder), raw and VHDX. The image is vz:default's busybox layer plus a layer with a setuid-root
    program and a file owned by 1000; its user is ``dev``."""
    _require_tools()
    root = tmp_path_factory.mktemp("hyperv-disk")
    layout = root / "layout"
    build_oci_layout(
        layout,
        [default_layer(find_busybox().path), upper_layer(euid_binary("amd64", root / "euid"))],
        config=ImageConfig(cmd=("/bin/sh",), user="dev", working_dir="/"),
        tag="v1",
    )
    backend = HypervBackend(
        state_dir=root / "state", image_dir=image_dir, guest=hyperv_bundle, runner=StandInHyperV(), host=WINDOWS
    )
    request = RunImageRequest(
        workspace_id="ovmf boot/ü",
        image=f"oci:{layout}:v1",
        environment={"VZ_TEST_SECRET": SECRET},
        entrypoint="sh",
        args=("-c", "echo main says hello; exec sleep 1000000"),
    )

    async def build() -> Built:
        plan = await backend.plan(request, machine_key(request.workspace_id))
        work = root / "work"
        work.mkdir(mode=0o700)
        raw = await backend.build_raw_disk(plan.record, plan.staged["layers"], work)
        tools, boot = await backend.boot_image()
        vhdx = work / "disk.vhdx"
        await to_vhdx(tools, raw, vhdx)
        return Built(plan.record, raw, vhdx, boot.path, work)

    yield asyncio.run(build())
    shutil.rmtree(root, ignore_errors=True)


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout


def test_the_disk_is_gpt_with_the_esp_and_the_root(built: Built) -> None:
    assert "No problems found" in _run("sgdisk", "-v", str(built.raw))
    info = _run("sgdisk", "-p", str(built.raw))
    assert "EF00  vz-esp" in info and "8300  vz-root" in info
    for number, type_guid in ((1, ESP_TYPE), (2, LINUX_TYPE)):
        part = _run("sgdisk", "-i", str(number), str(built.raw))
        assert str(type_guid).upper() in part
    # The ESP is partition 1 at 1 MiB: its FAT holds the UKI and the Machine's configuration.
    esp = f"{built.raw}@@1M"
    listing = _run("mdir", "-i", esp, "-/", "-b", "::/")
    for name in ("::/EFI/BOOT/BOOTX64.EFI", "::/config.sh", "::/hosts", "::/resolv.conf"):
        assert name in listing.splitlines(), listing
    config = _run("mtype", "-i", esp, "::/config.sh")
    assert f"vz_vsock_port {built.record.vsock_port}\n" in config
    assert "vz_root /dev/vda ext4" in config  # the device is ignored: the init finds the partition by name
    assert "SECRET" in config and built.record.workspace_id not in config


def test_the_boot_file_is_the_bundles_unified_kernel_image(built: Built, hyperv_bundle: str) -> None:
    assert built.uki.read_bytes() == (Path(hyperv_bundle) / "BOOTX64.EFI").read_bytes()
    esp = f"{built.raw}@@1M"
    on_disk = built.work / "BOOTX64.from-esp"
    subprocess.run(["mcopy", "-i", esp, "::/EFI/BOOT/BOOTX64.EFI", str(on_disk)], check=True)
    assert on_disk.read_bytes() == built.uki.read_bytes()
    sections = _run("objdump", "-h", str(built.uki))
    for name in (".osrel", ".cmdline", ".initrd", ".linux"):
        assert f" {name} " in sections, sections
    extracted = built.work / "cmdline"
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.cmdline", str(built.uki), str(extracted)], check=True)
    assert extracted.read_bytes().rstrip(b"\0").decode() == BOOT_CMDLINE


def test_the_vhdx_holds_the_same_disk(built: Built) -> None:
    info = json.loads(_run("qemu-img", "info", "--output=json", str(built.vhdx)))
    assert info["format"] == "vhdx" and info["virtual-size"] >= built.raw.stat().st_size
    assert "Images are identical" in _run(
        "qemu-img", "compare", "-f", "raw", "-F", "vhdx", str(built.raw), str(built.vhdx)
    )


def test_the_init_is_qemus_with_the_configuration_from_the_esp() -> None:
    from vz_drivers._guest import INIT_HOOK, INIT_SCRIPT

    hook = hyperv_init()
    assert "vz_config_mount() {" in hook and "vz_partition vz-esp" in hook
    assert 'exec /sbin/vz-agent serve --listen "vsock:$VZ_VSOCK_PORT"' in hook
    # The shared init sources the hook after defining its own functions and before mounting the configuration.
    assert INIT_SCRIPT.index(f". /{INIT_HOOK}") > INIT_SCRIPT.index("vz_agent_vsock() {")
    assert INIT_SCRIPT.index(f". /{INIT_HOOK}") < INIT_SCRIPT.index("vz_config_mount ||")
    assert INIT_SCRIPT.index("vz_config_mount ||") < INIT_SCRIPT.index(". /run/vz/cfg/config.sh")


def test_the_hyperv_only_scripts_parse(tmp_path: Path) -> None:
    # The Hyper-V branch of the init, the DHCP event script and /sbin/poweroff never run here: busybox sh -n at
    # least parses them as the guest's shell will (the share mount script also runs, in test_hyperv_shares_guest).
    from vz_drivers._guest import INIT_SCRIPT, find_busybox
    from vz_drivers._guest import _hyperv as _guest
    from vz_drivers.hyperv._shares import _MOUNT_SCRIPT

    busybox = str(find_busybox())
    for name, text in (
        ("init", INIT_SCRIPT + hyperv_init()),
        ("dhcp.sh", _guest._DHCP),
        ("poweroff", _guest._POWEROFF),
        ("mount (shares)", _MOUNT_SCRIPT),
    ):
        path = tmp_path / name
        path.write_text(text)
        done = subprocess.run([busybox, "sh", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"{name}: {done.stderr}"
    broken = tmp_path / "broken"
    broken.write_text(hyperv_init().replace("\tvz_agent() {\n", "\tvz_agent() {\n\t\tif true; then\n", 1))
    assert subprocess.run([busybox, "sh", "-n", str(broken)], capture_output=True, timeout=30).returncode != 0


async def test_the_vhdx_converted_back_to_raw_boots_under_ovmf_and_the_agent_answers(
    built: Built, tmp_path: Path
) -> None:
    # What Hyper-V is given is the VHDX: boot exactly that, converted back to raw, with the bundle's UKI on its ESP.
    back = tmp_path / "from-vhdx.raw"
    _run("qemu-img", "convert", "-f", "vhdx", "-O", "raw", str(built.vhdx), str(back))
    vars_copy = tmp_path / "OVMF_VARS.fd"
    shutil.copyfile(OVMF_VARS, vars_copy)
    console = tmp_path / "console.log"
    sock = tmp_path / "agent.sock"
    argv = [
        "qemu-system-x86_64",
        "-machine",
        "q35",
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-smp",
        "1",
        "-m",
        "512M",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-drive",
        f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
        "-drive",
        f"if=pflash,format=raw,file={vars_copy}",
        "-drive",
        f"file={back},if=none,id=root,format=raw,cache=unsafe",
        "-device",
        "virtio-blk-pci,drive=root",
        "-chardev",
        f"file,id=console,path={console}",
        "-serial",
        "chardev:console",
        "-device",
        "virtio-serial-pci,id=vser",
        "-chardev",
        f"socket,id=agent0,path={sock},server=on,wait=off",
        "-device",
        "virtserialport,bus=vser.0,nr=1,chardev=agent0,name=vz.agent.0",
        "-nic",
        "none",
    ]
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    client: AgentClient | None = None
    try:
        while True:  # QEMU binds the socket, then listens: connect once it does
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
        boot_seconds = time.monotonic() - started
        print(f"\nOVMF (TCG) boot to agent ready: {boot_seconds:.1f} s")
        script = "echo hello from $(hostname); cat /proc/cmdline; grep ' / ' /proc/mounts; env"

        async def no_input() -> AsyncIterator[bytes]:
            return
            yield b""

        async def sh(script: str, user: str = "") -> tuple[str, ExecExit | None]:
            out, exit_event = b"", None
            spec = ExecSpec(workspace_id="w", argv=("sh", "-c", script), user=user)
            async for event in client.exec(spec, no_input()):
                if isinstance(event, ExecOutput):
                    out += event.data
                elif isinstance(event, ExecExit):
                    exit_event = event
            return out.decode(), exit_event

        text, exit_event = await sh(script)
        assert exit_event == ExecExit(0), text
        assert f"hello from vz-{built.record.key[:12]}" in text
        assert BOOT_CMDLINE in text  # the UKI's command line reached the kernel
        # The root is the vz-root partition; hostname and environment came from config.sh on the vz-esp one
        # (mounted outside the command's root, so not in its /proc/mounts).
        assert "/dev/vda2 / ext4 rw" in text
        assert f"VZ_TEST_SECRET={SECRET}" in text
        # The root disk holds the image's layers as they say: the image's user (the driver's default for an exec)
        # runs id as 1000:1000, the setuid-root program gains euid 0, 1000's file keeps its owner.
        assert built.record.user == "dev"
        assert await sh(ID_SCRIPT, user=built.record.user) == (EXPECTED_ID, ExecExit(0))
        await asyncio.wait_for(client.shutdown(grace=2), 60)
        await asyncio.wait_for(proc.wait(), 120)  # the agent powered the VM off (-no-reboot: QEMU ends)
        assert proc.returncode == 0
    finally:
        if client is not None:
            await client.close()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
