"""linux_native served as a plugin: Machines outlive the plugin process and a relaunched plugin finds them."""

from __future__ import annotations

from pathlib import Path

import pytest
from machine_testlib import check_machines_outlive_the_plugin

from vz_drivers.linux_native.registration import build_parser

pytestmark = pytest.mark.root


def test_plugin_command_line_names_every_option() -> None:
    text = build_parser().format_help()
    for option in ("--state-dir", "--image-dir", "--option"):
        assert option in text


async def test_machines_outlive_the_plugin_and_a_relaunched_plugin_finds_them(
    tmp_path: Path, state_dir: Path, image_dir: Path, agent_binary: str
) -> None:
    await check_machines_outlive_the_plugin(tmp_path, "linux_native", state_dir, image_dir, agent_binary)
