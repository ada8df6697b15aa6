"""#18 item 7: a clear one-line error and the documented exit code where a traceback used to be.

A vz.json nested about 1,000 levels deep or holding a 4,301-digit integer (every command, delete included);
the state database locked after the wait, damaged, holding a spec that is not JSON, or empty (refused, never
re-created); the state disk full (`vz delete` fails naming the state directory and what to do, and works once
there is space again).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vz_core" / "cli"))
from vzcli import Vz, fake_machine, write_project

from vz_core.cli._exit import CONFLICT, USAGE, classify
from vz_core.env import StoreBusyError, StoreError
from vz_core.env import _store as store_module
from vz_core.env._store import Store

COMMANDS = [("up",), ("status",), ("exec", "--", "true"), ("stop",), ("delete",)]


@pytest.fixture
def vz(tmp_path: Path) -> Vz:
    return Vz(tmp_path / "home")


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("vz ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "text",
    [
        "[" * 1000 + "]" * 1000,
        '{"version": 1, "project_id": "demo", "machines": ' + "[" * 1000 + "]" * 1000 + "}",
        '{"version": 1, "project_id": "demo", "x": ' + "9" * 4301 + "}",
        '{"version": ' + "1" * 4301 + "}",
        '{"version": 1, "project_id": "demo", "machines": [], "n": NaN}',
    ],
    ids=["deep-array", "deep-machines", "huge-int", "huge-version", "nan"],
)
@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_hostile_vz_json_is_a_clear_error_for_every_command(
    vz: Vz, tmp_path: Path, text: str, command: tuple[str, ...]
) -> None:
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "vz.json").write_text(text)
    err = vz.fails(125 if command[0] == "exec" else USAGE, *command, cwd=proj)  # exec: docker's 125
    line = _one_line(err)
    assert "vz.json" in line and ("nested deeper than 32 levels" in line or "a number that cannot be read" in line)


def test_delete_still_works_by_id_when_vz_json_is_broken(vz: Vz, tmp_path: Path) -> None:
    proj = write_project(tmp_path / "p", fake_machine("web"))
    vz.ok("up", cwd=proj)
    env_id = vz.status(proj)["environments"][0]["id"]
    (proj / "vz.json").write_text("[" * 1000)
    err = vz.fails(USAGE, "delete", cwd=proj)
    assert "--environment env_" in err
    vz.ok("delete", "--environment", env_id, cwd=proj)
    assert vz.status(tmp_path, "--all")["environments"] == []


def test_a_locked_database_after_the_wait_is_a_conflict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.db"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT", 0.2)
    try:
        with Store(path) as store, pytest.raises(StoreBusyError) as caught, store.transaction() as db:
            store.touch_project(db, "p", "/w/vz.json")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert str(path) in str(caught.value) and "run the command again" in str(caught.value)
    assert classify(caught.value) == (CONFLICT, "conflict")


def _checkpointed(vz: Vz) -> Path:
    """The state database with nothing pending, its daemon stopped (the next command starts a new one)."""
    vz.ok("daemon", "stop", cwd=vz.home)
    db = vz.home / "state.db"
    assert db.stat().st_size > 0 and not (vz.home / "state.db-wal").exists()
    return db


def test_a_damaged_database_is_a_clear_error(vz: Vz, tmp_path: Path) -> None:
    proj = write_project(tmp_path / "p", fake_machine("web"))
    vz.ok("up", cwd=proj)
    vz.ok("delete", cwd=proj)
    db = _checkpointed(vz)
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    data[page:] = b"\xa5" * (len(data) - page)  # keep the header page, damage every table page
    db.write_bytes(bytes(data))
    for command in ("status", "up", "delete"):
        line = _one_line(vz.fails(USAGE, command, cwd=proj))
        assert str(db) in line and "damaged" in line and "backup" in line


def test_a_spec_that_is_not_json_is_a_clear_error(vz: Vz, tmp_path: Path) -> None:
    proj = write_project(tmp_path / "p", fake_machine("web"))
    vz.ok("up", cwd=proj)
    with contextlib.closing(sqlite3.connect(_checkpointed(vz))) as con:
        con.execute("UPDATE machines SET spec = '{not json'")
        con.commit()
    for command in ("status", "exec", "delete"):
        args = (command, "--", "true") if command == "exec" else (command,)
        line = _one_line(vz.fails(125 if command == "exec" else USAGE, *args, cwd=proj))
        assert "unreadable record" in line and "machine 'web'" in line


def test_an_empty_database_is_refused_not_recreated(vz: Vz, tmp_path: Path) -> None:
    proj = write_project(tmp_path / "p", fake_machine("web"))
    vz.ok("up", cwd=proj)
    db = _checkpointed(vz)
    db.write_bytes(b"")
    for command in ("status", "up", "delete"):
        line = _one_line(vz.fails(USAGE, command, cwd=proj))
        assert str(db) in line and "is empty" in line and "move it aside" in line
    assert db.stat().st_size == 0


def test_a_new_database_is_never_left_empty(tmp_path: Path) -> None:
    path = tmp_path / "state" / "state.db"
    with Store(path) as store:
        assert store.schema_version() >= 1
    assert path.stat().st_size > 0
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(".")) == []


def test_store_errors_are_user_errors_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "state.db").write_bytes(b"")
    with pytest.raises(StoreError) as caught:
        Store(tmp_path / "state.db")
    assert classify(caught.value) == (USAGE, "user_error")


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_delete_with_the_state_disk_full_fails_clearly_then_works(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "home", "4m") as home:
        vz = Vz(home)
        proj = write_project(tmp_path / "p", fake_machine("web"))
        vz.ok("up", cwd=proj)
        filler = home / "filler"
        with filler.open("wb") as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        for command in ("delete", "up", "stop"):
            line = _one_line(vz.fails(USAGE, command, cwd=proj))
            assert f"the state directory {home} is full" in line and "free space" in line
        # Reading needs no space: the running daemon still answers status (or fails as clearly).
        status = vz.run("status", "--json", cwd=proj)
        if status.returncode == 0:
            assert json.loads(status.stdout)["environments"][0]["state"] == "running"
        else:
            assert status.returncode == USAGE and "is full" in _one_line(status.stderr.decode())
        filler.unlink()
        assert vz.status(proj)["environments"][0]["state"] == "running"  # nothing was changed
        vz.ok("delete", cwd=proj)
        assert json.loads(vz.ok("status", "--json", "--all", cwd=tmp_path))["environments"] == []


def test_messages_stay_readable_whatever_the_input(vz: Vz, tmp_path: Path) -> None:
    proj = tmp_path / "p"
    proj.mkdir()
    for data in ({"version": "x" * 100_000}, {"version": 1, "project_id": "demo", "machines": [], "k" * 100_000: 1}):
        (proj / "vz.json").write_text(json.dumps(data))
        err = vz.fails(USAGE, "up", cwd=proj)
        assert len(err) < 1000, err[:300]
