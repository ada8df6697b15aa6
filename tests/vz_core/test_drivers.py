"""Driver resolution and the `vz driver list | add | verify` library."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from vz_core.drivers import ManifestStore, add_manifest, builtin_manifest, list_drivers, remote_driver, resolve, verify
from vz_core.errors import NotFoundError, TrustError, UserError
from vz_core.trust import host_platform

TESTDRIVERS = Path(__file__).resolve().parents[1] / "vz_plugins" / "testdrivers.py"


def _plugin_dir(tmp_path: Path, name: str = "acme") -> tuple[Path, Path]:
    """A driver directory with an executable plugin script and its manifest."""
    driver_dir = tmp_path / name
    (driver_dir / "bin").mkdir(parents=True)
    script = driver_dir / "bin" / "plugin"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(TESTDRIVERS.parent)!r})\n"
        "import testdrivers\n"
        "testdrivers.main()\n"
    )
    script.chmod(0o755)
    manifest = {
        "name": name,
        "version": "2.1.0",
        "api_version": "1.3",
        "binaries": {
            host_platform(): {"path": "bin/plugin", "sha256": hashlib.sha256(script.read_bytes()).hexdigest()}
        },
        "args": ["mini"],
    }
    path = driver_dir / "manifest.json"
    path.write_text(json.dumps(manifest))
    return path, script


@pytest.fixture
def store(tmp_path: Path) -> ManifestStore:
    return ManifestStore(tmp_path / "state" / "driver-manifests")


def test_builtin_drivers_are_listed_and_resolve(store: ManifestStore) -> None:
    rows = list_drivers(store=store)
    fake = next(r for r in rows if r["name"] == "fake")
    assert fake["origin"] == "builtin" and fake["plugin_command"] == ["vz-driver-fake"]
    resolved = resolve("fake", store=store)
    assert resolved.builtin is not None and resolved.external is None
    spec = resolved.launch_spec({"state_dir": "/x"})()
    assert spec.argv == [sys.executable, "-m", "vz_core.registry", "fake"]
    assert json.loads(spec.env["VZ_DRIVER_OPTIONS"]) == {"state_dir": "/x"}
    assert verify("fake", store=store) == [
        {
            "name": "fake",
            "origin": "builtin",
            "ok": True,
            "detail": "part of this vz installation (runs with this interpreter); not checksummed",
        }
    ]


def test_unknown_names_list_what_exists(store: ManifestStore) -> None:
    with pytest.raises(NotFoundError, match=r"unknown driver 'nope'; built-in: .*fake.*; external: none"):
        resolve("nope", store=store)
    with pytest.raises(NotFoundError):
        verify("nope", store=store)


async def test_add_records_a_verified_manifest_and_the_driver_runs_from_it(
    tmp_path: Path, store: ManifestStore
) -> None:
    manifest, _ = _plugin_dir(tmp_path)
    row = add_manifest(manifest, store=store)
    assert row["status"] == "added" and row["name"] == "acme" and row["origin"] == "external"
    assert row["binary"].endswith("/acme/bin/plugin") and len(row["sha256"]) == 64
    assert any(r["name"] == "acme" and r["version"] == "2.1.0" for r in list_drivers(store=store))
    assert verify("acme", store=store)[0]["ok"] is True
    assert add_manifest(manifest, store=store)["status"] == "updated"
    driver = remote_driver("acme", store=store)
    try:
        info = await driver.info()
        assert info.driver_name == "mini"
    finally:
        await driver.close()


async def test_a_binary_changed_after_add_is_refused_at_verify_and_launch(tmp_path: Path, store: ManifestStore) -> None:
    manifest, script = _plugin_dir(tmp_path)
    add_manifest(manifest, store=store)
    script.write_text(script.read_text() + "# tampered\n")
    result = verify("acme", store=store)[0]
    assert result["ok"] is False and "SHA-256 mismatch" in result["detail"] and result["actual"] != result["expected"]
    driver = remote_driver("acme", store=store)
    try:
        with pytest.raises(TrustError, match="SHA-256 mismatch"):
            await driver.info()
        assert driver.connection is None
    finally:
        await driver.close()


def _rewrite(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "error", "fragment"),
    [
        pytest.param({"sha256": "0" * 64}, TrustError, "SHA-256 mismatch", id="mismatch"),
        pytest.param({"sha256": None}, TrustError, "sha256: missing", id="missing-checksum"),
        pytest.param({"sha256": "abc"}, TrustError, "64 hexadecimal digits", id="malformed-checksum"),
        pytest.param({"path": "bin/absent"}, TrustError, "does not exist", id="missing-binary"),
    ],
)
def test_bad_manifests_are_not_recorded(
    tmp_path: Path, store: ManifestStore, change: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    manifest, _ = _plugin_dir(tmp_path)
    data = json.loads(manifest.read_text())
    entry = data["binaries"][host_platform()]
    for key, value in change.items():
        if value is None:
            entry.pop(key)
        else:
            entry[key] = value
    manifest.write_text(json.dumps(data))
    with pytest.raises(error, match=fragment):
        add_manifest(manifest, store=store)
    assert store.names() == []


def test_a_manifest_may_not_take_a_builtin_name(tmp_path: Path, store: ManifestStore) -> None:
    manifest, _ = _plugin_dir(tmp_path, "fake")
    with pytest.raises(UserError, match="belongs to a built-in driver"):
        add_manifest(manifest, store=store)


async def test_a_builtin_console_script_runs_through_the_checksummed_path(tmp_path: Path, store: ManifestStore) -> None:
    path = tmp_path / "fake.json"
    written = builtin_manifest("fake", path)
    assert written["binaries"][host_platform()]["path"].endswith("/vz-driver-fake")
    _rewrite(path, name="fake-pinned", args=["--state-dir", str(tmp_path / "state")])
    add_manifest(path, store=store)
    driver = remote_driver("fake-pinned", store=store)
    try:
        assert (await driver.info()).driver_name == "fake"
    finally:
        await driver.close()


def test_a_damaged_record_is_reported_not_trusted(store: ManifestStore) -> None:
    store.root.mkdir(parents=True)
    (store.root / "broken.json").write_text('{"manifest": {}}')
    with pytest.raises(TrustError, match=r"record of driver 'broken' .* is unreadable"):
        resolve("broken", store=store)
