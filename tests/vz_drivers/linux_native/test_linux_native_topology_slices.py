"""The recorded current slices (vz_core.network.label) that re-attach a Machine whose attachments changed after
its creation, as linux_native reads them: which slice wins, what `needs_reattach` says before and after a start
noted its attachment, damaged records, removal. No Machine is started: the records live in a temporary
directory standing in for /run/vz/network."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from vz_core.env import compile_topology
from vz_core.env._definition import parse_definition
from vz_core.errors import InvalidArgumentError
from vz_core.network import label as label_module
from vz_core.network.label import (
    LABEL,
    current_slice,
    machine_slice,
    needs_reattach,
    note_attached,
    remove_slices,
    write_slices,
)
from vz_drivers.linux_native import _attach

ENV = "env_0123456789ab"
MACHINE_ID = "mch_abcdefghjkmn"
M = {"profile": "developer", "driver": "linux_native", "image": "vz:default"}
BEFORE: dict[str, Any] = {
    "version": 2,
    "project_id": "slices",
    "machines": [{"name": "app", **M}, {"name": "db", **M}],
    "networks": [{"name": "front", "machines": ["app", "db"]}],
    "default_machine": "app",
}
AFTER = copy.deepcopy(BEFORE)
AFTER["networks"].append({"name": "back", "machines": ["app"], "subnet": "10.77.9.0/24"})


@pytest.fixture
def slices_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "network"
    monkeypatch.setattr(label_module, "SLICES_DIR", directory)
    return directory


def _slice(data: dict[str, Any], machine: str = "app") -> str:
    text = machine_slice(compile_topology(parse_definition(data), ENV).to_json(), machine)
    assert text is not None
    return text


def _labels(text: str | None) -> dict[str, str]:
    labels = {"dev.vz.environment": ENV, "dev.vz.machine": MACHINE_ID}
    if text is not None:
        labels[LABEL] = text
    return labels


def test_the_recorded_slice_wins_over_the_creation_label(slices_dir: Path) -> None:
    old, new = _slice(BEFORE), _slice(AFTER)
    labels = _labels(old)
    found = current_slice(labels)
    assert found is not None and len(found.attachments) == 1  # nothing recorded: the label's
    write_slices(ENV, {MACHINE_ID: new})
    found = current_slice(labels)
    assert found is not None and [a.machine_ifname for a in found.attachments] == ["eth0", "eth1"]
    assert _attach.resolv_conf_for(labels, "default") == found.resolv_conf()
    # A Machine created without a label (on no network then) is attached once vz up records a slice for it.
    assert current_slice(_labels(None)) is not None
    # Recorded "no network": no attachment, whatever the label said.
    write_slices(ENV, {MACHINE_ID: None})
    assert current_slice(labels) is None
    assert _attach.resolv_conf_for(labels, "default") == "default"


def test_needs_reattach_until_a_start_notes_the_current_slice(slices_dir: Path) -> None:
    old, new = _slice(BEFORE), _slice(AFTER)
    labels = _labels(old)
    write_slices(ENV, {MACHINE_ID: old})
    assert needs_reattach(ENV, MACHINE_ID, old, old) is False  # created with it, nothing noted yet
    assert needs_reattach(ENV, MACHINE_ID, new, old) is True
    write_slices(ENV, {MACHINE_ID: new})
    note_attached(labels, current_slice(labels))  # what the driver does at the start
    assert needs_reattach(ENV, MACHINE_ID, new, old) is False
    assert needs_reattach(ENV, MACHINE_ID, old, old) is True  # noted: the label no longer decides
    assert needs_reattach(ENV, MACHINE_ID, None, old) is False  # on no network now: nothing to re-attach


def test_records_of_machines_no_longer_recorded_and_of_a_deleted_environment_go(slices_dir: Path) -> None:
    other = "mch_zzzzzzzzzzzz"
    write_slices(ENV, {MACHINE_ID: _slice(BEFORE), other: _slice(BEFORE, "db")})
    note_attached({**_labels(None), "dev.vz.machine": other}, None)
    directory = slices_dir / ("vzd-" + ENV[4:])
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [f"{MACHINE_ID}.slice", f"{other}.slice", f"{other}.attached"]
    )
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in directory.iterdir())
    assert directory.stat().st_mode & 0o777 == 0o700
    write_slices(ENV, {MACHINE_ID: _slice(BEFORE)})
    assert sorted(p.name for p in directory.iterdir()) == [f"{MACHINE_ID}.slice"]
    assert remove_slices(ENV) is True
    assert not directory.exists()
    assert remove_slices(ENV) is False


def test_a_damaged_record_is_refused_naming_it_and_never_keeps_a_machine_from_stopping(
    slices_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    labels = _labels(_slice(BEFORE))
    write_slices(ENV, {MACHINE_ID: _slice(BEFORE)})
    record = slices_dir / ("vzd-" + ENV[4:]) / f"{MACHINE_ID}.slice"
    record.write_text("{not json")
    with pytest.raises(InvalidArgumentError, match="is not the JSON vz up writes"):
        current_slice(labels)
    record.write_text('{"slice": "{\\"format\\": 2}"}')
    with pytest.raises(InvalidArgumentError, match=r"\$\.format"):
        current_slice(labels)
    other_env = _slice(BEFORE).replace(ENV, "env_bbbbbbbbbbbb").replace("vzd-" + ENV[4:], "vzd-bbbbbbbbbbbb")
    write_slices(ENV, {MACHINE_ID: other_env})
    with pytest.raises(InvalidArgumentError, match="is not the Machine's Environment"):
        current_slice(labels)
    with pytest.raises(InvalidArgumentError, match="not a Machine id"):
        write_slices(ENV, {"../etc": None})
    detached: list[str] = []

    async def detach(plan: dict[str, Any], machine: str) -> None:
        detached.append(machine)

    monkeypatch.setattr(_attach, "detach_machine", detach)
    record.write_text("{not json")
    asyncio.run(_attach.disconnect_machine(labels))  # the label's slice is detached; no error
    assert detached == ["app"]
