"""linux_native served as a plugin: Machines outlive the plugin process and a relaunched plugin finds them."""

from __future__ import annotations

from pathlib import Path

import pytest
from machine_testlib import check_machines_outlive_the_plugin

from vz_core import Driver
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


async def test_services_are_supervised_by_the_agent_and_outlive_the_plugin(
    tmp_path: Path, state_dir: Path, image_dir: Path, agent_binary: str
) -> None:
    from machine_testlib import plugin_driver, request
    from services_testlib import check_services

    from vz_drivers.linux_native import cleanup_state

    def make() -> Driver:
        return plugin_driver(tmp_path, "linux_native", state_dir, image_dir, agent_binary)

    creator = make()
    try:
        await creator.run_image(request("services-machine"))
        ext = await creator.extensions()
        assert ext is not None and ext.services
        await check_services(make, "services-machine", "ln")
    finally:
        await creator.close()
        await cleanup_state(str(state_dir), image_dir=str(image_dir), agent_binary=agent_binary)
