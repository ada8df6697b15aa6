"""Installing a base (the framework steps the helper runs), against the stand-in framework object model."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from macos_fakes import FakeFoundation, FakeFramework, FakeObject, QueueThread

from vz_core.errors import UnavailableError, UnsupportedError
from vz_drivers.macos_vm._install import BaseStore, install_base
from vz_drivers.macos_vm._realize import Frameworks

DISK = 40 * 1024**3


def _install(
    tmp_path: Path, fw: FakeFramework, dispatch: Callable[[Callable[[], None]], None] = lambda fn: fn()
) -> object:
    ipsw = tmp_path / "Restore.ipsw"
    ipsw.write_bytes(b"ipsw")
    return install_base(
        Frameworks(fw, FakeFoundation),
        dispatch,
        base_dir=tmp_path / "bases" / "macos-14.5-23F79",
        ipsw=ipsw,
        sha256="ab" * 32,
        disk_bytes=DISK,
        host_macos=(14, 5),
    )


def test_install_persists_what_each_machine_is_made_from(tmp_path: Path) -> None:
    fw = FakeFramework()
    base = _install(tmp_path, fw)
    root = tmp_path / "bases" / "macos-14.5-23F79"
    assert fw.loaded == [("file-url", str(tmp_path / "Restore.ipsw"))]
    assert sorted(p.name for p in root.iterdir()) == ["aux.img", "disk.img", "hardware-model.bin", "installed.json"]
    assert (root / "disk.img").stat().st_size == DISK
    assert (root / "disk.img").stat().st_blocks * 512 < 1024 * 1024  # sparse until the installer writes
    assert (root / "hardware-model.bin").read_bytes() == b"hw-model"
    assert json.loads((root / "installed.json").read_text()) == {
        "build": "23F79",
        "min_cpus": 2,
        "min_memory": 4 << 30,
        "sha256": "ab" * 32,
    }
    assert [p.name for p in (tmp_path / "bases").iterdir()] == ["macos-14.5-23F79"]  # no work directory left
    installed = BaseStore(tmp_path).installed("macos-14.5-23F79")
    assert installed == base and installed is not None and not installed.provisioned
    [installer] = [o for o in fw.made if o.cls == "VZMacOSInstaller"]
    vm, url = installer.args
    assert isinstance(vm, FakeObject) and vm.cls == "VZVirtualMachine"
    assert url == ("file-url", str(tmp_path / "Restore.ipsw"))
    (config,) = vm.args
    assert config.props["NetworkDevices"] == [] and config.props["CPUCount"] == 4
    assert ("VZMacOSInstaller", "installWithCompletionHandler_") in fw.completed
    [aux] = [o for o in fw.made if o.made_by == "initCreatingStorageAtURL_hardwareModel_options_error_"]
    assert aux.args[2] == 0 and aux.args[3] is None


def test_a_failed_installation_leaves_no_base(tmp_path: Path) -> None:
    fw = FakeFramework()
    fw.fail["installWithCompletionHandler_"] = "the restore image is damaged"
    with pytest.raises(UnavailableError, match="installing macOS failed: the restore image is damaged"):
        _install(tmp_path, fw)
    root = tmp_path / "bases" / "macos-14.5-23F79"
    assert list(root.iterdir()) == []
    assert [p.name for p in (tmp_path / "bases").iterdir()] == ["macos-14.5-23F79"]
    assert BaseStore(tmp_path).installed("macos-14.5-23F79") is None


@pytest.mark.parametrize(
    ("attribute", "text"),
    [("installable", "cannot be installed on this Mac"), ("hardware_supported", "does not support the hardware model")],
)
def test_images_this_mac_cannot_run_are_refused_before_any_file(tmp_path: Path, attribute: str, text: str) -> None:
    fw = FakeFramework()
    setattr(fw, attribute, False)
    with pytest.raises(UnsupportedError, match=text):
        _install(tmp_path, fw)
    assert not (tmp_path / "bases").exists()


def test_the_vm_and_its_installer_are_made_and_driven_on_the_vm_queue(tmp_path: Path) -> None:
    """The helper runs install_base in a worker thread and the main queue elsewhere (``_helper._install``); the
    stand-in refuses a VZVirtualMachine or VZMacOSInstaller touched off that queue, as Apple requires."""
    fw = FakeFramework()
    queue = QueueThread()
    fw.queue = queue
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(_install(tmp_path, fw, queue.dispatch)), name="install")
    try:
        worker.start()
        worker.join(30)
    finally:
        queue.close()
    assert fw.off_queue == []
    assert outcome and outcome[0] is not None
    assert ("VZMacOSInstaller", "installWithCompletionHandler_") in fw.completed
    assert {o.cls for o in fw.made} >= {"VZVirtualMachine", "VZMacOSInstaller"}


def test_the_stand_in_refuses_a_vm_made_off_its_queue() -> None:
    fw = FakeFramework()
    queue = QueueThread()
    fw.queue = queue
    try:
        with pytest.raises(RuntimeError, match=r"VZVirtualMachine\.initWithConfiguration_ called off the VM.s queue"):
            fw.VZVirtualMachine.alloc().initWithConfiguration_(object())
    finally:
        queue.close()
