"""The configuration plan: which Virtualization.framework objects a Machine needs, as plain data.

``plan_vm`` is a pure function from a Machine's request (``VmRequest``) and the host's facts (``Limits``,
the host macOS version) to a ``VmPlan``: a tree of ``Obj`` nodes, each naming a framework class, the
initializer to call (PyObjC selector spelling) with its arguments, and the properties to set afterwards.
Leaves are JSON values, ``Url`` (a file URL) and ``Data`` (the bytes of a file). Nothing here imports the
framework: the tree is checked by the tests of this host and turned into objects by ``_realize`` on a Mac.
The plan is also what the VM helper process receives (``to_json``/``from_json``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Union

from vz_core.errors import InvalidArgumentError

__all__ = [
    "AGENT_PORT",
    "CONFIG_TAG",
    "Data",
    "Limits",
    "Obj",
    "Share",
    "Url",
    "Value",
    "VmPlan",
    "VmRequest",
    "plan_from_json",
    "plan_vm",
]

AGENT_PORT = 1024
"""The virtio-socket port the guest agent listens on."""
CONFIG_TAG = "vzcfg"
"""The virtio-fs tag of the read-only share that carries a boot's configuration into the guest."""
MIB = 1024 * 1024
GIB = 1024 * MIB
DEFAULT_CPUS = 4
DEFAULT_MEMORY = 8 * GIB
DISPLAY = (1920, 1200, 80)
"""Width, height (pixels) and pixels per inch of the one headless display a macOS guest needs."""
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,35}\Z")  # virtio-fs tags are at most 36 bytes


@dataclass(frozen=True)
class Url:
    """A file URL (``NSURL.fileURLWithPath_``)."""

    path: str


@dataclass(frozen=True)
class Data:
    """The contents of a file (``NSData.dataWithContentsOfFile_``)."""

    path: str


Value = Union[None, bool, int, float, str, Url, Data, "Obj", list["Value"]]


@dataclass(frozen=True)
class Obj:
    """``cls.alloc().<init>(*args)`` then ``set<Prop>_(value)`` for each property, in order.

    ``init`` ending in ``error_`` returns ``(object, error)`` in PyObjC; its last argument is ``None``.
    """

    cls: str
    init: str = "init"
    args: tuple[Value, ...] = ()
    props: tuple[tuple[str, Value], ...] = ()

    def prop(self, name: str) -> Value:
        for key, value in self.props:
            if key == name:
                return value
        raise KeyError(name)


@dataclass(frozen=True)
class Limits:
    """What the framework (``VZVirtualMachineConfiguration`` class properties) and the base allow."""

    min_cpus: int
    max_cpus: int
    min_memory: int
    max_memory: int
    base_min_cpus: int = 1
    """``VZMacOSConfigurationRequirements.minimumSupportedCPUCount`` of the installed base."""
    base_min_memory: int = 0
    """``minimumSupportedMemorySize`` of the installed base."""


@dataclass(frozen=True)
class Share:
    """A host directory shared into the guest over virtio-fs under ``tag``."""

    tag: str
    host_path: str
    read_only: bool
    target: str


@dataclass(frozen=True)
class VmRequest:
    """One Machine's virtual hardware, as the driver resolved it (paths are inside the Machine directory)."""

    cpus: int
    """0: the default."""
    memory_bytes: int
    disk: str
    auxiliary_storage: str
    hardware_model: str
    """File holding ``VZMacHardwareModel.dataRepresentation``."""
    machine_identifier: str
    """File holding ``VZMacMachineIdentifier.dataRepresentation`` (unique per Machine)."""
    mac_address: str
    shares: tuple[Share, ...] = ()
    config_dir: str = ""
    """Host directory shared read-only as ``CONFIG_TAG`` (the boot configuration the guest reads)."""


@dataclass(frozen=True)
class VmPlan:
    cpus: int
    memory_bytes: int
    configuration: Obj
    save_restore: bool
    """The host supports saving and restoring this VM's state (macOS 14+)."""
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "memory_bytes": self.memory_bytes,
            "configuration": _dump(self.configuration),
            "save_restore": self.save_restore,
            "notes": list(self.notes),
        }


def _choose(requested: int, default: int, low: int, high: int, *, what: str, field_name: str, unit: str) -> int:
    if low > high:
        raise InvalidArgumentError(
            f"this host cannot run the base: it needs at least {low} {unit} of {what} and the framework allows at "
            f"most {high}",
            details={"field": field_name},
        )
    if requested == 0:
        return max(low, min(default, high))
    if not low <= requested <= high:
        raise InvalidArgumentError(
            f"{field_name}={requested} is outside what Virtualization.framework and the base allow here "
            f"({low}..{high} {unit}); ask for a value in that range",
            details={"field": field_name, "min": str(low), "max": str(high)},
        )
    return requested


