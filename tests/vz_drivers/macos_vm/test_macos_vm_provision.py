"""Provisioning: the launchd daemon (plistlib), the boot script, each start's boot.sh and the base script."""

from __future__ import annotations

import os
import plistlib
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vz_drivers.macos_vm._provision import (
    BOOT_SCRIPT,
    BOOT_SCRIPT_PATH,
    CONFIG_MOUNT,
    DATA_VOLUME_PICKER,
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
        "--key-from-host",
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
        'exec "$cfg"/vz-agent serve --listen vsock:1024 --key-from-host --log /private/var/vz/main.log '
        "--stop-timeout 12.5s --main-workdir /workspace --init"
    )


def test_the_base_script_is_valid_shell_and_touches_only_the_image_devices() -> None:
    script = provision_script(
        disk="/state/bases/b/disk.img", files_dir="/state/bases/b/provision", marker="/state/bases/b/provisioned"
    )
    subprocess.run(["sh", "-n"], input=script.encode(), check=True)
    assert 'hdiutil attach -imagekey diskimage-class=CRawDiskImage -nomount "$disk"' in script
    assert "-c " in script and " $nodes)" in script  # the Data volume is searched among this image's devices only
    assert script.rstrip().splitlines()[-2] == "touch /state/bases/b/provisioned"  # the marker comes last
    assert f'"$mnt{PLIST_PATH}"' in script and "-o root -g wheel" in script


# -- the Data volume, from `diskutil info -plist` ----------------------------------------------------------
def _volume(node: str, name: str, roles: list[str], **extra: Any) -> dict[str, Any]:
    """What ``diskutil info -plist <node>`` prints for an APFS volume of an attached macOS disk image (keys
    and value types as macOS 13/14 write them; the role array is ``APFSVolumeRoles``)."""
    return {
        "APFSContainerReference": "disk5",
        "APFSPhysicalStores": [{"APFSPhysicalStore": "disk4s2"}],
        "APFSSnapshot": False,
        "APFSVolumeGroupID": "9A1C6E42-5B0E-4C8E-9F61-0D7B3E2C1A55",
        "APFSVolumeRoles": roles,
        "Bootable": True,
        "BusProtocol": "Disk Image",
        "Content": "41504653-0000-11AA-AA11-00306543ECAC",
        "DeviceBlockSize": 4096,
        "DeviceIdentifier": node,
        "DeviceNode": f"/dev/{node}",
        "Ejectable": True,
        "Encryption": False,
        "FilesystemName": "APFS",
        "FilesystemType": "apfs",
        "FilesystemUserVisibleName": "APFS",
        "Internal": False,
        "Locked": False,
        "MountPoint": "",
        "ParentWholeDisk": "disk5",
        "RemovableMediaOrExternalDevice": True,
        "Size": 68_719_476_736,
        "VolumeName": name,
        "VolumeUUID": "2D0F8E1B-7C36-4B59-A1E4-" + node[-2:].upper().rjust(12, "0"),
        "WholeDisk": False,
        "Writable": True,
        **extra,
    }


_DISK_IMAGE = {
    "disk4": {"Content": "GUID_partition_scheme", "DeviceIdentifier": "disk4", "WholeDisk": True, "Size": 1 << 36},
    "disk4s1": {"Content": "Apple_APFS_ISC", "DeviceIdentifier": "disk4s1", "WholeDisk": False},
    "disk4s2": {"Content": "Apple_APFS", "DeviceIdentifier": "disk4s2", "WholeDisk": False},
    "disk5s1": _volume("disk5s1", "Macintosh HD", ["System"]),
    "disk5s2": _volume("disk5s2", "Preboot", ["Preboot"]),
    "disk5s3": _volume("disk5s3", "Recovery", ["Recovery"]),
    "disk5s4": _volume("disk5s4", "Update", ["Update"]),
    "disk5s5": _volume("disk5s5", "Data", ["Data"]),
    "disk5s6": _volume("disk5s6", "VM", ["VM"]),
}


def _standin_diskutil(directory: Path, volumes: dict[str, dict[str, Any]]) -> Path:
    """A ``diskutil`` answering ``info -plist NODE`` with the XML plist macOS writes (``plistlib`` writes the
    same XML format, DTD included), and an error for an unknown node."""
    directory.mkdir()
    for node, info in volumes.items():
        (directory / f"{node}.plist").write_bytes(plistlib.dumps(info, fmt=plistlib.FMT_XML))
    script = directory / "diskutil"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1 $2" = "info -plist" ] || { echo "unexpected diskutil $*" >&2; exit 2; }\n'
        f'f={shlex.quote(str(directory))}/"$3".plist\n'
        '[ -f "$f" ] || { echo "Could not find disk: $3" >&2; exit 1; }\n'
        'cat "$f"\n'
    )
    script.chmod(0o755)
    return directory


def _pick(bin_dir: Path, nodes: list[str]) -> subprocess.CompletedProcess[str]:
    # As provision.sh runs it: the interpreter isolated (-I), the nodes as separate words.
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    line = f"{shlex.quote(sys.executable)} -I -c {shlex.quote(DATA_VOLUME_PICKER)} {' '.join(nodes)}"
    return subprocess.run(["sh", "-c", line], capture_output=True, text=True, env=env, check=False)


def test_the_data_volume_is_found_in_diskutil_plists(tmp_path: Path) -> None:
    bin_dir = _standin_diskutil(tmp_path / "bin", _DISK_IMAGE)
    done = _pick(bin_dir, list(_DISK_IMAGE))
    assert (done.returncode, done.stdout) == (0, "disk5s5\n"), done.stderr


@pytest.mark.parametrize(
    ("volumes", "message"),
    [
        ({k: v for k, v in _DISK_IMAGE.items() if k != "disk5s5"}, "found none"),
        ({**_DISK_IMAGE, "disk5s7": _volume("disk5s7", "Data 2", ["Data"])}, "found disk5s5 disk5s7"),
        ({"disk5s5": _volume("disk5s5", "Data", ["Data"], FilesystemType="hfs")}, "found none"),
    ],
)
def test_no_single_data_volume_is_an_error(tmp_path: Path, volumes: dict[str, Any], message: str) -> None:
    bin_dir = _standin_diskutil(tmp_path / "bin", volumes)
    done = _pick(bin_dir, [*volumes, "disk9s9"])
    assert done.returncode == 1 and message in done.stderr and done.stdout == ""


def test_the_base_script_picks_the_data_volume_with_the_picker() -> None:
    script = provision_script(disk="/d.img", files_dir="/f", marker="/m", python="/opt/vz/bin/python3")
    assert f"data=$(/opt/vz/bin/python3 -I -c {shlex.quote(DATA_VOLUME_PICKER)} $nodes)" in script
    assert "grep" not in script
