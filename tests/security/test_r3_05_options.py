"""#26 item 5 (and #27 item 1): every project option value is checked, with bounds, before anything launches;
no plugin traceback ever reaches the user.

Black box, through the real ``vz`` console script and its daemon, each test with its own ``VZ_HOME``: for every
project-scoped option of every built-in driver, bad values (negative, zero where the bound is open, ``"inf"``,
``"nan"``, ``1e308``, the wrong type) and an unknown key make ``vz up`` and ``vz up --dry-run`` exit 2 with one
line naming the vz.json path of the value, before any plugin process is started (the daemon's log records every
launch) and before anything is recorded. The host configuration is checked the same way, and a plugin that
fails with an unexpected exception is reported in one line, its traceback only in the plugin's log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_core" / "cli"))
from vzcli import Vz, add_test_driver, fake_machine, write_project

PLUGINS = Path(__file__).resolve().parent / "plugins_options"

NUMBERS: list[Any] = [-1, "inf", "nan", "-inf", 1e308, "1e999", "soon", True]
"""Refused by every duration (stop_timeout, boot_timeout; each has an open lower bound: 0 too) and int option."""

BAD: dict[str, dict[str, list[Any]]] = {
    "fake": {"faults": [5, True]},
    "qemu": {
        "stop_timeout": [*NUMBERS, 0, 3601],
        "boot_timeout": [*NUMBERS, 0],
        "sessions": [*NUMBERS, 0, 8, 2.5, "3.5"],
        "accelerator": ["hvf", 1, True],
        "insecure_registries": [5, False],
    },
    "linux_native": {"stop_timeout": [*NUMBERS, 0, 86400], "insecure_registries": [5]},
    "vfkit": {
        "stop_timeout": [*NUMBERS, 0],
        "boot_timeout": [*NUMBERS, 0],
        "rosetta": ["maybe", 1],
        "insecure_registries": [5],
    },
    "hyperv": {"stop_timeout": [*NUMBERS, 0], "boot_timeout": [*NUMBERS, 0], "insecure_registries": [True]},
    "macos_vm": {"stop_timeout": [*NUMBERS, 0], "boot_timeout": [*NUMBERS, 0], "stop_mode": ["hibernate", 0]},
}


def _launches(vz: Vz) -> list[str]:
    log = vz.home / "daemon" / "daemon.log"
    if not log.exists():
        return []
    return [line for line in log.read_text(errors="replace").splitlines() if "plugin launched" in line]


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text and 'File "' not in text, text


def _refused(vz: Vz, proj: Path, key: str, shown: str, says: str = "must be") -> None:
    for args in (("up", "--dry-run"), ("up",)):
        proc = vz.run(*args, cwd=proj)
        err, out = proc.stderr.decode(), proc.stdout.decode()
        _no_traceback(err + out)
        assert proc.returncode == 2, f"vz {' '.join(args)} with {key}={shown}: exit {proc.returncode}: {err}"
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, f"vz {' '.join(args)} with {key}={shown}: not one line: {err}"
        assert "$.machines[0].driver_options" + (f".{key}" if key else ":") in lines[0], lines[0]
        assert says in lines[0], lines[0]


@pytest.fixture
def vz(tmp_path: Path) -> Vz:
    return Vz(tmp_path / "home")


def test_the_cases_cover_every_project_option_of_every_built_in_driver() -> None:
    from vz_core.registry import DriverRegistry

    registry = DriverRegistry(distribution="vz")
    assert sorted(BAD) == registry.names()
    for name in registry.names():
        assert sorted(BAD[name]) == registry.get(name).option_names("project"), name


@pytest.mark.parametrize("driver", sorted(BAD))
def test_bad_values_are_refused_naming_the_vzjson_path_before_any_plugin_starts(
    vz: Vz, tmp_path: Path, driver: str
) -> None:
    number = 0
    for key, values in BAD[driver].items():
        for value in values:
            number += 1
            machine = fake_machine("web", driver=driver, driver_options={key: value})
            proj = write_project(tmp_path / f"p{number}", machine)
            _refused(vz, proj, key, json.dumps(value))
    proj = write_project(tmp_path / "unknown", fake_machine("web", driver=driver, driver_options={"no_such": 1}))
    _refused(vz, proj, "", "no_such", says=f"unknown {driver} option(s): no_such; valid options:")
    assert _launches(vz) == [], "a plugin was started for a refused vz.json"
    vz.assert_recorded_nothing()


def test_the_error_says_what_the_value_must_be_and_what_to_do(vz: Vz, tmp_path: Path) -> None:
    proj = write_project(tmp_path / "p", fake_machine("web", driver="qemu", driver_options={"stop_timeout": -1}))
    err = vz.fails(2, "up", "--dry-run", cwd=proj)
    assert "$.machines[0].driver_options.stop_timeout: must be a number of seconds in (0, 3600], got -1" in err
    assert "correct it in vz.json, or remove it to use the default (10)" in err
    proj = write_project(tmp_path / "q", fake_machine("web", driver="qemu", driver_options={"boot_timeout": "nan"}))
    assert 'boot_timeout: must be a number of seconds in (0, 3600], got "nan"' in vz.fails(2, "up", cwd=proj)
    assert _launches(vz) == []
    vz.assert_recorded_nothing()


def test_good_values_still_pass_and_numbers_may_be_text(vz: Vz, tmp_path: Path) -> None:
    machine = fake_machine("web", driver="qemu", driver_options={"stop_timeout": 2.5, "boot_timeout": "600"})
    proj = write_project(tmp_path / "p", machine)
    out = vz.ok("up", "--dry-run", cwd=proj)
    assert "dry run: nothing was changed" in out


def test_a_bad_host_configuration_value_is_refused_naming_its_file(vz: Vz, tmp_path: Path) -> None:
    proj = write_project(tmp_path / "p", fake_machine("web", driver="qemu"))
    err = vz.fails(2, "driver", "configure", "qemu", "stop_timeout=inf", cwd=proj)
    assert "stop_timeout: must be a number of seconds in (0, 3600]" in err
    config = vz.home / "config" / "drivers.json"
    assert not config.exists() or "inf" not in config.read_text()
    # A file written by hand (or by an older vz) is checked at `vz up`, before any plugin starts.
    config.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    config.write_text(json.dumps({"qemu": {"boot_timeout": -5}}))
    for args in (("up", "--dry-run"), ("up",)):
        err = vz.fails(2, *args, cwd=proj)
        _no_traceback(err)
        assert f"{config}: qemu.boot_timeout: must be a number of seconds in (0, 3600], got -5" in err, err
        assert "vz driver configure qemu --unset boot_timeout" in err
    assert _launches(vz) == []


def test_a_plugin_that_crashes_is_one_line_and_its_traceback_stays_in_its_log(vz: Vz, tmp_path: Path) -> None:
    proj = write_project(tmp_path / "p", fake_machine("web", driver="crashing"))
    add_test_driver(vz, "crashing", cwd=proj, plugins=PLUGINS, module="vz_sec_crashing", declared="sec_crashing")
    proc = vz.run("up", "--dry-run", cwd=proj)
    err = proc.stderr.decode() + proc.stdout.decode()
    assert proc.returncode != 0
    _no_traceback(err)
    assert "internal error in the plugin: KeyError: 'missing'" in err
    assert "/srv/plugin/internals" not in err and "crashing_factory" not in err
    log = (vz.home / "daemon" / "daemon.log").read_text(errors="replace")
    assert "Traceback (most recent call last):" in log and "crashing_factory" in log  # the plugin's log has it
