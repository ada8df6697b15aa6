"""qemu's registration and plugin: cheap to register, and VMs outlive the plugin process that made them."""

from __future__ import annotations

from pathlib import Path

import pytest
from machine_testlib import check_machines_outlive_the_plugin
from qemu_testlib import qemu_processes

import vz_drivers.qemu as package
from vz_core.registry import DriverRegistry
from vz_drivers.qemu import registration
from vz_drivers.qemu.registration import build_parser


def test_public_names_resolve() -> None:
    assert sorted(package.__all__) == ["DRIVER_NAME", "QemuDriver", "cleanup_state"]
    for name in package.__all__:
        assert getattr(package, name) is not None


def test_registered_under_its_name_with_a_plugin_command() -> None:
    registry = DriverRegistry(load_entry_points=False)
    registry.register(registration)
    spec = registry.get("qemu")
    assert spec.plugin_command == ("vz-driver-qemu",)
    assert spec.load() is package.QemuDriver
    for option in ("accelerator", "kernel", "qemu", "state_dir", "sessions"):
        assert option in spec.options


def test_plugin_command_line_names_every_option() -> None:
    text = build_parser().format_help()
    for option in ("--state-dir", "--image-dir", "--option", "accelerator"):
        assert option in text


@pytest.mark.slow
async def test_vms_outlive_the_plugin_and_a_relaunched_plugin_reattaches(
    tmp_path: Path, state_dir: Path, image_dir: Path, agent_binary: str
) -> None:
    def one_vm_runs() -> None:
        assert len(qemu_processes(state_dir)) == 1

    await check_machines_outlive_the_plugin(
        tmp_path, "qemu", state_dir, image_dir, agent_binary, while_detached=one_vm_runs
    )
