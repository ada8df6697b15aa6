"""vfkit's declaration: valid, DEV in the matrix, and in step with the options the driver takes."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from vz_core.errors import UnsupportedError
from vz_drivers.vfkit._backend import VfkitBackend
from vz_drivers.vfkit.registration import DECLARATION, vz_builtin_drivers


def test_the_declaration_is_valid_and_dev() -> None:
    assert DECLARATION.problems() == []
    assert vz_builtin_drivers() == [DECLARATION]
    assert [(r.host_os, r.target_os, r.status) for r in DECLARATION.matrix] == [("darwin", "linux", "DEV")]
    assert "not verified on a Mac" in DECLARATION.matrix[0].note


def test_the_backend_reads_typed_options_built_from_the_declaration(tmp_path: Path) -> None:
    backend = VfkitBackend(state_dir=str(tmp_path / "s"), nested="on", stop_timeout="5", rosetta="off")
    assert set(backend.options) == set(DECLARATION.declared_options)
    assert backend.options.nested is True and backend.options.rosetta == "off"
    assert (backend.stop_timeout, backend.boot_timeout) == (5.0, DECLARATION.declared_options["boot_timeout"].default)
    host_only = set(DECLARATION.option_names("host"))
    assert {"vfkit", "vfkit_sha256", "guest", "guest_sha256", "state_dir", "nested"} <= host_only


@pytest.mark.skipif(platform.system() == "Darwin", reason="describes a host that is not macOS")
async def test_the_declared_factory_builds_the_driver(tmp_path: Path) -> None:
    driver = DECLARATION.create(state_dir=str(tmp_path / "s"), rosetta="off", stop_timeout=5.0)
    assert (await driver.info()).driver_name == "vfkit"
    with pytest.raises(UnsupportedError):
        await driver.preflight()


def test_the_plugin_command_line_is_generated() -> None:
    from vz_drivers.vfkit.registration import build_parser

    help_text = build_parser().format_help()
    for flag in ("--vfkit", "--vfkit-sha256", "--guest", "--guest-sha256", "--rosetta", "--nested", "--boot-timeout"):
        assert flag in help_text


def test_registered_it_is_dev_in_the_matrix_on_macos() -> None:
    import vz_drivers.vfkit.registration as registration
    from vz_core.capability_matrix import entries, lookup
    from vz_core.registry import DriverRegistry

    registry = DriverRegistry(load_entry_points=False)
    registry.register(registration, "vfkit")
    rows = [e for e in entries(registry) if e.driver == "vfkit"]
    assert [(e.host_os, e.target_os, e.status) for e in rows] == [("darwin", "linux", "DEV")]
    found = lookup("vfkit", "darwin", registry=registry)
    assert found is not None and found.status == "DEV"


@pytest.mark.skipif(platform.system() == "Darwin", reason="describes a host that is not macOS")
async def test_over_the_runtime_protocol_info_answers_and_preflight_is_unimplemented(tmp_path: Path) -> None:
    from vz_core.rpc import connect_in_process

    driver = DECLARATION.create(state_dir=str(tmp_path / "s"))
    async with connect_in_process(driver) as remote:
        info = await remote.info()
        assert (info.driver_name, info.runtime_name) == ("vfkit", "vfkit")
        with pytest.raises(UnsupportedError, match=r"needs macOS .* this host is Linux"):
            await remote.preflight()
        assert await remote.find("never created") is None


@pytest.mark.skipif(platform.system() == "Darwin", reason="describes a host that is not macOS")
async def test_listed_and_served_as_its_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vz driver list` and status through the one door: the real plugin process, launched under supervision."""
    import os
    import sys

    import vz_drivers.vfkit.registration as registration
    from vz_core.drivers import list_drivers, remote_driver
    from vz_core.registry import DriverRegistry

    # The console script pyproject.toml will declare, stood up on PATH for this test.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "vz-driver-vfkit"
    script.write_text(f"#!{sys.executable}\nfrom vz_drivers.vfkit.registration import main\nmain()\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    registry = DriverRegistry(load_entry_points=False)
    registry.register(registration, "vfkit")
    (row,) = [r for r in list_drivers(registry=registry) if r["name"] == "vfkit"]
    assert (row["origin"], row["targets"], row["plugin_command"]) == ("builtin", ["linux"], ["vz-driver-vfkit"])

    remote = remote_driver("vfkit", options={"state_dir": str(tmp_path / "s")}, registry=registry)
    try:
        info = await remote.info()
        assert (info.driver_name, info.runtime_name, info.runtime_version) == ("vfkit", "vfkit", "")
        ext = await remote.extensions()
        assert ext is not None and ext.facts["status"].startswith("DEV")
        with pytest.raises(UnsupportedError, match=r"this host is Linux"):
            await remote.preflight()
        assert await remote.find("w") is None
    finally:
        await remote.close()
    assert not (tmp_path / "s").exists()
