"""The VM configuration plan (pure data) and its realization against a stand-in framework object model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from macos_fakes import FakeFoundation, FakeFramework, FakeObject

from vz_core.errors import InvalidArgumentError, UnavailableError
from vz_drivers.macos_vm._plan import (
    AGENT_PORT,
    CONFIG_TAG,
    DEFAULT_CPUS,
    DEFAULT_MEMORY,
    GIB,
    MIB,
    Data,
    Limits,
    Obj,
    Share,
    Url,
    VmRequest,
    plan_from_json,
    plan_vm,
)
from vz_drivers.macos_vm._realize import Frameworks, Realizer, framework_limits

LIMITS = Limits(
    min_cpus=1, max_cpus=10, min_memory=512 * MIB, max_memory=32 * GIB, base_min_cpus=2, base_min_memory=4 * GIB
)


def _request(tmp: Path | None = None, **changes: object) -> VmRequest:
    root = str(tmp) if tmp else "/m"
    fields: dict[str, object] = dict(
        cpus=0,
        memory_bytes=0,
        disk=f"{root}/disk.img",
        auxiliary_storage=f"{root}/aux.img",
        hardware_model=f"{root}/hardware-model.bin",
        machine_identifier=f"{root}/machine-identifier.bin",
        mac_address="02:11:22:33:44:55",
        shares=(Share("vz0", "/host/ws", False, "/workspace"), Share("vz1", "/host/ro", True, "/data")),
        config_dir=f"{root}/run/cfg",
    )
    fields.update(changes)
    return VmRequest(**fields)  # type: ignore[arg-type]


def _device(plan_obj: Obj, prop: str) -> list[Obj]:
    value = plan_obj.prop(prop)
    assert isinstance(value, list)
    return [v for v in value if isinstance(v, Obj)]


def test_the_plan_names_every_framework_object_with_its_properties() -> None:
    plan = plan_vm(_request(cpus=4, memory_bytes=8 * GIB), LIMITS, host_macos=(14, 5))
    cfg = plan.configuration
    assert cfg.cls == "VZVirtualMachineConfiguration"
    assert cfg.prop("CPUCount") == 4 and cfg.prop("memorySize") == 8 * GIB
    assert cfg.prop("bootLoader") == Obj("VZMacOSBootLoader")
    platform = cfg.prop("platform")
    assert isinstance(platform, Obj) and platform.cls == "VZMacPlatformConfiguration"
    assert platform.prop("hardwareModel") == Obj(
        "VZMacHardwareModel", "initWithDataRepresentation_", (Data("/m/hardware-model.bin"),)
    )
    assert platform.prop("machineIdentifier") == Obj(
        "VZMacMachineIdentifier", "initWithDataRepresentation_", (Data("/m/machine-identifier.bin"),)
    )
    assert platform.prop("auxiliaryStorage") == Obj("VZMacAuxiliaryStorage", "initWithURL_", (Url("/m/aux.img"),))
    [disk] = _device(cfg, "storageDevices")
    assert disk.cls == "VZVirtioBlockDeviceConfiguration"
    assert disk.args == (
        Obj("VZDiskImageStorageDeviceAttachment", "initWithURL_readOnly_error_", (Url("/m/disk.img"), False, None)),
    )
    [net] = _device(cfg, "networkDevices")
    assert net.prop("attachment") == Obj("VZNATNetworkDeviceAttachment")
    assert net.prop("MACAddress") == Obj("VZMACAddress", "initWithString_", ("02:11:22:33:44:55",))
    assert _device(cfg, "socketDevices") == [Obj("VZVirtioSocketDeviceConfiguration")]
    shares = _device(cfg, "directorySharingDevices")
    assert [(s.cls, s.args) for s in shares] == [
        ("VZVirtioFileSystemDeviceConfiguration", ("vz0",)),
        ("VZVirtioFileSystemDeviceConfiguration", ("vz1",)),
        ("VZVirtioFileSystemDeviceConfiguration", (CONFIG_TAG,)),
    ]
    read_only = []
    for share in shares:
        single = share.prop("share")
        assert isinstance(single, Obj) and single.cls == "VZSingleDirectoryShare"
        (directory,) = single.args
        assert isinstance(directory, Obj) and directory.cls == "VZSharedDirectory"
        read_only.append(directory.args)
    assert read_only == [(Url("/host/ws"), False), (Url("/host/ro"), True), (Url("/m/run/cfg"), True)]
    [graphics] = _device(cfg, "graphicsDevices")
    assert graphics.cls == "VZMacGraphicsDeviceConfiguration"
    assert plan.save_restore is True
    assert AGENT_PORT == 1024


def test_macos_12_hosts_open_auxiliary_storage_with_the_older_initializer() -> None:
    plan = plan_vm(_request(), LIMITS, host_macos=(12, 6))
    platform = plan.configuration.prop("platform")
    assert isinstance(platform, Obj)
    aux = platform.prop("auxiliaryStorage")
    assert isinstance(aux, Obj) and aux.init == "initWithContentsOfURL_"
    assert plan.save_restore is False


def test_defaults_fit_the_framework_and_the_base() -> None:
    plan = plan_vm(_request(), LIMITS, host_macos=(14,))
    assert (plan.cpus, plan.memory_bytes) == (DEFAULT_CPUS, DEFAULT_MEMORY)
    small = Limits(1, 2, 512 * MIB, 6 * GIB, base_min_cpus=1, base_min_memory=4 * GIB)
    plan = plan_vm(_request(), small, host_macos=(14,))
    assert (plan.cpus, plan.memory_bytes) == (2, 6 * GIB)
    hungry_base = Limits(1, 10, 512 * MIB, 32 * GIB, base_min_cpus=6, base_min_memory=12 * GIB)
    plan = plan_vm(_request(), hungry_base, host_macos=(14,))
    assert (plan.cpus, plan.memory_bytes) == (6, 12 * GIB)


@pytest.mark.parametrize(
    ("changes", "field", "text"),
    [
        ({"cpus": 1}, "host_requirements.cpus", "2..10 CPUs"),
        ({"cpus": 11}, "host_requirements.cpus", "2..10 CPUs"),
        ({"cpus": 65536}, "host_requirements.cpus", "2..10"),
        ({"memory_bytes": 2 * GIB}, "host_requirements.memory_bytes", f"{4 * GIB}..{32 * GIB}"),
        ({"memory_bytes": 1 << 50}, "host_requirements.memory_bytes", "outside"),
        ({"memory_bytes": 8 * GIB + 1}, "host_requirements.memory_bytes", "multiple of 1 MiB"),
    ],
    ids=["below-base", "above-framework", "impossible-cpus", "below-base-memory", "impossible-memory", "unaligned"],
)
def test_resources_outside_the_limits_are_refused_naming_the_field(
    changes: dict[str, int], field: str, text: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        plan_vm(_request(**changes), LIMITS, host_macos=(14,))
    assert info.value.details["field"] == field
    assert text in info.value.message


def test_a_base_the_framework_cannot_fit_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="cannot run the base"):
        plan_vm(_request(), Limits(1, 2, MIB, 32 * GIB, base_min_cpus=4), host_macos=(14,))


@pytest.mark.parametrize(
    "shares",
    [
        (Share("bad tag", "/h", False, "/t"),),
        (Share("x" * 37, "/h", False, "/t"),),
        (Share("vz0", "/h", False, "/a"), Share("vz0", "/h2", False, "/b")),
        (Share(CONFIG_TAG, "/h", False, "/a"),),
    ],
    ids=["space", "too-long", "twice", "config-tag-taken"],
)
def test_share_tags_are_checked(shares: tuple[Share, ...]) -> None:
    with pytest.raises(InvalidArgumentError, match="tag"):
        plan_vm(_request(shares=shares), LIMITS, host_macos=(14,))


def test_the_plan_survives_its_json_form() -> None:
    plan = plan_vm(_request(cpus=3, memory_bytes=6 * GIB), LIMITS, host_macos=(13, 1))
    again = plan_from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan
    with pytest.raises(ValueError, match="VZVirtualMachineConfiguration"):
        plan_from_json({**plan.to_json(), "configuration": {"url": "/x"}})
    with pytest.raises(ValueError, match="not a plan node"):
        plan_from_json({**plan.to_json(), "configuration": {"class": "X"}})


# -- realization against the stand-in object model ------------------------------------------------------


def _files(tmp_path: Path) -> VmRequest:
    (tmp_path / "hardware-model.bin").write_bytes(b"hw-model")
    (tmp_path / "machine-identifier.bin").write_bytes(b"machine-id")
    return _request(tmp_path, cpus=2, memory_bytes=4 * GIB)


def test_the_realizer_builds_the_objects_the_plan_names(tmp_path: Path) -> None:
    fw = FakeFramework()
    plan = plan_vm(_files(tmp_path), LIMITS, host_macos=(14,))
    config = Realizer(Frameworks(fw, FakeFoundation)).configuration(plan)
    assert isinstance(config, FakeObject) and config.cls == "VZVirtualMachineConfiguration"
    assert fw.validated == [config] and fw.save_validated == []
    assert config.props["CPUCount"] == 2 and config.props["MemorySize"] == 4 * GIB
    platform = config.props["Platform"]
    assert platform.props["HardwareModel"].args == (b"hw-model",)
    assert platform.props["MachineIdentifier"].args == (b"machine-id",)
    assert platform.props["AuxiliaryStorage"].args == (("file-url", f"{tmp_path}/aux.img"),)
    [disk] = config.props["StorageDevices"]
    (attachment,) = disk.args
    assert attachment.made_by == "initWithURL_readOnly_error_"
    assert attachment.args == (("file-url", f"{tmp_path}/disk.img"), False, None)
    directories = [d.props["Share"].args[0] for d in config.props["DirectorySharingDevices"]]
    assert [(d.cls, d.args[1]) for d in directories] == [
        ("VZSharedDirectory", False),
        ("VZSharedDirectory", True),
        ("VZSharedDirectory", True),
    ]
    [net] = config.props["NetworkDevices"]
    assert net.props["Attachment"].cls == "VZNATNetworkDeviceAttachment"
    assert config.props["SocketDevices"][0].cls == "VZVirtioSocketDeviceConfiguration"


def test_save_restore_support_is_checked_only_when_asked_and_possible(tmp_path: Path) -> None:
    fw = FakeFramework()
    fw.no_save = True
    realizer = Realizer(Frameworks(fw, FakeFoundation))
    plan = plan_vm(_files(tmp_path), LIMITS, host_macos=(14,))
    realizer.configuration(plan)
    with pytest.raises(InvalidArgumentError, match="cannot save/restore"):
        realizer.configuration(plan, save_restore=True)
    old_host = plan_vm(_files(tmp_path), LIMITS, host_macos=(13,))
    realizer.configuration(old_host, save_restore=True)
    assert len(fw.save_validated) == 1


def test_framework_refusals_surface_with_their_text(tmp_path: Path) -> None:
    fw = FakeFramework()
    realizer = Realizer(Frameworks(fw, FakeFoundation))
    plan = plan_vm(_files(tmp_path), LIMITS, host_macos=(14,))
    fw.refuse["VZDiskImageStorageDeviceAttachment"] = "the disk image is locked"
    with pytest.raises(InvalidArgumentError, match="the disk image is locked"):
        realizer.configuration(plan)
    fw.refuse.clear()
    fw.invalid = "memory size is too large"
    with pytest.raises(InvalidArgumentError, match="rejected the configuration: memory size is too large"):
        realizer.configuration(plan)


def test_a_missing_class_or_file_is_unavailable(tmp_path: Path) -> None:
    plan = plan_vm(_files(tmp_path), LIMITS, host_macos=(14,))
    old = Realizer(Frameworks(FakeFramework(without=["VZMacGraphicsDeviceConfiguration"]), FakeFoundation))
    with pytest.raises(UnavailableError, match="no VZMacGraphicsDeviceConfiguration"):
        old.configuration(plan)
    (tmp_path / "machine-identifier.bin").unlink()
    with pytest.raises(UnavailableError, match=r"machine-identifier\.bin cannot be read"):
        Realizer(Frameworks(FakeFramework(), FakeFoundation)).configuration(plan)


def test_framework_limits_are_read_from_the_configuration_class() -> None:
    fw = FakeFramework(limits=(1, 12, 256 * MIB, 48 * GIB))
    limits = framework_limits(Frameworks(fw, FakeFoundation), base_min_cpus=2, base_min_memory=4 * GIB)
    assert limits == Limits(1, 12, 256 * MIB, 48 * GIB, 2, 4 * GIB)
