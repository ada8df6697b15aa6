"""The pytest plugin: options, one test per case with a marker per label, fixtures, and no cost when unused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vz_conformance import _catalogue


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A separate session in an empty directory, so this project's own configuration does not apply.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_label_marker_selects_cases_of_the_catalogue(tmp_path: Path) -> None:
    done = _pytest(
        tmp_path, "--pyargs", "vz_conformance.pytest_suite", "--vz-driver", "fake", "-m", "vz_lifecycle", "-rA"
    )
    assert done.returncode == 0, done.stdout[-3000:]
    lifecycle = len(_catalogue.select("in-process", ["lifecycle"]))
    assert f"{lifecycle} passed, {len(_catalogue.select('in-process')) - lifecycle} deselected" in done.stdout
    assert "PASSED ::test_vz_conformance[lifecycle.odd_ids]" in done.stdout


def test_not_applicable_cases_pass_and_say_why(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    done = _pytest(
        tmp_path,
        "--pyargs",
        "vz_conformance.pytest_suite",
        "--vz-driver",
        "fake",
        "-m",
        "vz_mounts",
        f"--junitxml={junit}",
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "5 passed" in done.stdout and "skipped" not in done.stdout
    xml = junit.read_text()
    assert 'name="vz_outcome" value="not-applicable (capabilities.mount_types.bind:' in xml


def test_a_failing_case_fails_with_the_check_text(tmp_path: Path) -> None:
    done = _pytest(
        tmp_path,
        "--pyargs",
        "vz_conformance.pytest_suite",
        "--vz-driver",
        "fake",
        "--vz-driver-option",
        "faults=stop-not-idempotent",
        "-m",
        "vz_lifecycle",
    )
    assert done.returncode == 1
    assert "1 failed, 9 passed" in done.stdout
    assert "Stop: expected success; got FAILED_PRECONDITION" in done.stdout


def test_plugin_mode_through_the_supervisor(tmp_path: Path) -> None:
    done = _pytest(
        tmp_path,
        "--pyargs",
        "vz_conformance.pytest_suite",
        "--vz-driver",
        "fake",
        "--vz-provider-mode",
        "external",
        "-m",
        "vz_discovery or vz_crash",
        "-k",
        "not mid_exec",
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "12 passed" in done.stdout


def test_without_a_driver_collection_stops_with_what_to_pass(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "--pyargs", "vz_conformance.pytest_suite")
    assert done.returncode == 2
    assert "need --vz-driver NAME or --vz-plugin PATH --vz-sha256 HEX" in done.stdout


def test_markers_and_options_are_registered(tmp_path: Path) -> None:
    markers = _pytest(tmp_path, "--markers")
    assert "@pytest.mark.vz_exec:" in markers.stdout and "@pytest.mark.vz_crash:" in markers.stdout
    helptext = _pytest(tmp_path, "--help")
    assert "--vz-plugin=PATH" in helptext.stdout and "--vz-sha256=HEX" in helptext.stdout


def test_adapter_hook_and_fixtures(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from vz_conformance.adapters import FakeAdapter\n"
        "SEEN = []\n"
        "class MyAdapter(FakeAdapter):\n"
        "    image = 'my-image'\n"
        "def pytest_vz_adapter(config, driver_name):\n"
        "    SEEN.append(driver_name)\n"
        "    return MyAdapter()\n"
    )
    (tmp_path / "test_mine.py").write_text(
        "import conftest\n"
        "async def test_machine(vz_driver, vz_machine, vz_adapter):\n"
        "    assert conftest.SEEN == ['fake'] and vz_adapter.image == 'my-image'\n"
        "    details = await vz_driver.find(vz_machine.workspace_id)\n"
        "    assert details is not None and details.state.status == 'running'\n"
    )
    done = _pytest(tmp_path, "test_mine.py", "--vz-driver", "fake", "-o", "asyncio_mode=auto")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 passed" in done.stdout


def test_loading_the_plugin_imports_nothing_of_the_suite() -> None:
    # Only the label list (a module without imports) for the markers; neither vz_core nor grpc.
    code = (
        "import sys, vz_conformance.pytest_plugin\n"
        "cheap = {'vz_conformance.pytest_plugin', 'vz_conformance._labels'}\n"
        "loaded = [m for m in sys.modules if m.startswith('vz_conformance.') and m not in cheap]\n"
        "loaded += [m for m in sys.modules if m.split('.')[0] in ('vz_core', 'grpc')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
