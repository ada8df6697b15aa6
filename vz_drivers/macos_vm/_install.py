"""Installed bases and the Machines cloned from them.

Layout under the driver state root (beside the shared record book's ``machines/``, ``locks/``, ``volumes/``)::

    <state>/ipsw/<sha256>.ipsw              downloaded restore images, kept by digest (~15 GB each)
    <state>/bases/<base id>/disk.img        the installed, provisioned system disk (sparse; default 64 GiB)
    <state>/bases/<base id>/aux.img         its auxiliary storage (NVRAM)
    <state>/bases/<base id>/hardware-model.bin   VZMacHardwareModel.dataRepresentation
    <state>/bases/<base id>/installed.json  written after the installer: sha256, build, minimum CPUs/memory
    <state>/bases/<base id>/provision.sh    the one administrator step that puts the agent daemon in the base
    <state>/bases/<base id>/provisioned     written by provision.sh; the base is used only once it exists
    <state>/machines/<key>/disk.img         clonefile of the base's disk: shares every unchanged block
    <state>/machines/<key>/aux.img          clonefile of the base's aux.img
    <state>/machines/<key>/hardware-model.bin, machine-identifier.bin (a new identifier per Machine)

``install_base`` is the framework part (restore image -> requirements -> auxiliary storage -> installer); it
runs in the VM helper process, which has the run loop. The rest runs in the plugin.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vz_core.errors import FailedPreconditionError, UnavailableError, UnsupportedError
from vz_drivers._machine import atomic_write
from vz_drivers.macos_vm._bases import ResolvedBase, sha256_file
from vz_drivers.macos_vm._clone import CloneFn, clone_file
from vz_drivers.macos_vm._control import ControlError, complete, on_queue
from vz_drivers.macos_vm._plan import Limits, VmRequest, plan_vm
from vz_drivers.macos_vm._realize import Frameworks, Realizer

__all__ = ["BaseStore", "InstalledBase", "install_base", "machine_files"]

MACHINE_FILES = ("disk.img", "aux.img", "hardware-model.bin", "machine-identifier.bin")


@dataclass(frozen=True)
class InstalledBase:
    base_id: str
    root: Path
    sha256: str
    build: str
    min_cpus: int
    min_memory: int
    provisioned: bool = False
    """``provision.sh`` (``_provision.provision_script``) put the agent daemon into the base."""

    @property
    def disk(self) -> Path:
        return self.root / "disk.img"

    @property
    def aux(self) -> Path:
        return self.root / "aux.img"

    @property
    def hardware_model(self) -> Path:
        return self.root / "hardware-model.bin"


def machine_files(machine_dir: Path) -> dict[str, Path]:
    return {name: machine_dir / name for name in MACHINE_FILES}


class BaseStore:
    """Restore images and installed bases of one state root."""

    def __init__(self, state_root: Path) -> None:
        self.root = state_root

    @property
    def bases_dir(self) -> Path:
        return self.root / "bases"

    @property
    def ipsw_dir(self) -> Path:
        return self.root / "ipsw"

    def installed(self, base_id: str) -> InstalledBase | None:
        root = self.bases_dir / base_id
        try:
            data = json.loads((root / "installed.json").read_bytes())
        except (OSError, ValueError):
            return None
        return InstalledBase(
            base_id=base_id,
            root=root,
            sha256=str(data["sha256"]),
            build=str(data.get("build", "")),
            min_cpus=int(data["min_cpus"]),
            min_memory=int(data["min_memory"]),
            provisioned=(root / "provisioned").is_file(),
        )

    def restore_image(
        self, base: ResolvedBase, *, fetch: Callable[[str, Path], None] | None = None
    ) -> tuple[Path, str]:
        """The local restore image of ``base`` with its verified SHA-256 (downloaded once when needed)."""
        if base.source == "latest":
            raise UnsupportedError("macos:latest is resolved by the framework on the Mac (fetchLatestSupported)")
        if base.source.startswith("https://"):
            if not base.sha256:
                raise FailedPreconditionError("a downloaded restore image must be pinned by SHA-256")
            target = self.ipsw_dir / f"{base.sha256}.ipsw"
            if not target.is_file():
                self._download(base, target, fetch or _urlretrieve)
            path = target
        else:
            path = Path(base.source)
            if not path.is_file():
                raise FailedPreconditionError(f"restore image {path} does not exist", details={"field": "image"})
        digest = sha256_file(path)
        if base.sha256 and digest != base.sha256:
            raise FailedPreconditionError(
                f"restore image {path} has SHA-256 {digest}, not the pinned {base.sha256}; remove it (a damaged or "
                "different download) or fix the pin",
                details={"field": "image", "expected": base.sha256, "actual": digest},
            )
        return path, digest

    def _download(self, base: ResolvedBase, target: Path, fetch: Callable[[str, Path], None]) -> None:
        self.ipsw_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".download-", dir=self.ipsw_dir)
        os.close(fd)
        try:
            fetch(base.source, Path(tmp))
            digest = sha256_file(Path(tmp))
            if digest != base.sha256:
                raise FailedPreconditionError(
                    f"the restore image downloaded from {base.source} has SHA-256 {digest}, not the pinned "
                    f"{base.sha256}; nothing was kept",
                    details={"expected": base.sha256, "actual": digest},
                )
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def clone_machine(
        self, base: InstalledBase, machine_dir: Path, identifier: bytes, *, clonefile: CloneFn | None = None
    ) -> dict[str, Path]:
        """Make a Machine's files from ``base``: disk and auxiliary storage cloned, a new machine identifier."""
        files = machine_files(machine_dir)
        clone_file(base.disk, files["disk.img"], clonefile=clonefile)
        clone_file(base.aux, files["aux.img"], clonefile=clonefile)
        shutil.copyfile(base.hardware_model, files["hardware-model.bin"])
        atomic_write(files["machine-identifier.bin"], identifier, 0o600)
        return files

    def remove_base(self, base_id: str) -> None:
        shutil.rmtree(self.bases_dir / base_id, ignore_errors=True)