def plan_vm(request: VmRequest, limits: Limits, *, host_macos: tuple[int, ...]) -> VmPlan:
    """The framework objects of one Machine; ``InvalidArgumentError`` naming the field when it cannot fit."""
    cpus = _choose(
        request.cpus,
        DEFAULT_CPUS,
        max(limits.min_cpus, limits.base_min_cpus),
        limits.max_cpus,
        what="CPUs",
        field_name="host_requirements.cpus",
        unit="CPUs",
    )
    if request.memory_bytes % MIB:
        raise InvalidArgumentError(
            f"host_requirements.memory_bytes={request.memory_bytes} must be a multiple of 1 MiB "
            "(Virtualization.framework)",
            details={"field": "host_requirements.memory_bytes"},
        )
    memory = _choose(
        request.memory_bytes,
        DEFAULT_MEMORY,
        max(limits.min_memory, limits.base_min_memory),
        limits.max_memory - limits.max_memory % MIB,
        what="memory",
        field_name="host_requirements.memory_bytes",
        unit="bytes",
    )
    tags = [s.tag for s in request.shares] + ([CONFIG_TAG] if request.config_dir else [])
    for tag in tags:
        if not _TAG.fullmatch(tag):
            raise InvalidArgumentError(f"virtio-fs tag {tag!r} is not valid (1..36 of [A-Za-z0-9_.-])")
    if len(set(tags)) != len(tags):
        raise InvalidArgumentError("two shares have the same virtio-fs tag")
    # VZMacAuxiliaryStorage gained initWithURL: in macOS 13; macOS 12 has initWithContentsOfURL:.
    aux_init = "initWithURL_" if host_macos >= (13,) else "initWithContentsOfURL_"
    platform = Obj(
        "VZMacPlatformConfiguration",
        props=(
            (
                "hardwareModel",
                Obj("VZMacHardwareModel", "initWithDataRepresentation_", (Data(request.hardware_model),)),
            ),
            (
                "machineIdentifier",
                Obj("VZMacMachineIdentifier", "initWithDataRepresentation_", (Data(request.machine_identifier),)),
            ),
            ("auxiliaryStorage", Obj("VZMacAuxiliaryStorage", aux_init, (Url(request.auxiliary_storage),))),
        ),
    )
    disk = Obj(
        "VZVirtioBlockDeviceConfiguration",
        "initWithAttachment_",
        (Obj("VZDiskImageStorageDeviceAttachment", "initWithURL_readOnly_error_", (Url(request.disk), False, None)),),
    )
    network = Obj(
        "VZVirtioNetworkDeviceConfiguration",
        props=(
            ("attachment", Obj("VZNATNetworkDeviceAttachment")),
            ("MACAddress", Obj("VZMACAddress", "initWithString_", (request.mac_address,))),
        ),
    )
    shares: list[Value] = [_share(s.tag, s.host_path, s.read_only) for s in request.shares]
    if request.config_dir:
        shares.append(_share(CONFIG_TAG, request.config_dir, True))
    width, height, ppi = DISPLAY
    graphics = Obj(
        "VZMacGraphicsDeviceConfiguration",
        props=(
            (
                "displays",
                [
                    Obj(
                        "VZMacGraphicsDisplayConfiguration",
                        "initWithWidthInPixels_heightInPixels_pixelsPerInch_",
                        (width, height, ppi),
                    )
                ],
            ),
        ),
    )
    configuration = Obj(
        "VZVirtualMachineConfiguration",
        props=(
            ("CPUCount", cpus),
            ("memorySize", memory),
            ("bootLoader", Obj("VZMacOSBootLoader")),
            ("platform", platform),
            ("storageDevices", [disk]),
            ("networkDevices", [network]),
            ("socketDevices", [Obj("VZVirtioSocketDeviceConfiguration")]),
            ("directorySharingDevices", shares),
            ("graphicsDevices", [graphics]),
            ("entropyDevices", [Obj("VZVirtioEntropyDeviceConfiguration")]),
            ("memoryBalloonDevices", [Obj("VZVirtioTraditionalMemoryBalloonDeviceConfiguration")]),
        ),
    )
    notes = ("headless: one display device (macOS guests need one), no keyboard or pointing device",)
    return VmPlan(cpus, memory, configuration, save_restore=host_macos >= (14,), notes=notes)


def _share(tag: str, path: str, read_only: bool) -> Obj:
    directory = Obj("VZSharedDirectory", "initWithURL_readOnly_", (Url(path), read_only))
    return Obj(
        "VZVirtioFileSystemDeviceConfiguration",
        "initWithTag_",
        (tag,),
        (("share", Obj("VZSingleDirectoryShare", "initWithDirectory_", (directory,))),),
    )


# -- JSON form (what the helper process receives) ----------------------------------------------------------


def _dump(value: Value) -> Any:
    if isinstance(value, Obj):
        return {
            "class": value.cls,
            "init": value.init,
            "args": [_dump(a) for a in value.args],
            "props": [[k, _dump(v)] for k, v in value.props],
        }
    if isinstance(value, Url):
        return {"url": value.path}
    if isinstance(value, Data):
        return {"data": value.path}
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


def _load(raw: Any) -> Value:
    if isinstance(raw, dict):
        if set(raw) == {"url"} and isinstance(raw["url"], str):
            return Url(raw["url"])
        if set(raw) == {"data"} and isinstance(raw["data"], str):
            return Data(raw["data"])
        if set(raw) == {"class", "init", "args", "props"} and isinstance(raw["class"], str):
            return Obj(
                raw["class"],
                str(raw["init"]),
                tuple(_load(a) for a in raw["args"]),
                tuple((str(k), _load(v)) for k, v in raw["props"]),
            )
        raise ValueError(f"not a plan node: keys {sorted(raw)}")
    if isinstance(raw, list):
        return [_load(v) for v in raw]
    if raw is None or isinstance(raw, bool | int | float | str):
        return raw
    raise ValueError(f"not a plan value: {type(raw).__name__}")


def plan_from_json(raw: dict[str, Any]) -> VmPlan:
    configuration = _load(raw["configuration"])
    if not isinstance(configuration, Obj) or configuration.cls != "VZVirtualMachineConfiguration":
        raise ValueError("the plan's configuration must be a VZVirtualMachineConfiguration node")
    return VmPlan(
        cpus=int(raw["cpus"]),
        memory_bytes=int(raw["memory_bytes"]),
        configuration=configuration,
        save_restore=bool(raw["save_restore"]),
        notes=tuple(str(n) for n in raw.get("notes", ())),
    )
