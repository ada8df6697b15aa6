"""Provisioning: the launchd daemon (plistlib), the boot script, each start's boot.sh and the base script."""

from __future__ import annotations

import os
import plistlib
import subprocess
from pathlib import Path

from vz_drivers.macos_vm._provision import (
    BOOT_SCRIPT,
    BOOT_SCRIPT_PATH,
    CONFIG_MOUNT,
    LABEL,
    PLIST_PATH,
    BootConfig,
    RamDisk,
    SharedMount,
    boot_config,
    launchd_plist,
    provision_script,
)


def test_the_launchd_daemon_runs_the_boot_script_as_root_at_boot() -> None:
    plist = plistlib.loads(launchd_plist())
    assert plist["Label"] == LABEL == "dev.vz.agent"
    assert plist["ProgramArguments"] == ["/bin/sh", BOOT_SCRIPT_PATH]
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["UserName"] == "root"
    assert PLIST_PATH == "/Library/LaunchDaemons/dev.vz.agent.plist"
    assert launchd_plist().startswith(b'<?xml version="1.0" encoding="UTF-8"?>')


def test_the_boot_script_is_valid_shell_that_mounts_the_config_share() -> None:
    subprocess.run(["sh", "-n"], input=BOOT_SCRIPT.encode(), check=True)
    assert 'mount_virtiofs vzcfg "$cfg"' in BOOT_SCRIPT
    assert f"cfg={CONFIG_MOUNT}" in BOOT_SCRIPT
    assert BOOT_SCRIPT.rstrip().endswith('. "$cfg/boot.sh"')


def _config(**changes: object) -> BootConfig:
    fields: dict[str, object] = dict(
        shares=(SharedMount("vz0", "/workspace"), SharedMount("vz1", "/Users/dev/data dir")),
        ram_disks=(RamDisk("/private/tmp/scratch", 64 << 20),),
        env=("TOKEN=s3cr3t value", "EMPTY=", "QUOTE=it's"),
        main_argv=("sh", "-c", "echo $HOME; sleep 1"),
        main_user="dev",
        main_workdir="/workspace",
        stop_timeout=12.5,
    )
    fields.update(changes)
    return BootConfig(**fields)  # type: ignore[arg-type]


def test_boot_sh_passes_every_word_intact(tmp_path: Path) -> None:
    """Source boot.sh with stand-ins for the mount helpers and the agent: the words arrive unchanged."""
    record = tmp_path / "calls"
    agent = tmp_path / "vz-agent"
    agent.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done > {record}.agent\n')
    agent.chmod(0o755)
    (tmp_path / "boot.sh").write_text(boot_config(_config()))
    runner = (
        f"cfg={tmp_path}\n"
        f'vz_share() {{ printf "share %s %s\\n" "$1" "$2" >> {record}; }}\n'
        f'vz_ram() {{ printf "ram %s %s\\n" "$1" "$2" >> {record}; }}\n'
        '. "$cfg/boot.sh"\n'
    )
    subprocess.run(["sh", "-c", runner], check=True, env={"PATH": os.environ["PATH"]})
    assert record.read_text().splitlines() == [
        "share vz0 /workspace",
        "share vz1 /Users/dev/data dir",
        f"ram /private/tmp/scratch {64 << 20}",
    ]
    words = Path(f"{record}.agent").read_bytes().split(b"\0")[:-1]
    assert [w.decode() for w in words] == [
        "serve",
        "--listen",
        "vsock:1024",
        "--log",
        "/private/var/vz/main.log",
        "--stop-timeout",
        "12.5s",
        "--env",
        "TOKEN=s3cr3t value",
        "--env",
        "EMPTY=",
        "--env",
        "QUOTE=it's",
        "--main-user",
        "dev",
        "--main-workdir",
        "/workspace",
        "--init",
        "--",
        "sh",
        "-c",
        "echo $HOME; sleep 1",
    ]


def test_boot_sh_without_a_main_command_runs_the_agent_alone() -> None:
    text = boot_config(_config(main_argv=(), main_user="", env=(), shares=(), ram_disks=()))
    assert text.splitlines()[-1] == (
        'exec "$cfg"/vz-agent serve --listen vsock:1024 --log /private/var/vz/main.log --stop-timeout 12.5s '
        "--main-workdir /workspace --init"
    )


def test_the_base_script_is_valid_shell_and_touches_only_the_image_devices() -> None:
    script = provision_script(
        disk="/state/bases/b/disk.img", files_dir="/state/bases/b/provision", marker="/state/bases/b/provisioned"
    )
    subprocess.run(["sh", "-n"], input=script.encode(), check=True)
    assert 'hdiutil attach -imagekey diskimage-class=CRawDiskImage -nomount "$disk"' in script
    assert "for node in $nodes" in script  # the Data volume is searched among this image's devices only
    assert script.rstrip().splitlines()[-2] == "touch /state/bases/b/provisioned"  # the marker comes last
    assert f'"$mnt{PLIST_PATH}"' in script and "-o root -g wheel" in script
