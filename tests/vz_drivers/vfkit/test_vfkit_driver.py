"""The vfkit driver on this (Linux) host: Info answers, Preflight and every Machine operation say why not."""

from __future__ import annotations

import platform
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from vz_core import ExecSpec, MountType, RunImageRequest
from vz_core.errors import InvalidArgumentError, NotFoundError, UnsupportedError
from vz_drivers.vfkit import DRIVER_NAME, VfkitDriver
from vz_drivers.vfkit._host import NOT_MACOS, host_support

pytestmark = pytest.mark.skipif(platform.system() == "Darwin", reason="these tests describe a host that is not macOS")

REASON = NOT_MACOS.format(system=platform.system())


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""


async def test_info_answers_without_vfkit(tmp_path: Path) -> None:
    info = await VfkitDriver(state_dir=str(tmp_path / "s")).info()
    assert (info.driver_name, info.runtime_name, info.runtime_version) == (DRIVER_NAME, "vfkit", "")
    assert info.capabilities is not None and MountType.BIND in info.capabilities.mount_types
    assert not (tmp_path / "s").exists()  # side-effect free


async def test_extensions_say_dev_and_why(tmp_path: Path) -> None:
    ext = await VfkitDriver(state_dir=str(tmp_path / "s")).extensions()
    assert ext is not None and ext.target_os == ("linux",)
    assert ext.facts["status"].startswith("DEV")
    assert ext.facts["host_supported"] == f"no: {REASON}"
    assert ext.accelerator_reason == REASON


async def test_preflight_is_unsupported_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError) as info:
        await VfkitDriver(state_dir=str(tmp_path / "s")).preflight()
    assert info.value.message == REASON
    assert "Virtualization.framework" in REASON and platform.system() in REASON


async def test_machine_operations_fail_before_any_mutation(tmp_path: Path) -> None:
    state = tmp_path / "s"
    driver = VfkitDriver(state_dir=str(state))
    request = RunImageRequest(workspace_id="w/../x y", image="busybox")
    for call in (driver.run_image(request), driver.provisioning_preflight()):
        with pytest.raises(UnsupportedError, match=r"Virtualization\.framework"):
            await call
    # A Machine that was never created is simply not there (status works on every host).
    for call in (driver.start("w"), driver.stop("w"), driver.reuse_preflight("w", "root")):
        with pytest.raises(NotFoundError):
            await call
    with pytest.raises(NotFoundError):
        async for _ in driver.exec(ExecSpec(workspace_id="w", argv=("true",)), _nothing()):
            pass
    assert await driver.find("w") is None
    await driver.delete("w")  # a missing Machine: success
    assert await driver.target_architecture("w") in ("amd64", "arm64")
    assert not state.exists()


async def test_request_conventions_hold_here_too(tmp_path: Path) -> None:
    driver = VfkitDriver(state_dir=str(tmp_path / "s"))
    with pytest.raises(InvalidArgumentError):
        await driver.find("")


@pytest.mark.parametrize(
    ("options", "culprit"),
    [
        ({"bogus": "1"}, "unknown vfkit option"),
        ({"rosetta": "maybe"}, "rosetta"),
        ({"nested": "sometimes"}, "nested"),
        ({"boot_timeout": "0"}, "boot_timeout"),
        ({"stop_timeout": "soon"}, "stop_timeout"),
        ({"guest": "bundle"}, "absolute path of a guest bundle"),
        ({"guest_sha256": "xyz"}, "guest_sha256"),
        ({"vfkit": "vfkit"}, "absolute"),
        ({"vfkit_sha256": "xyz"}, "64 hex"),
    ],
)
def test_options_are_checked_once(tmp_path: Path, options: dict[str, str], culprit: str) -> None:
    with pytest.raises(InvalidArgumentError, match=culprit):
        VfkitDriver(state_dir=str(tmp_path / "s"), **options)


def test_host_support_decision() -> None:
    linux = host_support("Linux")
    assert not linux.supported and linux.reason == NOT_MACOS.format(system="Linux")
    assert not linux.rosetta and not linux.nested
    windows = host_support("Windows")
    assert "this host is Windows" in windows.reason
