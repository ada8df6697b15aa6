"""#14 item 7 for the fake: environment values never reach its state directory; a Start without them is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_testlib import request, run_exec, unique_id
from vz_conformance.fake import FakeDriver
from vz_conformance.fake._store import RECORD_VERSION

from vz_core.errors import FailedPreconditionError

VALUE = "s3cr3t-" + "v" * 8


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _record_path(driver: FakeDriver, workspace_id: str) -> Path:
    return driver._store.machine_dir(driver._store.key(workspace_id)) / "machine.json"


def _forget_values(driver: FakeDriver, workspace_id: str) -> None:
    """What a host restart does: neither the driver processes' memory nor the kernel keyring holds the values."""
    key = driver._store.key(workspace_id)
    record = driver._store.read(key)
    assert record is not None
    driver._secrets.drop(key, record.id)


async def test_machine_json_never_holds_a_value(driver: FakeDriver, state_dir: Path) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, entrypoint="sleep", args=("30",), environment={"TOKEN": VALUE, "B": "2"}))
    record = json.loads(_record_path(driver, ws).read_bytes())
    assert record["environment_names"] == ["B", "TOKEN"]
    assert "environment" not in record
    result = await run_exec(driver, ws, ["sh", "-c", 'printf %s "$TOKEN"'])
    assert result.stdout == VALUE.encode()
    await driver.stop(ws)
    await driver.start(ws)
    assert (await run_exec(driver, ws, ["sh", "-c", 'printf %s "$TOKEN"'])).stdout == VALUE.encode()
    assert _files_holding(state_dir, VALUE.encode()) == []
    await driver.stop(ws)
    assert _files_holding(state_dir, VALUE.encode()) == []
    await driver.delete(ws)


async def test_a_relaunched_driver_starts_the_machine_with_its_values(driver: FakeDriver, state_dir: Path) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, environment={"TOKEN": VALUE}))
    await driver.stop(ws)
    relaunched = FakeDriver(state_dir)
    try:
        await relaunched.start(ws)
        assert (await run_exec(relaunched, ws, ["sh", "-c", 'printf %s "$TOKEN"'])).stdout == VALUE.encode()
    finally:
        await relaunched.delete(ws)
        await relaunched.close()


async def test_start_without_the_values_is_refused_naming_them(driver: FakeDriver, state_dir: Path) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, environment={"TOKEN": VALUE, "OTHER": "x"}))
    await driver.stop(ws)
    _forget_values(driver, ws)
    relaunched = FakeDriver(state_dir)
    try:
        with pytest.raises(FailedPreconditionError, match=r"OTHER, TOKEN.*vz up --recreate") as info:
            await relaunched.start(ws)
        assert VALUE not in str(info.value)
        details = await relaunched.find(ws)
        assert details is not None and details.state.status == "stopped"
        # Recreating gives the values again.
        await relaunched.run_image(request(ws, environment={"TOKEN": VALUE}, allow_recreate=True))
        assert (await run_exec(relaunched, ws, ["sh", "-c", 'printf %s "$TOKEN"'])).stdout == VALUE.encode()
    finally:
        await relaunched.delete(ws)
        await relaunched.close()


async def test_a_machine_without_environment_starts_anywhere(driver: FakeDriver, state_dir: Path) -> None:
    ws = unique_id()
    await driver.run_image(request(ws))
    await driver.stop(ws)
    relaunched = FakeDriver(state_dir)
    try:
        await relaunched.start(ws)
        details = await relaunched.find(ws)
        assert details is not None and details.state.status == "running"
    finally:
        await relaunched.delete(ws)
        await relaunched.close()


async def test_an_old_record_with_values_is_rewritten_without_them(driver: FakeDriver, state_dir: Path) -> None:
    ws = unique_id()
    await driver.run_image(request(ws))
    await driver.stop(ws)
    path = _record_path(driver, ws)
    old = json.loads(path.read_bytes())
    del old["environment_names"]
    old["environment"] = {"TOKEN": VALUE}
    assert old["version"] == RECORD_VERSION
    path.write_text(json.dumps(old))
    relaunched = FakeDriver(state_dir)
    try:
        details = await relaunched.find(ws)  # any read rewrites it
        assert details is not None
        assert _files_holding(state_dir, VALUE.encode()) == []
        assert json.loads(path.read_bytes())["environment_names"] == ["TOKEN"]
        await relaunched.start(ws)  # the values read from the old record were kept
        assert (await run_exec(relaunched, ws, ["sh", "-c", 'printf %s "$TOKEN"'])).stdout == VALUE.encode()
        assert _files_holding(state_dir, VALUE.encode()) == []
    finally:
        await relaunched.delete(ws)
        await relaunched.close()
