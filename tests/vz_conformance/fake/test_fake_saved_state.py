"""The fake's saved running state (vz.machine.v1 SaveState / RestoreState) through a real plugin server.

A Machine's main process is a counter loop writing ``<token> <count>`` (the token is new at each start); a
resumed Machine goes on with the same token and a higher count, a fresh boot has a new token.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import psutil
import pytest
from fake_testlib import counted, counter_request, read_counter, unique_id
from vz_conformance.fake import FakeDriver

from vz_core import Extensions
from vz_core.errors import FailedPreconditionError, NotFoundError, UnsupportedError
from vz_core.rpc import RemoteDriver, connect_in_process


async def _gone(pid: int) -> None:
    """Wait (at most 10 s) until ``pid`` has died (gone or a zombie)."""
    for _ in range(200):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"process {pid} is still alive")


async def _saved_machine(driver: FakeDriver, remote: RemoteDriver) -> tuple[str, tuple[str, int]]:
    workspace_id = unique_id()
    await remote.run_image(counter_request(workspace_id))
    await counted(driver, workspace_id, 5)
    state = await remote.save_state(workspace_id)
    assert state.size_bytes > 0
    assert state.path == str(driver._store.machine_dir(driver._store.key(workspace_id)) / "saved-state.json")
    frozen = read_counter(driver, workspace_id)
    assert frozen is not None
    return workspace_id, frozen


async def test_save_then_restore_keeps_the_process_running_where_it_was(tmp_path: Path) -> None:
    driver = FakeDriver(tmp_path / "state")
    async with connect_in_process(driver, name="fake") as remote:
        ext = await remote.extensions()
        assert ext is not None and ext.save_state and not ext.save_state_reason
        workspace_id, frozen = await _saved_machine(driver, remote)
        found = await remote.find(workspace_id)
        assert found is not None and found.state.status == "stopped"
        await asyncio.sleep(0.3)
        assert read_counter(driver, workspace_id) == frozen  # frozen: the loop does not run while saved
        with pytest.raises(FailedPreconditionError, match="is stopped"):
            await remote.save_state(workspace_id)
        outcome = await remote.restore_state(workspace_id)
        assert outcome.restored and not outcome.reason
        found = await remote.find(workspace_id)
        assert found is not None and found.state.status == "running"
        token, count = await counted(driver, workspace_id, frozen[1] + 3, token=frozen[0])
        assert token == frozen[0] and count > frozen[1]
        with pytest.raises(FailedPreconditionError, match="is running"):
            await remote.restore_state(workspace_id)
        await remote.delete(workspace_id)


async def test_a_corrupt_state_is_refused_with_the_reason_and_the_machine_boots_fresh(tmp_path: Path) -> None:
    driver = FakeDriver(tmp_path / "state")
    async with connect_in_process(driver, name="fake") as remote:
        workspace_id, frozen = await _saved_machine(driver, remote)
        root = driver._store.root_dir(driver._store.key(workspace_id))
        (root / "kept").write_text("data on disk")
        state_file = driver._store.machine_dir(driver._store.key(workspace_id)) / "saved-state.json"
        raw = bytearray(state_file.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        state_file.write_bytes(bytes(raw))
        pid = driver._store.read(driver._store.key(workspace_id)).main_pid  # type: ignore[union-attr]
        outcome = await remote.restore_state(workspace_id)
        assert not outcome.restored and "corrupt" in outcome.reason
        found = await remote.find(workspace_id)
        assert found is not None and found.state.status == "stopped"  # never half-restored
        await _gone(pid)
        assert not state_file.exists()  # the state is discarded
        await remote.start(workspace_id)
        await counted(driver, workspace_id, 1, not_token=frozen[0])  # a fresh boot: a new token
        assert (root / "kept").read_text() == "data on disk"
        with pytest.raises(FailedPreconditionError):
            await remote.restore_state(workspace_id)
        await remote.delete(workspace_id)


async def test_start_discards_a_saved_state_and_delete_ends_its_processes(tmp_path: Path) -> None:
    driver = FakeDriver(tmp_path / "state")
    async with connect_in_process(driver, name="fake") as remote:
        workspace_id, frozen = await _saved_machine(driver, remote)
        frozen_pid = driver._store.read(driver._store.key(workspace_id)).main_pid  # type: ignore[union-attr]
        await remote.start(workspace_id)  # boots fresh: the saved processes end
        await counted(driver, workspace_id, 1, not_token=frozen[0])
        await _gone(frozen_pid)
        await remote.stop(workspace_id)
        outcome = await remote.restore_state(workspace_id)
        assert not outcome.restored and outcome.reason == "the Machine has no saved state"
        await remote.start(workspace_id)
        other, _ = await _saved_machine(driver, remote)
        pid = driver._store.read(driver._store.key(other)).main_pid  # type: ignore[union-attr]
        assert psutil.Process(pid).status() == psutil.STATUS_STOPPED
        await remote.delete(other)
        await _gone(pid)
        await remote.delete(workspace_id)
        with pytest.raises(NotFoundError):
            await remote.save_state(workspace_id)
        with pytest.raises(NotFoundError):
            await remote.restore_state(workspace_id)


@pytest.mark.parametrize("fault", ["save-fails", "restore-fails", "state-file-corrupt"])
async def test_each_fault_mode_breaks_its_rule(tmp_path: Path, fault: str) -> None:
    driver = FakeDriver(tmp_path / "state", faults=[fault])
    async with connect_in_process(driver, name="fake") as remote:
        workspace_id, frozen = await _saved_machine(driver, remote)
        if fault == "state-file-corrupt":
            state_file = driver._store.machine_dir(driver._store.key(workspace_id)) / "saved-state.json"
            state_file.write_bytes(b"not a state file")
        outcome = await remote.restore_state(workspace_id)
        if fault == "save-fails":
            assert not outcome.restored  # nothing was kept to resume
        else:
            assert outcome.restored  # reported, yet the Machine booted fresh: a new token
            await counted(driver, workspace_id, 1, not_token=frozen[0])
        await remote.delete(workspace_id)


class _NoSaveDriver(FakeDriver):
    async def extensions(self) -> Extensions:
        ext = await super().extensions()
        return dataclasses.replace(ext, save_state=False, save_state_reason="no checkpoint support in this build")


async def test_a_driver_that_declares_no_save_state_is_unsupported_with_its_reason(tmp_path: Path) -> None:
    async with connect_in_process(_NoSaveDriver(tmp_path / "state"), name="nosave") as remote:
        ext = await remote.extensions()
        assert ext is not None and not ext.save_state
        assert ext.save_state_reason == "no checkpoint support in this build"
        with pytest.raises(UnsupportedError, match="no checkpoint support in this build"):
            await remote.save_state(unique_id())