def _urlretrieve(url: str, target: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(target, "wb") as out:
            shutil.copyfileobj(response, out, 8 << 20)
    except OSError as exc:
        raise UnavailableError(f"downloading {url} failed: {exc}") from None


def install_base(
    fw: Frameworks,
    dispatch: Callable[[Callable[[], None]], None],
    *,
    base_dir: Path,
    ipsw: Path,
    sha256: str,
    disk_bytes: int,
    host_macos: tuple[int, ...],
    progress: Callable[[str], None] = lambda _line: None,
) -> InstalledBase:
    """Install macOS from ``ipsw`` into ``base_dir`` (framework steps; the helper process runs this)."""
    vz, foundation = fw.vz, fw.foundation
    url = foundation.NSURL.fileURLWithPath_(str(ipsw))
    try:
        image = complete(
            dispatch,
            lambda h: vz.VZMacOSRestoreImage.loadFileURL_completionHandler_(url, h),
            "loading the restore image",
        )
    except ControlError as exc:
        raise FailedPreconditionError(str(exc)) from None
    requirements = image.mostFeaturefulSupportedConfiguration()
    if requirements is None:
        raise UnsupportedError(f"restore image {ipsw} (build {image.buildVersion()}) cannot be installed on this Mac")
    model = requirements.hardwareModel()
    if not model.isSupported():
        raise UnsupportedError(f"this Mac does not support the hardware model of restore image {ipsw}")
    base_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = Path(tempfile.mkdtemp(prefix=".install-", dir=base_dir.parent))
    try:
        (work / "hardware-model.bin").write_bytes(bytes(model.dataRepresentation()))
        identifier = vz.VZMacMachineIdentifier.alloc().init()
        (work / "machine-identifier.bin").write_bytes(bytes(identifier.dataRepresentation()))
        aux, error = vz.VZMacAuxiliaryStorage.alloc().initCreatingStorageAtURL_hardwareModel_options_error_(
            foundation.NSURL.fileURLWithPath_(str(work / "aux.img")), model, 0, None
        )
        if aux is None:
            raise UnavailableError(f"creating the auxiliary storage failed: {error}")
        with open(work / "disk.img", "wb") as disk:
            disk.truncate(disk_bytes)  # sparse: only what the installer writes takes space
        min_cpus = int(requirements.minimumSupportedCPUCount())
        min_memory = int(requirements.minimumSupportedMemorySize())
        cfg = vz.VZVirtualMachineConfiguration
        limits = Limits(
            int(cfg.minimumAllowedCPUCount()),
            int(cfg.maximumAllowedCPUCount()),
            int(cfg.minimumAllowedMemorySize()),
            int(cfg.maximumAllowedMemorySize()),
            min_cpus,
            min_memory,
        )
        request = VmRequest(
            cpus=0,
            memory_bytes=0,
            disk=str(work / "disk.img"),
            auxiliary_storage=str(work / "aux.img"),
            hardware_model=str(work / "hardware-model.bin"),
            machine_identifier=str(work / "machine-identifier.bin"),
            mac_address="",
        )
        plan = plan_vm(request, limits, host_macos=host_macos)
        config = Realizer(fw).configuration(_without_network(plan))

        def make() -> tuple[Any, Any]:  # the VM and its installer belong to the VM's queue, from their creation
            machine = vz.VZVirtualMachine.alloc().initWithConfiguration_(config)
            return machine, vz.VZMacOSInstaller.alloc().initWithVirtualMachine_restoreImageURL_(machine, url)

        vm, installer = on_queue(dispatch, make)
        progress(f"installing build {image.buildVersion()} into {base_dir}")
        try:
            complete(dispatch, installer.installWithCompletionHandler_, "installing macOS", limit=4 * 3600)
        except ControlError as exc:
            raise UnavailableError(str(exc)) from None
        with contextlib.suppress(ControlError):
            complete(dispatch, vm.stopWithCompletionHandler_, "stopping the installer VM")
        for name in ("disk.img", "aux.img", "hardware-model.bin"):
            os.replace(work / name, base_dir / name)
        marker = {"sha256": sha256, "build": str(image.buildVersion()), "min_cpus": min_cpus, "min_memory": min_memory}
        atomic_write(base_dir / "installed.json", json.dumps(marker, sort_keys=True).encode(), 0o600)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return InstalledBase(base_dir.name, base_dir, sha256, marker["build"], min_cpus, min_memory)  # type: ignore[arg-type]


def _without_network(plan: Any) -> Any:
    """The installer VM needs no network device (and no MAC address)."""
    from dataclasses import replace

    props = tuple((k, [] if k == "networkDevices" else v) for k, v in plan.configuration.props)
    return replace(plan, configuration=replace(plan.configuration, props=props))
