"""The qemu driver's parts without booting: cpio writer, module resolution, initramfs, guest configuration,
QEMU command line, accelerator choice, QMP client, root disk creation."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import stat
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest

from vz_core.errors import InvalidArgumentError, UnavailableError
from vz_drivers._guest import (
    INIT_SCRIPT,
    CpioEntry,
    GuestConfig,
    GuestMount,
    Kernel,
    build_initramfs,
    bzimage_release,
    create_root_disk,
    default_disk_size,
    env_list,
    extract_vmlinux,
    find_busybox,
    find_kernel,
    has_pvh_entry,
    minimum_disk_size,
    render,
    resolve_modules,
    strip_module_signature,
    tree_usage,
    write_cpio,
)
from vz_drivers.qemu._accel import Accelerator, choose_accelerator, guest_is_pvm, kvm_modules, probe_kvm
from vz_drivers.qemu._driver import diagnose_boot
from vz_drivers.qemu._qemu import QEMU_LOG, Share, VmSpec, build_command
from vz_drivers.qemu._qmp import QmpClient, QmpError
from vz_drivers.qemu._validate import guest_path

# ---------------------------------------------------------------------------------------------------- cpio


def _read_cpio(data: bytes) -> list[tuple[str, int, bytes, int, int]]:
    """A minimal newc reader: (name, mode, data, rdevmajor, rdevminor) per member, trailer excluded."""
    out: list[tuple[str, int, bytes, int, int]] = []
    pos = 0
    while True:
        assert data[pos : pos + 6] == b"070701"
        fields = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        namesize, filesize = fields[11], fields[6]
        name_start = pos + 110
        name = data[name_start : name_start + namesize - 1].decode()
        pos = (name_start + namesize + 3) // 4 * 4
        body = data[pos : pos + filesize]
        pos = (pos + filesize + 3) // 4 * 4
        if name == "TRAILER!!!":
            return out
        out.append((name, fields[1], body, fields[9], fields[10]))


def test_cpio_is_deterministic_and_readable_by_cpio() -> None:
    entries = [
        CpioEntry.directory("bin"),
        CpioEntry.file("bin/tool", b"\x7fELF...", 0o755),
        CpioEntry.symlink("bin/sh", "tool"),
        CpioEntry.char_device("console", 5, 1),
        CpioEntry.file("empty", b""),
    ]
    one, two = io.BytesIO(), io.BytesIO()
    write_cpio(one, entries)
    write_cpio(two, entries)
    assert one.getvalue() == two.getvalue()
    assert len(one.getvalue()) % 4 == 0
    members = _read_cpio(one.getvalue())
    assert [m[0] for m in members] == ["bin", "bin/tool", "bin/sh", "console", "empty"]
    assert members[1][2] == b"\x7fELF..." and stat.S_IMODE(members[1][1]) == 0o755
    assert stat.S_ISLNK(members[2][1]) and members[2][2] == b"tool"
    assert stat.S_ISCHR(members[3][1]) and members[3][3:] == (5, 1)
    listed = subprocess.run(["cpio", "-t"], input=one.getvalue(), capture_output=True, check=True)
    assert listed.stdout.decode().split() == ["bin", "bin/tool", "bin/sh", "console", "empty"]


def test_cpio_refuses_absolute_names() -> None:
    with pytest.raises(ValueError, match="relative"):
        write_cpio(io.BytesIO(), [CpioEntry.file("/etc/passwd", b"")])


# ---------------------------------------------------------------------------------------------------- kernel


def _fake_tree(root: Path, lines: list[str], builtin: list[str] = ()) -> Kernel:  # type: ignore[assignment]
    mods = root / "lib" / "modules" / "9.9.9-test"
    mods.mkdir(parents=True)
    (mods / "modules.dep").write_text("\n".join(lines) + "\n")
    (mods / "modules.builtin").write_text("".join(f"{b}\n" for b in builtin))
    for line in lines:
        path = mods / line.split(":")[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"module " + path.name.encode())
    image = root / "boot" / "vmlinuz-9.9.9-test"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"kernel")
    return Kernel(image=image, release="9.9.9-test", modules_dir=mods)


def test_modules_resolve_dependencies_first_and_skip_builtins(tmp_path: Path) -> None:
    kernel = _fake_tree(
        tmp_path,
        [
            "kernel/fs/ext4.ko: kernel/fs/jbd2.ko kernel/lib/crc16.ko",
            "kernel/fs/jbd2.ko:",
            "kernel/lib/crc16.ko:",
            "kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/virtio/virtio_ring.ko",
            "kernel/net/9p/9pnet.ko:",
            "kernel/virtio/virtio_ring.ko:",
        ],
        builtin=["kernel/lib/crc16.ko"],
    )
    order = [m.name for m in resolve_modules(kernel, ("ext4", "9pnet-virtio"))]
    assert order.index("jbd2") < order.index("ext4")
    assert order.index("9pnet") < order.index("9pnet_virtio") and order.index("virtio_ring") < order.index(
        "9pnet_virtio"
    )
    assert "crc16" not in order and len(order) == len(set(order))
    with pytest.raises(UnavailableError, match=r"lacks module 'virtio_blk'.*linux-image-amd64"):
        resolve_modules(kernel, ("virtio_blk",))


def test_module_signatures_are_stripped() -> None:
    body = b"\x7fELF module body"
    signature = b"S" * 40
    info = struct.pack(">BBBBBxxxI", 0, 0, 2, 0, 0, len(signature))
    signed = body + signature + info + b"~Module signature appended~\n"
    assert strip_module_signature(signed) == body
    assert strip_module_signature(body) == body


def test_find_kernel_picks_the_newest_with_a_module_tree(tmp_path: Path) -> None:
    boot, mods = tmp_path / "boot", tmp_path / "modules"
    boot.mkdir()
    for release in ("6.1.0-9-amd64", "6.1.0-10-amd64", "6.5.0-1-amd64"):
        (boot / f"vmlinuz-{release}").write_bytes(b"k")
    for release in ("6.1.0-9-amd64", "6.1.0-10-amd64"):  # 6.5 has no module tree: not usable
        (mods / release).mkdir(parents=True)
        (mods / release / "modules.dep").write_text("")
    kernel = find_kernel(boot_dir=boot, modules_root=mods)
    assert kernel.release == "6.1.0-10-amd64" and kernel.modules_dir == mods / "6.1.0-10-amd64"


def test_the_host_kernel_package_gives_a_pvh_bootable_vmlinux(tmp_path: Path) -> None:
    kernel = find_kernel()
    assert bzimage_release(kernel.image) == kernel.release
    vmlinux = extract_vmlinux(kernel, tmp_path)
    assert vmlinux is not None and vmlinux.read_bytes()[:4] == b"\x7fELF"
    assert has_pvh_entry(vmlinux.read_bytes())
    assert extract_vmlinux(kernel, tmp_path) == vmlinux  # cached
    names = [m.name for m in resolve_modules(kernel)]
    for needed in ("virtio_console", "9p", "ext4"):
        assert needed in names or kernel.modules_dir is None


# ---------------------------------------------------------------------------------------------------- initramfs


def test_initramfs_is_content_addressed_and_carries_init_agent_modules(tmp_path: Path) -> None:
    kernel = _fake_tree(tmp_path / "k", ["kernel/a.ko: kernel/b.ko", "kernel/b.ko:"])
    agent = tmp_path / "vz-agent"
    agent.write_bytes(b"agent binary")
    first = build_initramfs(kernel, agent, tmp_path / "cache", modules=("a",))
    second = build_initramfs(kernel, agent, tmp_path / "cache", modules=("a",))
    assert first == second and first.path.parent.name == first.digest
    members = {m[0]: m for m in _read_cpio(first.path.read_bytes())}
    assert members["init"][2].decode() == INIT_SCRIPT and stat.S_IMODE(members["init"][1]) == 0o755
    assert members["sbin/vz-agent"][2] == b"agent binary"
    assert stat.S_ISCHR(members["dev/console"][1])
    assert members["lib/modules/9.9.9-test/modules.dep"][2] == b"b.ko:\na.ko: b.ko\n"
    assert members["etc/vz/modules"][2] == b"a\n"
    assert members["bin/busybox"][2] == find_busybox().read_bytes()
    agent.write_bytes(b"another agent")
    assert build_initramfs(kernel, agent, tmp_path / "cache", modules=("a",)).digest != first.digest


def test_a_dynamic_busybox_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "busybox"
    shutil.copy("/bin/ls", fake)  # dynamically linked
    with pytest.raises(UnavailableError, match="busybox-static"):
        find_busybox(str(fake))


def test_the_init_script_is_valid_shell() -> None:
    subprocess.run([str(find_busybox()), "sh", "-n"], input=INIT_SCRIPT.encode(), check=True)


# ---------------------------------------------------------------------------------------------------- guest config


def test_the_guest_configuration_survives_any_value(tmp_path: Path) -> None:
    """Run the generated script with stub functions and check every argument arrives byte for byte."""
    tricky = 'it\'s "quoted" $HOME `id` \\ ;\nnew line\ttab ünï'
    config = GuestConfig(
        hostname="vz-abc",
        mounts=(
            GuestMount("/work space/it's", "vzm0", read_only=True),
            GuestMount("/tmp/x", options=("size=1m", "mode=1777")),
        ),
        env={"A": tricky, "PATH": "/bin"},
        argv=("sh", "-c", tricky),
        user="dev",
        workdir="/home/dev",
        sessions=3,
    )
    stubs = "".join(
        f'{name}() {{ printf "%s\\000" {name} "$@" >> "$OUT"; printf "\\001" >> "$OUT"; }}\n'
        for name in (
            "vz_root",
            "vz_hostname",
            "vz_share",
            "vz_tmpfs",
            "vz_network",
            "vz_file",
            "vz_session_agent",
            "vz_agent",
        )
    )
    script = tmp_path / "config.sh"
    script.write_text(stubs + render(config))
    out = tmp_path / "out"
    subprocess.run([str(find_busybox()), "sh", str(script)], env={"OUT": str(out)}, check=True)
    calls = [c.split(b"\0")[:-1] for c in out.read_bytes().split(b"\1")[:-1]]
    names = [c[0].decode() for c in calls]
    assert names == [
        "vz_root",
        "vz_hostname",
        "vz_share",
        "vz_tmpfs",
        "vz_network",
        "vz_file",
        "vz_session_agent",
        "vz_session_agent",
        "vz_agent",
    ]
    assert calls[2][1:] == [b"vzm0", b"/work space/it's", b"ro"]
    assert calls[3][1:] == [b"/tmp/x", b"rw,size=1m,mode=1777"]
    agent = [a.decode() for a in calls[-1][1:]]
    assert agent[0] == "vz.agent.0"
    assert f"A={tricky}" in agent and "--poweroff" in agent and "--init" in agent
    assert agent[agent.index("--main-user") + 1] == "dev"
    assert agent[agent.index("--") + 1 :] == ["sh", "-c", tricky]


def test_env_list_layers_and_default_path() -> None:
    assert env_list(["A=1", "B=x=y", "broken"], {"A": "2"}) == {
        "A": "2",
        "B": "x=y",
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }


def test_mount_targets_resolve_image_symlinks_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "real" / "dir").mkdir(parents=True)
    (root / "var").mkdir()
    os.symlink("/real", root / "var" / "run")
    os.symlink("../real/dir", root / "rel")
    os.symlink("/../../../../etc", root / "escape")
    assert guest_path(root, "/var/run/x") == "/real/x"
    assert guest_path(root, "/rel/y") == "/real/dir/y"
    assert guest_path(root, "/escape/z") == "/etc/z"  # clamped at the image root
    assert guest_path(root, "/plain/path") == "/plain/path"
    os.symlink("/loop", root / "loop")
    with pytest.raises(InvalidArgumentError, match="loop"):
        guest_path(root, "/loop/x")


# ---------------------------------------------------------------------------------------------------- command line


def test_the_command_line_isolates_denied_egress_and_marks_read_only_shares(tmp_path: Path) -> None:
    spec = VmSpec(
        name="vz-abc",
        accelerator="tcg",
        cpus=2,
        memory_mib=512,
        kernel=tmp_path / "vmlinux",
        initrd=tmp_path / "initrd",
        disk=tmp_path / "disk, with comma.img",
        config_dir=tmp_path / "cfg",
        shares=(Share("vzm0", "/src", read_only=True), Share("vzm1", "/vol")),
        egress="deny",
        sessions=2,
    )
    argv = build_command("qemu-system-x86_64", spec)
    joined = " ".join(argv)
    assert argv[argv.index("-D") + 1] == QEMU_LOG  # QEMU's stderr after -daemonize, kept in run/
    assert "-daemonize" in argv and argv[argv.index("-smp") + 1] == "2" and argv[argv.index("-m") + 1] == "512M"
    assert "user,id=net0,restrict=on" in joined
    assert "path=/src,security_model=" in joined and "mount_tag=vzm0" in joined
    assert joined.count("readonly=on") == 2  # the configuration share and the read-only bind
    assert "disk,, with comma.img" in joined
    assert "name=vz.agent.0" in joined and "name=vz.agent.1" in joined and "vz.agent.2" not in joined
    assert "mitigations=off" in argv[argv.index("-append") + 1]
    # A loaded host must not fail the guest kernel's IO-APIC timer test (it panics): the test is skipped.
    assert "no_timer_check" in argv[argv.index("-append") + 1].split()
    kvm = build_command("qemu-system-x86_64", VmSpec(**{**spec.__dict__, "accelerator": "kvm", "egress": "allow"}))
    assert kvm[kvm.index("-accel") + 1] == "kvm" and kvm[kvm.index("-cpu") + 1] == "host"
    assert "restrict=off" in " ".join(kvm) and "mitigations=off" not in kvm[kvm.index("-append") + 1]


def test_a_failed_boot_names_the_init_failure_a_panic_or_what_qemu_said(tmp_path: Path) -> None:
    path = tmp_path / "console.log"
    init = "[ 1.0] booting\nVZ-INIT-FAILED: cannot mount the root disk\n"
    assert diagnose_boot(init, "", path) == (f"cannot mount the root disk ({path})", init)
    panic = "[ 2.0] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100\n"
    detail, log = diagnose_boot(panic, "qemu-system-x86_64: something else\n", path)
    assert detail.startswith("the guest kernel panicked: not syncing: Attempted to kill init!")
    assert "--- QEMU's log:\nqemu-system-x86_64: something else" in log
    signal = "qemu-system-x86_64: terminating on signal 15 from pid 4242 (python3)\n"
    detail, _ = diagnose_boot("[ 0.5] early boot\n", signal, path)
    assert detail == f"QEMU said: qemu-system-x86_64: terminating on signal 15 from pid 4242 (python3) ({path})"
    agent = "[ 3.0] vz-agent: opening the log --log /x: read-only file system\n"
    assert (
        diagnose_boot(agent, "", path)[0]
        == f"the guest agent said: opening the log --log /x: read-only file system ({path})"
    )
    assert diagnose_boot("", "", path) == (f"see the console log ({path})", "")


# ---------------------------------------------------------------------------------------------------- accelerator


async def test_accelerator_verdicts_name_their_reason(tmp_path: Path) -> None:
    kernel = Kernel(image=tmp_path / "vmlinuz", release="1.0", modules_dir=None)
    kernel.image.write_bytes(b"k")
    tcg = await choose_accelerator("tcg", qemu="qemu", kernel=kernel, cache=tmp_path)
    assert tcg == Accelerator("tcg", "TCG (software emulation) was requested with accelerator=tcg")
    missing = await choose_accelerator(
        "auto", qemu="qemu", kernel=kernel, cache=tmp_path, kvm_device=tmp_path / "no-kvm"
    )
    assert missing.name == "tcg" and "does not exist" in missing.reason
    with pytest.raises(UnavailableError, match=r"accelerator=kvm was requested.*does not exist"):
        await choose_accelerator("kvm", qemu="qemu", kernel=kernel, cache=tmp_path, kvm_device=tmp_path / "no-kvm")


def test_guest_kernel_pvm_support_is_read_from_its_config(tmp_path: Path) -> None:
    kernel = Kernel(image=tmp_path / "vmlinuz-1.0", release="1.0", modules_dir=None)
    assert guest_is_pvm(kernel) is None
    (tmp_path / "config-1.0").write_text("CONFIG_X=y\n")
    assert guest_is_pvm(kernel) is False
    (tmp_path / "config-1.0").write_text("CONFIG_X=y\nCONFIG_PVM_GUEST=y\n")
    assert guest_is_pvm(kernel) is True


@pytest.mark.slow
async def test_the_kvm_probe_is_bounded_and_agrees_with_this_host() -> None:
    """On a PVM-only host a stock kernel never prints its banner under KVM; elsewhere it does, quickly."""
    from vz_drivers.qemu._qemu import find_qemu

    kernel = find_kernel()
    loop = asyncio.get_running_loop()
    started = loop.time()
    ran = await probe_kvm(find_qemu().path, kernel.image, timeout=4.0)
    assert loop.time() - started < 10.0
    modules = kvm_modules()
    if not await asyncio.to_thread(os.path.exists, "/dev/kvm"):
        assert ran is False
    elif modules == {"kvm_pvm"} and guest_is_pvm(kernel) is False:
        assert ran is False, "a stock kernel booted under PVM KVM: the heuristic is wrong for this host"


# ---------------------------------------------------------------------------------------------------- QMP


async def test_qmp_client_negotiates_skips_events_and_reports_errors(tmp_path: Path) -> None:
    seen: list[dict[str, object]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(json.dumps({"QMP": {"version": {}, "capabilities": []}}).encode() + b"\r\n")
        while line := await reader.readline():
            msg = json.loads(line)
            seen.append(msg)
            if msg["execute"] == "query-status":
                writer.write(b'{"event": "RESUME", "timestamp": {}}\r\n')
                writer.write(json.dumps({"return": {"status": "running"}, "id": msg["id"]}).encode() + b"\r\n")
            elif msg["execute"] == "bogus":
                err = {"error": {"class": "CommandNotFound", "desc": "no bogus"}, "id": msg["id"]}
                writer.write(json.dumps(err).encode() + b"\r\n")
            else:
                writer.write(json.dumps({"return": {}, "id": msg["id"]}).encode() + b"\r\n")
            await writer.drain()
        writer.close()

    path = tmp_path / "qmp.sock"
    server = await asyncio.start_unix_server(serve, path=str(path))
    try:
        async with await QmpClient.connect(path) as qmp:
            assert await qmp.execute("query-status") == {"status": "running"}
            assert qmp.events and qmp.events[0]["event"] == "RESUME"
            with pytest.raises(QmpError, match="CommandNotFound"):
                await qmp.execute("bogus")
    finally:
        server.close()
        await server.wait_closed()
    assert [m["execute"] for m in seen] == ["qmp_capabilities", "query-status", "bogus"]
    with pytest.raises(UnavailableError, match="cannot reach the QEMU monitor"):
        await QmpClient.connect(tmp_path / "absent.sock", timeout=2)


# ---------------------------------------------------------------------------------------------------- root disk


def _layer_of(tmp_path: Path, tree: Path) -> tuple[str, Path]:
    blob = tmp_path / "layer.tar"
    with tarfile.open(blob, "w") as tf:
        tf.add(tree, arcname=".")
    return "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest(), blob


async def test_root_disks_are_ext4_images_of_the_layers(tmp_path: Path) -> None:
    tree = tmp_path / "rootfs"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "hostname").write_text("image\n")
    os.symlink("etc/hostname", tree / "link")
    usage = tree_usage(tree)
    assert minimum_disk_size(usage) < default_disk_size(usage)
    disk = tmp_path / "disk.img"
    await create_root_disk([_layer_of(tmp_path, tree)], disk, 64 * 1024 * 1024, image="test")
    listing = await asyncio.create_subprocess_exec(
        "debugfs", "-R", "cat /etc/hostname", str(disk), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, _ = await listing.communicate()
    assert out == b"image\n"
    assert disk.stat().st_blocks * 512 < 32 * 1024 * 1024  # sparse


async def test_an_image_that_cannot_become_a_root_disk_is_refused_cleanly(tmp_path: Path) -> None:
    tree = tmp_path / "rootfs"
    tree.mkdir()
    with (tree / "big").open("wb") as f:
        f.write(os.urandom(1024 * 1024) * 40)  # 40 MiB of data into a 16 MiB disk
    disk = tmp_path / "disk.img"
    with pytest.raises(InvalidArgumentError, match="cannot become a root disk"):
        await create_root_disk([_layer_of(tmp_path, tree)], disk, 16 * 1024 * 1024, image="too-big")
    assert not disk.exists()
