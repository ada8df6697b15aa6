"""The state store: migrations with a version table, WAL, atomic writes, ownership-scoped deletion."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from vz_core.env import MIGRATIONS, Store
from vz_core.env._store import Migration, StoreError


def make_env(store: Store, env_id: str, name: str, project: str = "p") -> None:
    with store.transaction() as db:
        store.touch_project(db, project, f"/w/{project}/vz.json")
        store.create_environment(db, env_id=env_id, project_id=project, name=name, worktree="/w", default_machine=None)
        store.bind(db, project, f"/w/{name}", env_id)
        for index in range(2):
            mid = f"mch_{env_id[-4:]}{index}"
            store.put_machine(
                db,
                env_id=env_id,
                machine_id=mid,
                name=f"m{index}",
                workspace_id=f"vz-{project}-{env_id}-{mid}",
                driver="fake",
                spec={"image": "i"},
                state="running",
            )
            store.put_volume(db, env_id, mid, "cache", f"vz-{env_id}-{mid}-cache")


def test_fresh_database_is_migrated_to_the_latest_version(tmp_path: Path) -> None:
    with Store(tmp_path / "state.db") as store:
        assert store.schema_version() == MIGRATIONS[-1].version
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    rows = db.execute("SELECT version, description FROM schema_version").fetchall()
    assert [r[0] for r in rows] == [m.version for m in MIGRATIONS]
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"projects", "environments", "machines", "volumes", "bindings", "operations"} <= tables
    db.close()


def test_reopening_applies_nothing_twice_and_new_migrations_once(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Store(path).close()
    extra = Migration(MIGRATIONS[-1].version + 1, "test column", ("ALTER TABLE projects ADD COLUMN note TEXT",))
    for _ in range(2):
        with Store(path, migrations=(*MIGRATIONS, extra)) as store:
            assert store.schema_version() == extra.version
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*) FROM schema_version WHERE version = ?", (extra.version,)).fetchone()[0] == 1
    db.close()


def test_a_failing_migration_leaves_the_previous_version(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Store(path).close()
    broken = Migration(MIGRATIONS[-1].version + 1, "broken", ("CREATE TABLE t (a)", "NOT SQL"))
    with pytest.raises(StoreError, match="unusable"):
        Store(path, migrations=(*MIGRATIONS, broken))
    with Store(path) as store:
        assert store.schema_version() == MIGRATIONS[-1].version
        assert store._db.execute("SELECT name FROM sqlite_master WHERE name = 't'").fetchone() is None


def test_a_newer_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    extra = Migration(MIGRATIONS[-1].version + 1, "future", ("CREATE TABLE future (a)",))
    Store(path, migrations=(*MIGRATIONS, extra)).close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="newer than this vz understands"):
        Store(path)
    assert path.read_bytes() == before


def test_garbage_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="unusable"):
        Store(path)


def test_transactions_are_atomic(tmp_path: Path) -> None:
    with Store(tmp_path / "state.db") as store:
        with pytest.raises(RuntimeError), store.transaction() as db:
            store.touch_project(db, "p", "/w/vz.json")
            store.create_environment(db, env_id="env_x", project_id="p", name="a", worktree="/w", default_machine=None)
            raise RuntimeError("crash mid-transaction")
        assert store.environments("p") == []


def test_names_are_unique_per_project_only(tmp_path: Path) -> None:
    with Store(tmp_path / "state.db") as store:
        make_env(store, "env_000000000001", "default", project="p")
        make_env(store, "env_000000000002", "default", project="q")
        with pytest.raises(sqlite3.IntegrityError), store.transaction() as db:
            store.create_environment(
                db, env_id="env_000000000003", project_id="p", name="default", worktree="/w", default_machine=None
            )


def test_delete_removes_exactly_one_environment_graph(tmp_path: Path) -> None:
    with Store(tmp_path / "state.db") as store:
        make_env(store, "env_000000000001", "one")
        make_env(store, "env_000000000002", "two")
        with store.transaction() as db:
            op = store.begin_operation(db, env_id="env_000000000001", project_id="p", kind="delete")
        before_two = (
            store.environment("env_000000000002"),
            store.machines("env_000000000002"),
            store.volumes("env_000000000002"),
            store.bindings_of("env_000000000002"),
        )
        with store.transaction() as db:
            store.delete_environment(db, "env_000000000001")
            store.finish_operation(db, op, "succeeded")
        assert store.environment("env_000000000001") is None
        assert store.machines("env_000000000001") == [] and store.volumes("env_000000000001") == []
        assert store.bindings_of("env_000000000001") == []
        after_two = (
            store.environment("env_000000000002"),
            store.machines("env_000000000002"),
            store.volumes("env_000000000002"),
            store.bindings_of("env_000000000002"),
        )
        assert after_two == before_two
        # The operation record stays as history of what happened to the deleted Environment.
        assert [o.status for o in store.operations("env_000000000001")] == ["succeeded"]


def test_operation_records(tmp_path: Path) -> None:
    with Store(tmp_path / "state.db") as store:
        make_env(store, "env_000000000001", "one")
        with store.transaction() as db:
            op = store.begin_operation(db, env_id="env_000000000001", project_id="p", kind="up", plan={"steps": []})
            store.operation_step(db, op, "create m0")
        running = store.operations("env_000000000001", status="running")
        assert [(o.op_id, o.step, o.plan) for o in running] == [(op, "create m0", {"steps": []})]
        with store.transaction() as db:
            store.finish_operation(db, op, "interrupted", "process ended")
        record = store.operation(op)
        assert record is not None and record.status == "interrupted" and record.finished_at
