"""The daemon's event log (vz_core.daemon._events) over the state store's migration 3: revisions are never
reused, a watch resumed from N after a reconnect loses nothing, retention is bounded and refuses a stale resume
point, appends of another process are seen."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from vz_core.daemon._events import EventLog
from vz_core.env import MIGRATIONS, Store
from vz_core.errors import FailedPreconditionError


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


async def take(stream: AsyncGenerator[dict[str, Any], None], n: int, wait: float = 5.0) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        out.append(await asyncio.wait_for(anext(stream), wait))
    return out


def test_migrations_1_and_2_are_unchanged_and_3_adds_only_the_events_table(db: Path) -> None:
    pinned = {
        1: "86f2f90928306d749f0bdf5b67a4cff71f2133e8436ec46cc810dace262b9ba7",
        2: "7ed6764662e53ee50e4718769e52460fde1b93b9a5a511c1c50634c7d7947cf9",
    }
    for m in MIGRATIONS[:2]:
        assert hashlib.sha256(repr((m.version, m.description, m.statements)).encode()).hexdigest() == pinned[m.version]
    # A database at version 2 gains exactly the events table (and its index) from migration 3.
    with Store(db, migrations=MIGRATIONS[:2]) as store:
        assert store.schema_version() == 2
    before = set(sqlite3.connect(db).execute("SELECT type, name FROM sqlite_master").fetchall())
    with Store(db, migrations=MIGRATIONS[:3]) as store:
        assert store.schema_version() == 3
    after = set(sqlite3.connect(db).execute("SELECT type, name FROM sqlite_master").fetchall())
    assert after - before == {("table", "events"), ("table", "sqlite_sequence"), ("index", "events_environment")}


def test_append_and_since(db: Path) -> None:
    log = EventLog(db)
    try:
        r1 = log.append("environment.updated", "env_a", None, {"name": "default", "state": "running"})
        r2 = log.append("machine.state", "env_a", "mch_b", {"state": "stopped", "n": 3})
        assert (r1, r2) == (1, 2) and log.latest() == 2
        events = log.since(0)
        assert [e["revision"] for e in events] == [1, 2]
        assert events[1] == {
            "revision": 2,
            "time": events[1]["time"],
            "kind": "machine.state",
            "environment_id": "env_a",
            "machine_id": "mch_b",
            "data": {"state": "stopped", "n": 3},
        }
        assert events[0]["machine_id"] is None and events[0]["time"].endswith("Z")
        assert log.since(1) == events[1:] and log.since(2) == []
        with pytest.raises(ValueError, match="needs a kind"):
            log.append("")
    finally:
        log.close()


async def test_follow_resumed_after_a_reconnect_loses_nothing(db: Path) -> None:
    log = EventLog(db, poll_interval=30.0)  # live wake-ups must not depend on polling
    try:
        for i in range(3):
            log.append("machine.state", "env_a", f"mch_{i}", {"i": i})
        first = log.follow(0)
        seen = await take(first, 3)
        live = asyncio.ensure_future(take(first, 1))
        await asyncio.sleep(0.05)
        log.append("machine.state", "env_a", "mch_3", {"i": 3})
        seen += await asyncio.wait_for(live, 2.0)
        await first.aclose()  # the client disconnects...
        last = seen[-1]["revision"]
        for i in range(4, 9):  # ...events keep happening while it is away
            log.append("machine.state", "env_a", f"mch_{i}", {"i": i})
        again = log.follow(last)  # ...and it reconnects from the last revision it saw
        rest = await take(again, 5)
        await again.aclose()
        got = [e["data"]["i"] for e in seen + rest]
        assert got == list(range(9))
        assert [e["revision"] for e in seen + rest] == list(range(1, 10))
    finally:
        log.close()


async def test_follow_filters_by_environment_and_kind(db: Path) -> None:
    log = EventLog(db)
    try:
        log.append("environment.updated", "env_a", None, {})
        log.append("machine.state", "env_b", "mch_x", {})
        log.append("machine.state", "env_a", "mch_y", {})
        log.append("operation.started", "env_a", None, {})
        stream = log.follow(0, environment_id="env_a", kinds=("machine.",))
        (only,) = await take(stream, 1)
        assert (only["revision"], only["machine_id"]) == (3, "mch_y")
        await stream.aclose()
    finally:
        log.close()


async def test_retention_keeps_the_newest_never_renumbers_and_refuses_a_lost_resume_point(db: Path) -> None:
    log = EventLog(db, retention=10)
    try:
        for i in range(25):
            log.append("machine.state", None, None, {"i": i})
        assert log.prune() == 15
        assert (log.oldest(), log.latest()) == (16, 25)
    finally:
        log.close()
    log = EventLog(db, retention=10)  # a restart: the numbering continues, old numbers are never handed out
    try:
        assert log.append("machine.state", None, None, {"i": 25}) == 26
        assert (log.oldest(), log.latest()) == (17, 26)  # appends prune too
        with pytest.raises(FailedPreconditionError, match=r"after revision 3 are no longer kept.*from revision 16"):
            await anext(log.follow(3))
        stream = log.follow(16)  # the oldest resume point that loses nothing
        assert [e["revision"] for e in await take(stream, 10)] == list(range(17, 27))
        await stream.aclose()
        with pytest.raises(FailedPreconditionError, match="newer than the last event"):
            log.check_resumable(1000)
    finally:
        log.close()


async def test_appends_of_another_process_are_seen_by_polling(db: Path) -> None:
    reader = EventLog(db, poll_interval=0.05)
    writer = EventLog(db)  # its own connection: what another process's log does
    try:
        stream = reader.follow(reader.latest())
        pending = asyncio.ensure_future(take(stream, 1, wait=3.0))
        await asyncio.sleep(0.1)
        revision = writer.append("environment.updated", "env_z", None, {"change": "created"})
        (event,) = await pending
        assert event["revision"] == revision and event["data"] == {"change": "created"}
        await stream.aclose()
    finally:
        writer.close()
        reader.close()


async def test_a_cancelled_follower_ends_also_right_after_an_append(db: Path) -> None:
    log = EventLog(db, poll_interval=30.0)
    try:
        for _ in range(20):

            async def follow() -> None:
                async for _event in log.follow(log.latest()):
                    pass

            task = asyncio.ensure_future(follow())
            await asyncio.sleep(0)  # the follower is waiting for a wake-up
            log.append("machine.state", None, None, {})  # wakes it...
            task.cancel()  # ...while it is being cancelled
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 2.0)
    finally:
        log.close()


def test_an_unusable_database_fails_each_use_not_the_construction(db: Path) -> None:
    from vz_core.env import StoreError

    db.write_bytes(b"")  # an empty state.db: the store refuses it (it never starts a new one over it)
    log = EventLog(db)  # the daemon starts anyway: every call then fails with the store's own error
    try:
        with pytest.raises(StoreError, match="is empty"):
            log.append("machine.state")
        with pytest.raises(StoreError, match="is empty"):
            log.since(0)
        db.unlink()  # once the database is usable again, the log works (nothing was cached)
        assert log.append("machine.state") == 1
    finally:
        log.close()
