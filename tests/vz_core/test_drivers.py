"""Driver resolution and the `vz driver list | add | verify` library."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vz_core.drivers import (
    PLUGIN_MAIN,
    HostConfig,
    ManifestStore,
    add_manifest,
    builtin_manifest,
    configure,
    effective_options,
    host_config_path,
    list_drivers,
    open_driver,
    pin_builtin,
    remote_driver,
    resolve,
    validate_project_options,
    verify,
)
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
    assert spec.argv == [
        sys.executable,
        "-c",
        PLUGIN_MAIN,
        "--module",
        "vz_conformance.fake.registration",
        "fake",
    ]
    assert json.loads(spec.env["VZ_DRIVER_OPTIONS"]) == {"state_dir": "/x"}
    script = Path(sys.executable).parent / "vz-driver-fake"
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    assert verify("fake", store=store) == [
        {
            "name": "fake",
            "origin": "builtin",
            "ok": True,
            "binary": str(script),
            "expected": digest,
            "actual": digest,
            "detail": "console script matches the hash its installation recorded",
        }
    ]


def test_a_builtin_pinned_to_its_console_script_is_verified_at_every_launch(tmp_path: Path) -> None:
    scripts = tmp_path / "bin"
    scripts.mkdir()
    script = scripts / "vz-driver-fake"
    original = (Path(sys.executable).parent / "vz-driver-fake").read_bytes()
    script.write_bytes(original)
    script.chmod(0o755)
    resolved = pin_builtin("fake", scripts_dir=scripts)
    assert resolved.pinned is not None and resolved.pinned.anchor == "pinned"
    prepare = resolved.launch_spec({"state_dir": "/x"})
    spec = prepare()
    assert spec.binary is not None
    try:
        assert spec.argv == [str(script)] and spec.binary.sha256 == resolved.pinned.sha256
        assert json.loads(spec.env["VZ_DRIVER_OPTIONS"]) == {"state_dir": "/x"}
    finally:
        spec.binary.close()
    script.write_bytes(original + b"#\n")
    refused = r"built-in driver 'fake': refusing to launch its console script .*SHA-256 mismatch"
    with pytest.raises(TrustError, match=refused):
        prepare()
    script.unlink()
    with pytest.raises(TrustError, match="does not exist"):
        prepare()


def test_a_console_script_differing_from_its_installation_record_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vz_core.drivers import _pinning

    monkeypatch.setattr(_pinning, "_installed_hash", lambda script, module: "0" * 64)
    with pytest.raises(TrustError, match="modified after installation; reinstall vz"):
        pin_builtin("fake")
    row = verify("fake")[0]
    assert row["ok"] is False and "modified after installation" in row["detail"]


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
    faults = written["options"]["properties"]["faults"]  # the declaration's options, typed
    assert (faults["type"], faults["default"], faults["x-vz-kind"]) == ("array", [], "list")
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


# Names are names: a record is found only among the drivers the user added (issue #18 item 1) -------------


def _planted_record(tmp_path: Path, name: str = "acme") -> Path:
    """An external-driver record written by hand (not by `vz driver add`) outside the store."""
    manifest, _ = _plugin_dir(tmp_path, name)
    record = tmp_path / f"{name}-record.json"
    record.write_text(
        json.dumps(
            {
                "manifest": json.loads(manifest.read_text()),
                "driver_dir": str(manifest.parent),
                "manifest_path": str(manifest),
                "added_at": "2026-01-01T00:00:00+00:00",
            }
        )
    )
    return record


@pytest.mark.parametrize("shape", ["absolute", "dotdot", "newline", "upper", "empty", "slash"])
def test_a_name_that_is_not_a_driver_name_is_refused_before_any_lookup(
    tmp_path: Path, store: ManifestStore, shape: str
) -> None:
    record = _planted_record(tmp_path)
    store.root.mkdir(parents=True)
    name = {
        "absolute": str(record.with_suffix("")),
        "dotdot": os.path.relpath(record.with_suffix(""), store.root),
        "newline": "acme\n",
        "upper": "Acme",
        "empty": "",
        "slash": "acme/x",
    }[shape]
    with pytest.raises(UserError, match="is not a driver name"):
        resolve(name, store=store)
    assert store.get(name) is None
    with pytest.raises(UserError, match="is not a driver name"):
        validate_project_options(name, {}, store=store)


def test_a_symlinked_or_renamed_record_in_the_store_is_not_a_driver(tmp_path: Path, store: ManifestStore) -> None:
    record = _planted_record(tmp_path)
    store.root.mkdir(parents=True)
    (store.root / "linked.json").symlink_to(record)
    (store.root / "other.json").write_text(record.read_text())  # its manifest says "acme"
    (store.root / "Bad.json").write_text(record.read_text())
    assert store.names() == ["other"]
    with pytest.raises(NotFoundError, match="unknown driver 'linked'"):
        resolve("linked", store=store)
    with pytest.raises(TrustError, match="does not describe driver 'other'"):
        resolve("other", store=store)


def test_an_oversized_record_is_refused(store: ManifestStore) -> None:
    store.root.mkdir(parents=True)
    (store.root / "huge.json").write_bytes(b" " * (2 << 20) + b"{}")
    with pytest.raises(TrustError, match="record of driver 'huge'"):
        resolve("huge", store=store)


def test_a_builtin_plugin_is_launched_through_the_shared_plugin_main(store: ManifestStore) -> None:
    spec = resolve("qemu", store=store).launch_spec({"accelerator": "tcg"})()
    assert spec.argv == [sys.executable, "-c", PLUGIN_MAIN, "--module", "vz_drivers.qemu.registration", "qemu"]
    assert json.loads(spec.env["VZ_DRIVER_OPTIONS"]) == {"accelerator": "tcg"}


# Project options and the host configuration -----------------------------------------------------------------


@pytest.fixture
def host_config(tmp_path: Path) -> HostConfig:
    return HostConfig(tmp_path / "home" / "config" / "drivers.json")


@pytest.mark.parametrize(
    ("driver", "options"),
    [
        ("fake", {"state_dir": "/elsewhere"}),
        ("linux_native", {"state_dir": "/elsewhere"}),
        ("linux_native", {"image_dir": "/elsewhere"}),
        ("linux_native", {"subnet": "127.0.0.0/8"}),
        ("linux_native", {"runc": "/tmp/runc"}),
        ("linux_native", {"runc_sha256": "0" * 64}),
        ("linux_native", {"cgroup_parent": "/"}),
        ("linux_native", {"agent_binary": "/tmp/agent"}),
        ("qemu", {"qemu": "/tmp/qemu"}),
        ("qemu", {"kernel": "/tmp/k"}),
        ("qemu", {"busybox": "/tmp/bb"}),
    ],
)
def test_host_options_from_a_project_are_refused_naming_the_key(
    store: ManifestStore, driver: str, options: dict[str, str]
) -> None:
    (key,) = options
    with pytest.raises(UserError) as info:
        validate_project_options(driver, options, where="machines[0].driver_options", store=store)
    message = str(info.value)
    assert message.startswith(f"machines[0].driver_options.{key}: ")
    assert f"vz driver configure {driver} {key}=VALUE" in message and "drivers.json" in message


def test_project_options_are_checked_for_unknown_keys(store: ManifestStore) -> None:
    assert validate_project_options("qemu", {"accelerator": "tcg", "sessions": 2}, store=store) == {
        "accelerator": "tcg",
        "sessions": 2,
    }
    assert validate_project_options("fake", {"faults": "failing-run"}, store=store) == {"faults": "failing-run"}
    with pytest.raises(
        UserError, match=r"driver_options: unknown qemu option\(s\): bogus; valid options: .*accelerator"
    ):
        validate_project_options("qemu", {"bogus": 1}, store=store)
    with pytest.raises(NotFoundError):
        validate_project_options("nope", {}, store=store)


def test_external_drivers_take_no_options_from_a_project(tmp_path: Path, store: ManifestStore) -> None:
    manifest, _ = _plugin_dir(tmp_path)
    add_manifest(manifest, store=store)
    assert validate_project_options("acme", {}, store=store) == {}
    with pytest.raises(UserError, match="driver 'acme' is external"):
        validate_project_options("acme", {"state_dir": "/x"}, store=store)


def test_the_host_configuration_supplies_host_options(
    tmp_path: Path, store: ManifestStore, host_config: HostConfig
) -> None:
    state = tmp_path / "fake-state"
    result = configure("fake", [f"state_dir={state}", "faults=failing-run"], host_config=host_config, store=store)
    assert result == {
        "name": "fake",
        "path": str(host_config.path),
        "options": {"state_dir": str(state), "faults": ["failing-run"]},
    }
    assert json.loads(host_config.path.read_text()) == {"fake": {"faults": ["failing-run"], "state_dir": str(state)}}
    merged = effective_options("fake", {"faults": "exec-empty-chunk"}, host_config=host_config, store=store)
    assert merged == {"state_dir": str(state), "faults": "exec-empty-chunk"}  # the project wins for its own options
    driver = open_driver("fake", None, host_config=host_config, store=store)
    assert Path(driver.state_dir) == state  # type: ignore[attr-defined]
    assert configure("fake", unset=["faults"], host_config=host_config, store=store)["options"] == {
        "state_dir": str(state)
    }
    assert configure("fake", host_config=host_config, store=store)["options"] == {"state_dir": str(state)}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(
            {"assignments": ["bogus=1"]}, r"unknown fake option\(s\): bogus; valid options: faults, state_dir", id="key"
        ),
        pytest.param({"assignments": ["novalue"]}, "must look like KEY=VALUE", id="shape"),
        pytest.param({"unset": ["state_dir"]}, "has no 'state_dir'", id="unset-missing"),
    ],
)
def test_configure_refuses_bad_input(
    store: ManifestStore, host_config: HostConfig, args: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(UserError, match=fragment):
        configure("fake", host_config=host_config, store=store, **args)
    assert not host_config.path.exists()


def test_configure_parses_by_kind_and_refuses_external_drivers(
    tmp_path: Path, store: ManifestStore, host_config: HostConfig
) -> None:
    assert configure("qemu", ["sessions=2", "stop_timeout=1.5"], host_config=host_config, store=store)["options"] == {
        "sessions": 2,
        "stop_timeout": 1.5,
    }
    with pytest.raises(UserError, match=r'sessions: must be an integer in \[1, 7\], got "many"'):
        configure("qemu", ["sessions=many"], host_config=host_config, store=store)
    manifest, _ = _plugin_dir(tmp_path)
    add_manifest(manifest, store=store)
    with pytest.raises(UserError, match="is external"):
        configure("acme", ["x=1"], host_config=host_config, store=store)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("{nope", "not valid JSON", id="json"),
        pytest.param("[]", "must be a JSON object", id="shape"),
        pytest.param('{"../x": {}}', "is not a driver name", id="name"),
        pytest.param('{"fake": 3}', "must map option names", id="options"),
        pytest.param('{"fake": {"state_dir": {"a": 1}}}', "must be a string", id="value"),
        pytest.param("[" * 100_000, "not valid JSON", id="deep"),
    ],
)
def test_a_broken_host_configuration_is_a_clear_error(
    store: ManifestStore, host_config: HostConfig, text: str, fragment: str
) -> None:
    host_config.path.parent.mkdir(parents=True)
    host_config.path.write_text(text)
    with pytest.raises(UserError, match=fragment):
        effective_options("fake", None, host_config=host_config, store=store)


def test_unknown_keys_in_the_host_configuration_are_refused(store: ManifestStore, host_config: HostConfig) -> None:
    host_config.path.parent.mkdir(parents=True)
    host_config.path.write_text('{"fake": {"colour": "blue"}}')
    with pytest.raises(UserError, match=r"drivers.json: fake: unknown fake option\(s\): colour"):
        open_driver("fake", None, host_config=host_config, store=store)


def test_host_config_path_follows_vz_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VZ_HOME", str(tmp_path))
    assert host_config_path() == tmp_path / "config" / "drivers.json"
    assert HostConfig().path == tmp_path / "config" / "drivers.json"


def test_building_a_builtin_driver_loads_neither_pydantic_nor_grpc(tmp_path: Path) -> None:
    """vz_core.drivers itself: resolving, checking options and building a built-in in-process import no manifest
    models (pydantic) and no plugin transport (grpc); what the driver's own code imports is its business."""
    code = (
        "import sys, types\n"
        "from vz_core.drivers import HostConfig, open_driver\n"
        "from vz_core.registry import DriverDeclaration, DriverRegistry, Option, hookimpl\n"
        "@hookimpl\n"
        "def vz_builtin_drivers():\n"
        "    return [DriverDeclaration(name='plain', summary='s', factory='builtins:dict',\n"
        "                              options=(Option('colour', 'c'),))]\n"
        "module = types.ModuleType('plain_registration'); module.vz_builtin_drivers = vz_builtin_drivers\n"
        "registry = DriverRegistry(load_entry_points=False); registry.register(module)\n"
        f"host = HostConfig({str(tmp_path / 'none.json')!r})\n"
        "built = open_driver('plain', {'colour': 'blue'}, registry=registry, host_config=host)\n"
        "mods = ('pydantic', 'grpc', 'vz_core.trust', 'vz_core.transport')\n"
        "print(built['colour'], *[m in sys.modules for m in mods])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["blue", "False", "False", "False", "False"]


def test_options_recorded_with_an_existing_machine_may_keep_host_keys(
    tmp_path: Path, store: ManifestStore, host_config: HostConfig
) -> None:
    """An Environment made by an earlier vz (which took state_dir from vz.json) stays reachable where it is."""
    old = {"state_dir": str(tmp_path / "old-state")}
    with pytest.raises(UserError, match="belongs to the host configuration"):
        open_driver("fake", old, host_config=host_config, store=store)
    configure("fake", [f"state_dir={tmp_path / 'new-state'}"], host_config=host_config, store=store)
    assert effective_options("fake", old, recorded=True, host_config=host_config, store=store) == old
    driver = open_driver("fake", old, recorded=True, host_config=host_config, store=store)
    assert Path(driver.state_dir) == tmp_path / "old-state"  # type: ignore[attr-defined]
    with pytest.raises(UserError, match=r"unknown fake option\(s\): bogus"):
        open_driver("fake", {"bogus": 1}, recorded=True, host_config=host_config, store=store)
