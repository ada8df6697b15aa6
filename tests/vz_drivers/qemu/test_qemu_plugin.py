"""qemu's registration and plugin: cheap to register, and VMs outlive the plugin process that made them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from machine_testlib import run
from qemu_testlib import qemu_processes

import vz_drivers.qemu as package
from vz_core import Driver, RunImageRequest
from vz_core.registry import DriverRegistry
from vz_core.remote import RemoteDriver
from vz_core.transport._launcher import LaunchSpec, PluginLauncher
from vz_drivers.qemu import cleanup_state, registration
from vz_drivers.qemu.plugin import build_parser


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


def _plugin(tmp_path: Path, state_dir: Path, image_dir: Path, agent_binary: str) -> Driver:
    script = tmp_path / "vz-driver-qemu"
    script.write_text(f"#!{sys.executable}\nfrom vz_drivers.qemu.plugin import main\nmain()\n")
    script.chmod(0o755)
    argv = [
        str(script),
        "--state-dir",
        str(state_dir),
        "--image-dir",
        str(image_dir),
        "--option",
        f"agent_binary={agent_binary}",
    ]
    return RemoteDriver(PluginLauncher(lambda: LaunchSpec("qemu", argv), name="qemu"))


@pytest.mark.slow
async def test_vms_outlive_the_plugin_and_a_relaunched_plugin_reattaches(
    tmp_path: Path, state_dir: Path, image_dir: Path, agent_binary: str
) -> None:
    first = _plugin(tmp_path, state_dir, image_dir, agent_binary)
    try:
        info = await first.info()
        assert info.driver_name == "qemu" and info.runtime_name == "qemu"
        await first.run_image(RunImageRequest(workspace_id="plugin-vm", image="vz:default"))
        result = await run(first, "plugin-vm", "sh", "-c", "echo out; echo err >&2; echo kept > /var/tmp/f; exit 3")
        assert (result.stdout, result.stderr, result.exit and result.exit.exit_code) == (b"out\n", b"err\n", 3)
        before = await first.find("plugin-vm")
        await first.close()  # the plugin process exits; the VM keeps running
        assert len(qemu_processes(state_dir)) == 1
        second = _plugin(tmp_path, state_dir, image_dir, agent_binary)
        try:
            assert await second.find("plugin-vm") == before
            assert before is not None and before.state.status == "running"
            assert (await run(second, "plugin-vm", "cat", "/var/tmp/f")).stdout == b"kept\n"
            await second.delete("plugin-vm")
            assert await second.find("plugin-vm") is None
        finally:
            await second.close()
    finally:
        await first.close()
        await cleanup_state(str(state_dir), image_dir=str(image_dir), agent_binary=agent_binary)
    assert qemu_processes(state_dir) == []
