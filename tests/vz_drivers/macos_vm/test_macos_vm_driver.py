"""The macos_vm driver on this host (not a Mac: UNSUPPORTED with the reason, nothing created), and its
request checks with a Mac's host facts handed in (everything that needs no framework)."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from vz_core import Mount, MountType, RunImageRequest
from vz_core.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
    UnsupportedError,
)
from vz_core.rpc import connect_in_process
from vz_drivers._machine import machine_key
from vz_drivers.macos_vm import MacosVmDriver
from vz_drivers.macos_vm._backend import MacosVmBackend
from vz_drivers.macos_vm._host import MacHost, read_host

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="these cases are about a host that is not a Mac")

SHA = hashlib.sha256(b"base").hexdigest()
MAC_14 = MacHost(system="Darwin", machine="arm64", macos=(14, 5), bindings=True)


def _request(**changes: object) -> RunImageRequest:
    request = RunImageRequest(workspace_id="proj/env/mac one", image="macos:stable")
    return replace(request, **changes)  # type: ignore[arg-type]


async def test_info_answers_and_preflight_says_why_not(tmp_path: Path) -> None:
    driver = MacosVmDriver(state_dir=str(tmp_path / "state"))
    info = await driver.info()
    assert (info.driver_name, info.runtime_name, info.runtime_version) == ("macos_vm", "Virtualization.framework", "")
    ext = await driver.extensions()
    assert ext is not None
    assert ext.target_os == ("darwin",)
    assert ext.snapshots is False and ext.accelerator == ""
    assert "macOS on Apple silicon" in ext.accelerator_reason
    assert ext.facts["docker"].startswith("never")
    assert "not verified on a Mac" in ext.facts["status"]
    for call in (driver.preflight, driver.provisioning_preflight):
        with pytest.raises(UnsupportedError, match="macOS Machines need macOS on Apple silicon"):
            await call()
    assert await driver.target_architecture("w") == "arm64"


async def test_run_image_fails_before_anything_is_created(tmp_path: Path) -> None:
    state = tmp_path / "state"
    driver = MacosVmDriver(state_dir=str(state))
    with pytest.raises(UnsupportedError, match="this host runs Linux"):
        await driver.run_image(_request())
    assert not state.exists()
    assert await driver.find("proj/env/mac one") is None
    await driver.delete("proj/env/mac one")
    assert not state.exists()


async def test_the_refusal_crosses_the_wire_as_unsupported(tmp_path: Path) -> None:
    async with connect_in_process(MacosVmDriver(state_dir=str(tmp_path / "s"))) as remote:
        with pytest.raises(UnsupportedError, match="macOS on Apple silicon"):
            await remote.preflight()
        with pytest.raises(UnsupportedError):
            await remote.run_image(_request())
        assert await remote.find("proj/env/mac one") is None
    assert not (tmp_path / "s").exists()


def test_host_facts_decide_support() -> None:
    assert read_host().unsupported  # this host
    assert MAC_14.unsupported == "" and MAC_14.save_restore
    intel = replace(MAC_14, machine="x86_64")
    assert "Apple silicon" in intel.unsupported and not intel.save_restore
    old = replace(MAC_14, macos=(11, 7))
    assert "macOS 13 or newer" in old.unsupported
    monterey = replace(MAC_14, macos=(12, 7))  # has the installer classes, but its guests have no virtio-fs
    assert "macOS 13 or newer on the host (the guests' boot uses a virtio-fs share" in monterey.unsupported
    assert replace(MAC_14, macos=(13, 0)).unsupported == ""
    assert not replace(MAC_14, macos=(13, 6)).save_restore
    assert "pip install pyobjc-framework-Virtualization" in replace(MAC_14, bindings=False).missing_bindings
    linux = read_host(system=lambda: "Linux", machine=lambda: "aarch64", mac_ver=lambda: "")
    assert linux.unsupported.endswith("this host runs Linux on aarch64")


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"bogus": 1}, "unknown macos_vm option"),
        ({"disk_size": 1 << 30}, r"disk_size: must be a size in bytes .* in \[32 GiB, 16 TiB\], got 1073741824"),
        ({"stop_mode": "hibernate"}, r'stop_mode: must be one of "shutdown", "save", got "hibernate"'),
        ({"allow_unpinned": "maybe"}, "allow_unpinned: must be true or false"),
    ],
    ids=["unknown", "small-disk", "stop-mode", "flag"],
)
def test_options_are_checked_when_the_driver_is_built(tmp_path: Path, options: dict[str, object], text: str) -> None:
    with pytest.raises(InvalidArgumentError, match=text):
        MacosVmDriver(state_dir=str(tmp_path), **options)


# -- requests checked with a Mac's facts (no framework needed before a base is installed) ---------------


def _backend(tmp_path: Path, host: MacHost = MAC_14, **options: object) -> MacosVmBackend:
    descriptor = {
        "schema_version": 1,
        "bases": {
            "macos-14.5-23F79": {
                "version": "14.5",
                "build": "23F79",
                "sha256": SHA,
                "size": 14_000_000_000,
                "url": "https://updates.example.test/UniversalMac_14.5_23F79_Restore.ipsw",
            }
        },
        "channels": {"stable": "macos-14.5-23F79", "previous": None},
    }
    (tmp_path / "bases.json").write_text(json.dumps(descriptor))
    return MacosVmBackend(
        {"state_dir": str(tmp_path / "state"), "bases_file": str(tmp_path / "bases.json"), **options}, host=host
    )


async def test_a_request_becomes_a_record_of_its_pinned_base(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    request = _request(
        workspace_mount=Mount(MountType.BIND, str(ws), "/workspace"),
        mounts=(
            Mount(MountType.VOLUME, "cache", "/Users/Shared/cache", read_only=True),
            Mount(MountType.TMPFS, "", "/private/tmp/scratch", options=("size=128m",)),
        ),
        environment={"TOKEN": "secret"},
        entrypoint="/bin/sleep",
        args=("infinity",),
        platform="darwin/arm64",
        user="dev",
    )
    plan = await backend.plan(request, machine_key(request.workspace_id))
    record = plan.record
    assert (record.base_id, record.base_sha256, record.image_digest) == ("macos-14.5-23F79", SHA, f"sha256:{SHA}")
    assert record.argv == ["/bin/sleep", "infinity"]
    assert record.working_dir == "/workspace" and record.user == "dev" and record.developer_identity == "dev"
    assert [(m.type, m.target, m.read_only) for m in record.mounts] == [
        ("bind", "/workspace", False),
        ("volume", "/Users/Shared/cache", True),
        ("tmpfs", "/private/tmp/scratch", False),
    ]
    first = int(record.mac_address.split(":")[0], 16)
    assert first & 0x02 and not first & 0x01  # locally administered, unicast
    shares, ram = backend._shares(record)
    assert [(s.tag, s.read_only, s.target) for s in shares] == [
        ("vz0", False, "/workspace"),
        ("vz1", True, "/Users/Shared/cache"),
    ]
    assert [(r.target, r.size_bytes) for r in ram] == [("/private/tmp/scratch", 128 << 20)]
    assert not (tmp_path / "state").exists()  # planning touches nothing


@pytest.mark.parametrize(
    ("changes", "kind", "field"),
    [
        ({"platform": "linux/arm64"}, UnsupportedError, "platform"),
        ({"labels": ("vz.egress=deny",)}, UnsupportedError, "labels"),
        ({"cap_add": ("CAP_NET_ADMIN",)}, UnsupportedError, "cap_add"),
        ({"security_opt": ("seccomp=unconfined",)}, UnsupportedError, "security_opt"),
        ({"labels": ("vz.profile=hardened",)}, UnsupportedError, "labels"),
        ({"labels": ('vz.network={"v":1}',)}, UnsupportedError, "labels"),
        ({"image": "vz:default"}, InvalidArgumentError, "image"),
        ({"image": "macos:previous"}, FailedPreconditionError, "image"),
        ({"image": "ipsw:/x/Restore.ipsw"}, FailedPreconditionError, "image"),
        (
            {"mounts": (Mount(MountType.TMPFS, "", "/private/tmp/t", options=("size=10%",)),)},
            InvalidArgumentError,
            "mounts[0]",
        ),
        ({"mounts": (Mount(MountType.BIND, "/nonexistent-source", "/data"),)}, InvalidArgumentError, "mounts[0]"),
    ],
    ids=[
        "linux-platform",
        "egress-deny",
        "cap-add",
        "security-opt",
        "hardened",
        "route-domain",
        "oci-image",
        "unpinned-channel",
        "unpinned-ipsw",
        "tmpfs-percent",
        "missing-bind",
    ],
)
async def test_requests_a_macos_machine_cannot_honour_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, object], kind: type[Exception], field: str
) -> None:
    backend = _backend(tmp_path)
    with pytest.raises(kind) as info:
        await backend.plan(_request(**changes), "k")
    assert info.value.details.get("field") == field  # type: ignore[attr-defined]
    assert not (tmp_path / "state").exists()


async def test_storage_requests_are_refused(tmp_path: Path) -> None:
    from vz_core import HostRequirements

    backend = _backend(tmp_path)
    with pytest.raises(UnsupportedError, match="disk_size"):
        await backend.plan(_request(host_requirements=HostRequirements(storage_bytes=1 << 36)), "k")


async def test_save_mode_needs_macos_14_and_missing_bindings_are_named(tmp_path: Path) -> None:
    sonoma = _backend(tmp_path, stop_mode="save")
    await sonoma.preflight()
    ventura = _backend(tmp_path, host=replace(MAC_14, macos=(13, 6)), stop_mode="save")
    with pytest.raises(UnsupportedError, match="stop_mode=save needs macOS 14"):
        await ventura.preflight()
    bare = _backend(tmp_path, host=replace(MAC_14, bindings=False))
    with pytest.raises(UnavailableError, match="pyobjc-framework-Virtualization"):
        await bare.preflight()
    facts, accelerator, reason = await sonoma.extension_facts()
    assert (accelerator, reason) == ("virtualization.framework", "")
    assert facts["save_restore"].startswith("yes")


async def test_a_state_directory_too_long_for_socket_paths_is_refused_before_anything(tmp_path: Path) -> None:
    long_state = tmp_path / ("d" * 90)
    descriptor = tmp_path / "bases.json"
    _backend(tmp_path)  # writes the descriptor
    backend = MacosVmBackend({"state_dir": str(long_state), "bases_file": str(descriptor)}, host=MAC_14)
    with pytest.raises(FailedPreconditionError, match="state_dir=<shorter path>") as info:
        await backend.plan(_request(), machine_key("proj/env/mac one"))
    assert info.value.details["option"] == "state_dir"
    assert not long_state.exists()
