"""The daemon's event log: numbered events in the state database, for Watch and System.Events.

Every event gets the next ``revision`` of the ``events`` table (migration 3 of the state store: ``INTEGER
PRIMARY KEY AUTOINCREMENT``, so a number is never reused, not even after old rows were dropped or the daemon
restarted). ``follow(N)`` yields every event with a revision above ``N`` in order, then live ones: a client that
reconnects with the last revision it saw loses nothing, as long as the log still keeps it. The log keeps the
newest ``retention`` events (100 000 by default); resuming from a revision older than what is kept is refused
with a FailedPreconditionError saying from where to resume, never answered with a silent gap.

Appends in this process wake followers at once; appends by another process (another daemon's log on the same
state directory, a test) are seen by polling the table every ``poll_interval`` seconds.

An event is the JSON object of vz.api.v1's ``Event``: ``{"revision", "time", "kind", "environment_id",
"machine_id", "data"}``. ``data`` must be a JSON object; it is stored as given (the service redacts first).
One EventLog per process, used from its event loop's thread (``append`` may also be called from another
thread: waking followers is thread-safe).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import Any

from vz_core.env import Store, StoreError
from vz_core.errors import FailedPreconditionError

__all__ = ["DEFAULT_RETENTION", "EventLog", "event_time"]

DEFAULT_RETENTION = 100_000
"""How many of the newest events the log keeps."""
_PRUNE_EVERY = 256  # appends between two retention passes (a pass is one indexed DELETE)
_BATCH = 500


def event_time() -> str:
    """Now, RFC 3339 UTC with milliseconds (the store's time format)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


_STR, _INT, _NUM, _OBJ = (str,), (int,), (int, float), (dict,)
TYPED: dict[str, tuple[str, dict[str, tuple[tuple[type, ...], bool]]]] = {
    "environment.updated": (
        "environment_updated",
        {"name": (_STR, False), "state": (_STR, False), "previous": (_STR, True), "change": (_STR, False)},
    ),
    "machine.state": (
        "machine_state",
        {"name": (_STR, False), "state": (_STR, False), "previous": (_STR, True), "source": (_STR, False)},
    ),
    "operation.started": (
        "operation_started",
        {"method": (_STR, False), "call": (_INT, False), "environment": (_STR, True), "peer_pid": (_INT, True)},
    ),
    "operation.finished": (
        "operation_finished",
        {
            "method": (_STR, False),
            "call": (_INT, False),
            "status": (_STR, False),
            "operation_id": (_STR, True),
            "error": (_OBJ, True),
            "seconds": (_NUM, False),
            "started_revision": (_INT, False),
        },
    ),
}
"""Per event kind vz records: the typed field of vz.api.v1's ``Event`` and its fields (types, nullable)."""
_OPTIONAL = frozenset({"started_revision"})  # may be absent (events recorded before it existed)


def typed(kind: str, data: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The typed field of an event (``("operation_finished", {...})``: the known keys of ``data``, with their
    JSON types checked), or None for a kind without one or data that does not fit it (an older daemon's)."""
    known = TYPED.get(kind)
    if known is None:
        return None
    name, fields = known
    out: dict[str, Any] = {}
    for key, (types, nullable) in fields.items():
        if key not in data:
            if not nullable and key not in _OPTIONAL:
                return None  # not the shape vz records for this kind
            continue
        value = data[key]
        if value is None and nullable:
            out[key] = None
        elif isinstance(value, types) and not isinstance(value, bool):
            out[key] = value
        else:
            return None
    for key, (_, nullable) in fields.items():  # a nullable field is null, not absent, on the local wire
        if nullable and key not in out:
            out[key] = None
    return name, out


def _row(row: sqlite3.Row) -> dict[str, Any]:
    try:
        data = json.loads(row["data"])
    except ValueError:
        data = {"unreadable": True}
    data = data if isinstance(data, dict) else {"value": data}
    event = {
        "revision": int(row["revision"]),
        "time": row["time"],
        "kind": row["kind"],
        "environment_id": row["environment_id"],
        "machine_id": row["machine_id"],
        "data": data,
    }
    fitted = typed(row["kind"], data)
    if fitted is not None:
        event[fitted[0]] = fitted[1]
    return event


class EventLog:
    """Append, read and follow the numbered events of one state directory (see the module docstring)."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        retention: int = DEFAULT_RETENTION,
        poll_interval: float = 0.5,
    ) -> None:
        if retention < 1:
            raise ValueError(f"retention must keep at least one event, not {retention}")
        self.path = path
        """The state database (None until first use: the store's default path)."""
        self.retention = retention
        self.poll_interval = poll_interval
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._appends = 0
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._closed = False

    def _open(self) -> sqlite3.Connection:
        """The connection, opened on first use (the lock is held). Opening goes through the store, which creates
        or migrates the database (migration 3 adds the events table) and refuses an unusable one with its own
        StoreError; the next use tries again, so a daemon started beside a damaged database serves every call
        (each failing with the store's error) and has events once the database is usable."""
        if self._db is not None:
            return self._db
        if self._closed:
            raise StoreError("the event log is closed")
        with Store(self.path) as store:
            self.path = store.path
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        self._db = db
        return db

    def _error(self, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"the event log in the state database {self.path} is unusable: {exc}")

    # --- writing ----------------------------------------------------------------------------------------------

    def append(
        self,
        kind: str,
        environment_id: str | None = None,
        machine_id: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> int:
        """Record one event; returns its revision. Followers (in any thread's loop) are woken."""
        if not kind:
            raise ValueError("an event needs a kind")
        payload = json.dumps(dict(data or {}), separators=(",", ":"), default=str)
        with self._lock:
            db = self._open()
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    cursor = db.execute(
                        "INSERT INTO events (time, kind, environment_id, machine_id, data) VALUES (?, ?, ?, ?, ?)",
                        (event_time(), kind, environment_id, machine_id, payload),
                    )
                    revision = int(cursor.lastrowid or 0)
                    self._appends += 1
                    if self._appends % _PRUNE_EVERY == 0 or self._appends == 1:
                        db.execute("DELETE FROM events WHERE revision <= ?", (revision - self.retention,))
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._error(exc) from None
        self._wake()
        return revision

    def forget_environment(self, environment_id: str) -> int:
        """Drop every event about one Environment (after it was deleted: nothing of it stays on disk); returns
        how many. Revisions are never renumbered: a watcher resuming across the gap just does not see them."""
        if not environment_id:
            return 0
        with self._lock:
            db = self._open()
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    # An operation's operation.started event (recorded before its Environment was known) leaves
                    # with its operation.finished: a replay never shows an operation that never finishes.
                    started = db.execute(
                        "DELETE FROM events WHERE kind = 'operation.started' AND revision IN (SELECT "
                        "json_extract(data, '$.started_revision') FROM events WHERE environment_id = ? AND kind = "
                        "'operation.finished')",
                        (environment_id,),
                    ).rowcount
                    rest = db.execute("DELETE FROM events WHERE environment_id = ?", (environment_id,)).rowcount
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._error(exc) from None
        return int(started or 0) + int(rest or 0)

    def knows_environment(self, environment_id: str) -> bool:
        """Whether any kept event is about this Environment."""
        with self._lock:
            try:
                row = (
                    self._open()
                    .execute("SELECT 1 FROM events WHERE environment_id = ? LIMIT 1", (environment_id,))
                    .fetchone()
                )
            except sqlite3.Error as exc:
                raise self._error(exc) from None
        return row is not None

    def _wake(self) -> None:
        for loop, event in list(self._waiters):
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed: its follower is gone
                self._waiters.discard((loop, event))

    def prune(self) -> int:
        """Drop every event older than the newest ``retention`` now; returns how many were dropped."""
        with self._lock:
            try:
                latest = self._latest()
                cursor = self._open().execute("DELETE FROM events WHERE revision <= ?", (latest - self.retention,))
            except sqlite3.Error as exc:
                raise self._error(exc) from None
        return cursor.rowcount

    # --- reading ----------------------------------------------------------------------------------------------

    def _latest(self) -> int:
        # The sequence, not MAX(revision): the last number handed out, even when its row was dropped.
        row = self._open().execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        return int(row[0]) if row is not None else 0

    def latest(self) -> int:
        """The last revision handed out (0 before the first event)."""
        with self._lock:
            try:
                return self._latest()
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    def oldest(self) -> int:
        """The oldest revision still kept, or 0 when the log is empty."""
        with self._lock:
            try:
                row = self._open().execute("SELECT MIN(revision) FROM events").fetchone()
            except sqlite3.Error as exc:
                raise self._error(exc) from None
        return int(row[0]) if row is not None and row[0] is not None else 0

    def since(self, revision: int, limit: int = 1000) -> list[dict[str, Any]]:
        """Up to ``limit`` events with a revision above ``revision``, oldest first."""
        with self._lock:
            try:
                rows = (
                    self._open()
                    .execute(
                        "SELECT revision, time, kind, environment_id, machine_id, data FROM events "
                        "WHERE revision > ? ORDER BY revision LIMIT ?",
                        (revision, limit),
                    )
                    .fetchall()
                )
            except sqlite3.Error as exc:
                raise self._error(exc) from None
        return [_row(r) for r in rows]

    def check_resumable(self, from_revision: int) -> None:
        """Refuse a resume point whose following events are no longer kept (they were dropped by retention)."""
        if from_revision < 0:
            raise FailedPreconditionError(f"from_revision must be 0 or a revision seen before, not {from_revision}")
        if from_revision == 0:
            return
        oldest = self.oldest()
        latest = self.latest()
        if from_revision > latest:
            raise FailedPreconditionError(
                f"revision {from_revision} is newer than the last event ({latest}): it is not from this state "
                f"directory's log; resume from 0 (everything kept) or from at most {latest}"
            )
        first_missing = from_revision + 1
        if first_missing <= latest and (oldest == 0 or first_missing < oldest):
            raise FailedPreconditionError(
                f"the events after revision {from_revision} are no longer kept (the log keeps the newest "
                f"{self.retention}; the oldest kept is {oldest or 'none'}); resume from revision "
                f"{max(oldest - 1, 0)} and re-read the state (Environments.List) to cover the gap"
            )

    async def follow(
        self,
        from_revision: int = 0,
        *,
        environment_id: str | None = None,
        kinds: Sequence[str] = (),
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Every event with a revision above ``from_revision``, then live ones, until the caller stops.

        ``environment_id`` keeps only that Environment's events; ``kinds`` keeps only kinds starting with one of
        these prefixes (``"machine."``). Refuses a resume point older than what is kept (``check_resumable``).
        """
        self.check_resumable(from_revision)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        waiter = (loop, wake)
        self._waiters.add(waiter)
        last = from_revision
        try:
            while not self._closed:
                wake.clear()  # before reading: an append after the read sets it again
                batch = self.since(last, _BATCH)
                for event in batch:
                    last = event["revision"]
                    if environment_id is not None and event["environment_id"] != environment_id:
                        continue
                    if kinds and not any(event["kind"].startswith(k) for k in kinds):
                        continue
                    yield event
                if len(batch) == _BATCH:
                    continue
                try:
                    # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that races the wake.
                    async with asyncio.timeout(self.poll_interval):
                        await wake.wait()
                except TimeoutError:
                    pass  # poll: another process may have appended
        finally:
            self._waiters.discard(waiter)

    def close(self) -> None:
        """Close the database connection (followers end at their next wake-up)."""
        self._closed = True
        self._wake()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
