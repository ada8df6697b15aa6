"""What the hyperv driver adds to the shared record book.

Layout under the driver state root (``<state>``), besides the shared entries (``vz_drivers._machine``)::

    <state>/machines/<key>/disk.vhdx     the Machine's boot disk (GPT: EFI system partition + ext4 root)
    <state>/machines/<key>/vm/           Hyper-V's own files of the VM (``New-VM -Path``)
    <state>/staging/                     boot disks being built for a (re)creation

Every Hyper-V name is keyed by the Machine's key, never by its workspace id: the VM is ``vz-<key>``, its
COM1 pipe ``\\\\.\\pipe\\vz-<key>-com1``, its Hyper-V socket service GUID is made of its own random vsock
port (``<port:08x>-facb-11e6-bd58-64006a7986d3``). A Hyper-V VM is not a host process of ours: the record's
``vm_id`` (Hyper-V's GUID of the VM) is how any later driver process finds it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vz_drivers._machine import MachinePaths, MachineRecord, RecordBook, subpath
from vz_drivers.hyperv._scripts import service_id

__all__ = ["HypervBook", "HypervPaths", "HypervRecord", "vm_name"]


def vm_name(key: str) -> str:
    """The Hyper-V name of the Machine with record key ``key`` (32 hex characters)."""
    return f"vz-{key}"


@dataclass(kw_only=True)
class HypervRecord(MachineRecord):
    """A Hyper-V Machine. ``vm_id`` names the VM; ``pid``/``pid_start`` name its current boot (see _driver)."""

    disk_bytes: int
    vm_id: str = ""
    """Hyper-V's GUID of the VM (empty until it is created)."""
    vsock_port: int = 0
    """The guest agent's AF_VSOCK port; its Hyper-V socket service GUID is ``service_id``."""
    switch: str = ""
    secure_boot: str = "Off"

    @property
    def vm_name(self) -> str:
        return vm_name(self.key)

    @property
    def service_id(self) -> str:
        return service_id(self.vsock_port) if self.vsock_port else ""


@dataclass(frozen=True)
class HypervPaths(MachinePaths):
    disk = subpath("disk.vhdx")
    vm_dir = subpath("vm")


class HypervBook(RecordBook[HypervRecord, HypervPaths]):
    def __init__(self, root: Path) -> None:
        super().__init__(root, HypervRecord, HypervPaths)

    staging = subpath("staging")
    """Boot disks being built for a (re)creation."""
