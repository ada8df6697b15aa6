"""linux_native served as a plugin: Machines outlive the plugin process and a relaunched plugin finds them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from machine_testlib import request, run

from vz_core import Driver
from vz_core.remote import RemoteDriver
from vz_core.transport._launcher import LaunchSpec, PluginLauncher
from vz_drivers.linux_native import cleanup_state
from vz_drivers.linux_native.plugin import build_parser

pytestmark = pytest.mark.root


def _plugin(tmp_path: Path, state_dir: Path, image_dir: Path, agent_binary: str) -> Driver:
    script = tmp_path / "vz-driver-linux-native"
    script.write_text(f"#!{sys.executable}\nfrom vz_drivers.linux_native.plugin import main\nmain()\n")
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
    return RemoteDriver(PluginLauncher(lambda: LaunchSpec("linux_native", argv), name="linux_native"))


def test_plugin_command_line_names_every_option() -> None:
    text = build_parser().format_help()
    for option in ("--state-dir", "--image-dir", "--option"):
        assert option in text


async def test_machines_outlive_the_plugin_and_a_relaunched_plugin_finds_them(
    tmp_path: Path, state_dir: Path, image_dir: Path, agent_binary: str
) -> None:
    first = _plugin(tmp_path, state_dir, image_dir, agent_binary)
    try:
        info = await first.info()
        assert info.driver_name == "linux_native"
        await first.run_image(request("plugin-machine"))
        result = await run(first, "plugin-machine", "sh", "-c", "echo out; echo err >&2; exit 3")
        assert (result.stdout, result.stderr, result.exit.exit_code) == (b"out\n", b"err\n", 3)
        before = await first.find("plugin-machine")
        await first.close()  # the plugin process exits; the Machine keeps running
        second = _plugin(tmp_path, state_dir, image_dir, agent_binary)
        try:
            assert await second.find("plugin-machine") == before
            assert before is not None and before.state.status == "running"
            assert (await run(second, "plugin-machine", "true")).exit.success
            await second.delete("plugin-machine")
            assert await second.find("plugin-machine") is None
        finally:
            await second.close()
    finally:
        await first.close()
        await cleanup_state(str(state_dir), image_dir=str(image_dir), agent_binary=agent_binary)
