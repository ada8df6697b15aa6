"""The state store: one SQLite database (WAL) under the state directory.

Everything vz knows about projects, Environments, Machines, volumes, worktree bindings and operations lives
here (external driver manifests are kept by ``vz_core.drivers``), and so does the daemon's numbered event log
(table ``events``, written and read only by ``vz_core.daemon._events``) and the network parts it serves (table
``environment_networks``: a version 2 Environment's topology plan and its exports' chosen host ports, written
and read only by ``vz_core.daemon._network``). Rules:

* Ownership is in the keys: a Machine row is keyed by (env_id, machine_id), a volume by (env_id, machine_id,
  name), a binding points at one env_id; deleting an Environment deletes exactly the rows reachable from its
  env_id (foreign keys with ON DELETE CASCADE) and nothing else.
* Every write runs in one ``BEGIN IMMEDIATE`` transaction, so a killed process leaves either the old or the new
  row, never half of one.
* Every mutating command writes an operation record first (kind, pid, plan, current step) and finishes it
  (succeeded / failed / interrupted); a record still "running" whose Environment lock is free belonged to a
  process that died, which is how the next command explains and converges.
* The schema is versioned (table ``schema_version``); ``MIGRATIONS`` are applied in order, once, inside an
  exclusive transaction. A database newer than this code is refused, never modified.
* Secret values are never written here: Machine specs keep secret *references* only; stored errors are masked.
* SQLite errors are translated once, here (``_sqlite_errors``), into ``StoreError`` lines that name the file and
  what to do: busy after the wait (``StoreBusyError``), damaged, unreadable records, the state disk full. A
  zero-length database is refused, never taken as new (that would forget every Environment); a new database is
  built beside its final name and linked into place, so a crash never leaves an empty one behind.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from vz_core.env._errors import ConflictError
from vz_core.env._ids import new_operation_id
from vz_core.env._migrations import MIGRATIONS, Migration
from vz_core.env._records import (
    BadRecord,
    EnvironmentRecord,
    MachineRecord,
    OperationRecord,
    VolumeRecord,
    env_record,
    machine_record,
    operation_record,
    volume_record,
)
from vz_core.errors import UserError
from vz_core.platform.files import NOFOLLOW

__all__ = [
    "MIGRATIONS",
    "EnvironmentRecord",
    "MachineRecord",
    "Migration",
    "OperationRecord",
    "Store",
    "StoreBusyError",
    "StoreError",
    "VolumeRecord",
    "default_store_path",
    "utcnow",
]


class StoreError(UserError):
    """The state database cannot be used (newer schema, damaged or empty file, full disk, unreadable record)."""


class StoreBusyError(StoreError, ConflictError):
    """Another process kept the state database locked for longer than the wait."""


BUSY_TIMEOUT = 30.0
"""Seconds a command waits for another one's write transaction before giving up."""

_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_IOERR, _SQLITE_NOTADB = 5, 6, 11, 13, 10, 26
_LOW_SPACE = 1024 * 1024

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _disk_full(directory: Path) -> bool:
    from vz_core.platform.files import low_on_space

    return low_on_space(directory, _LOW_SPACE)


def _full_error(directory: Path) -> StoreError:
    return StoreError(
        f"the state directory {directory} is full (no space left for the state database); free space on that "
        "filesystem and run the command again"
    )


def _translate(path: Path, exc: sqlite3.Error) -> StoreError:
    """The one mapping of SQLite failures to what the user reads (by error code, never by message text)."""
    code = getattr(exc, "sqlite_errorcode", -1) & 0xFF
    directory = path.parent
    if code in (_SQLITE_FULL, _SQLITE_IOERR) and _disk_full(directory):
        return _full_error(directory)
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StoreBusyError(
            f"the state database {path} stayed locked by another vz process for {BUSY_TIMEOUT:.0f} s; "
            "wait for it to finish (see `vz status`) and run the command again"
        )
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StoreError(
            f"the state database {path} is unusable: it is damaged ({exc}); restore it from a backup, or move it "
            "aside to start afresh (the Machines it recorded must then be removed through their drivers)"
        )
    return StoreError(f"the state database {path} is unusable: {exc}")


def _guarded(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a Store method with SQLite errors translated (``args[0]`` is the Store)."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        store = args[0]
        assert isinstance(store, Store)
        with store._sqlite_errors():
            return method(*args, **kwargs)

    return wrapper


def default_store_path() -> Path:
    """``<state dir>/state.db`` (``$VZ_HOME/state.db`` when VZ_HOME is set)."""
    from vz_core.paths import state_dir

    return state_dir() / "state.db"


def utcnow() -> str:
    """The current UTC time, RFC 3339 with milliseconds."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def _make_private(path: Path) -> None:
    """The database and its -wal, -shm and -journal files readable by their owner only (a database written by
    an older vz was 0644); files of another owner, or links, are left alone. Windows: modes are ACLs there,
    and the files inherit the user profile's (docs/daemon.md, Windows): nothing to do."""
    if sys.platform == "win32":
        return
    for name in (path.name, path.name + "-wal", path.name + "-shm", path.name + "-journal"):
        try:
            if not os.lstat(path.with_name(name)).st_mode & 0o077:
                continue
            fd = os.open(path.with_name(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and st.st_mode & 0o077 and stat.S_ISREG(st.st_mode):
                os.fchmod(fd, 0o600)
        except OSError:
            pass
        finally:
            os.close(fd)


class Store:
    """The state database. One instance per command; not shared between threads."""

    def __init__(self, path: Path | None = None, *, migrations: Sequence[Migration] = MIGRATIONS) -> None:
        self.path = path or default_store_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            size = self.path.stat().st_size if self.path.exists() else None
        except OSError as exc:
            raise StoreError(f"cannot open the state database {self.path}: {exc.strerror or exc}") from None
        if size == 0:
            raise StoreError(
                f"the state database {self.path} is empty (0 bytes; truncated, or written when the disk was full); "
                "vz will not start a new one, which would forget every Environment. Restore it from a backup, or "
                "move it aside to start afresh (the Machines it recorded must then be removed through their drivers)"
            )
        if size is None:
            self._create(migrations)
        _make_private(self.path)
        self._db = self._connect(self.path)
        try:
            with self._sqlite_errors():
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA foreign_keys=ON")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._migrate(migrations)
        except BaseException:
            self._db.close()
            raise

    def _connect(self, path: Path) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None)
        except sqlite3.Error as exc:
            raise _translate(self.path, exc) from None
        db.row_factory = sqlite3.Row
        return db

    def _create(self, migrations: Sequence[Migration]) -> None:
        """Build a new database beside ``path`` and link it into place (a concurrent creator may win)."""
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.new")
        try:
            # 0600 from the first byte: SQLite gives the -wal and -shm it creates the database file's mode.
            os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o600))
            os.chmod(temp, 0o600)  # whatever the umask, and a leftover of a killed creator
            db = self._connect(temp)
            try:
                with self._sqlite_errors():
                    db.execute("PRAGMA journal_mode=WAL")
                    self._migrate(migrations, db)
            finally:
                db.close()
            with suppress(FileExistsError):
                os.link(temp, self.path)
        except OSError as exc:
            if _disk_full(self.path.parent):
                raise _full_error(self.path.parent) from None
            raise StoreError(f"cannot create the state database {self.path}: {exc.strerror or exc}") from None
        finally:
            for leftover in (temp, temp.with_name(temp.name + "-wal"), temp.with_name(temp.name + "-shm")):
                with suppress(OSError):
                    leftover.unlink()

    @contextmanager
    def _sqlite_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.IntegrityError:
            raise  # a constraint the caller checks for (unique names): not a broken database
        except sqlite3.Error as exc:
            raise _translate(self.path, exc) from None
        except BadRecord as exc:
            raise StoreError(
                f"the state database {self.path} holds an unreadable record ({exc}); restore the database from a "
                "backup, or move it aside to start afresh (the Machines it recorded must then be removed through "
                "their drivers)"
            ) from None

    # --- plumbing -------------------------------------------------------------------------------------------

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: BEGIN IMMEDIATE … COMMIT, rolled back on any exception."""
        with self._sqlite_errors():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                with suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error:
                with suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                raise

    @_guarded
    def schema_version(self) -> int:
        return self._schema_version(self._db)

    @staticmethod
    def _schema_version(db: sqlite3.Connection) -> int:
        row = db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
        return int(row[0])

    def _migrate(self, migrations: Sequence[Migration], db: sqlite3.Connection | None = None) -> None:
        db = db or self._db
        latest = max((m.version for m in migrations), default=0)
        exists = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'").fetchone()
        if exists and self._schema_version(db) == latest:
            return
        db.execute("BEGIN EXCLUSIVE")
        try:
            db.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                "version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            current = self._schema_version(db)
            if current > latest:
                raise StoreError(
                    f"the state database {self.path} has schema version {current}, newer than this vz understands "
                    f"({latest}); upgrade vz (or point VZ_HOME elsewhere)"
                )
            for migration in sorted(migrations, key=lambda m: m.version):
                if migration.version <= current:
                    continue
                for statement in migration.statements:
                    db.execute(statement)
                db.execute(
                    "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
                    (migration.version, migration.description, utcnow()),
                )
        except BaseException:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # --- projects and environments ----------------------------------------------------------------------------

    def touch_project(self, db: sqlite3.Connection, project_id: str, definition_path: str) -> None:
        now = utcnow()
        db.execute(
            "INSERT INTO projects (project_id, definition_path, created_at, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (project_id) DO UPDATE SET definition_path = excluded.definition_path, "
            "updated_at = excluded.updated_at",
            (project_id, definition_path, now, now),
        )

    @_guarded
    def environments(self, project_id: str | None = None) -> list[EnvironmentRecord]:
        """The Environments of a project (or of every project), oldest first."""
        if project_id is None:
            rows = self._db.execute("SELECT * FROM environments ORDER BY project_id, created_at, env_id")
        else:
            rows = self._db.execute(
                "SELECT * FROM environments WHERE project_id = ? ORDER BY created_at, env_id", (project_id,)
            )
        return [env_record(r) for r in rows]

    @_guarded
    def environment(self, env_id: str) -> EnvironmentRecord | None:
        row = self._db.execute("SELECT * FROM environments WHERE env_id = ?", (env_id,)).fetchone()
        return env_record(row) if row else None

    def create_environment(
        self,
        db: sqlite3.Connection,
        *,
        env_id: str,
        project_id: str,
        name: str,
        worktree: str,
        default_machine: str | None,
    ) -> EnvironmentRecord:
        now = utcnow()
        db.execute(
            "INSERT INTO environments (env_id, project_id, name, state, worktree, default_machine, created_at, "
            "updated_at) VALUES (?, ?, ?, 'creating', ?, ?, ?, ?)",
            (env_id, project_id, name, worktree, default_machine, now, now),
        )
        record = self.environment(env_id)
        assert record is not None
        return record

    def set_environment(
        self, db: sqlite3.Connection, env_id: str, *, state: str | None = None, default_machine: str | None = None
    ) -> None:
        if state is not None:
            db.execute("UPDATE environments SET state = ?, updated_at = ? WHERE env_id = ?", (state, utcnow(), env_id))
        if default_machine is not None:
            db.execute(
                "UPDATE environments SET default_machine = ?, updated_at = ? WHERE env_id = ?",
                (default_machine or None, utcnow(), env_id),
            )

    def delete_environment(self, db: sqlite3.Connection, env_id: str) -> None:
        """Remove the Environment and everything keyed by its id (machines, bindings, volumes not kept)."""
        db.execute("DELETE FROM volumes WHERE env_id = ? AND state != 'kept'", (env_id,))
        db.execute("DELETE FROM environments WHERE env_id = ?", (env_id,))

    # --- bindings ---------------------------------------------------------------------------------------------

    @_guarded
    def binding(self, project_id: str, worktree: str) -> str | None:
        """The first env_id this worktree was bound to, if any (``bindings_here`` lists them all)."""
        row = self._db.execute(
            "SELECT env_id FROM bindings WHERE project_id = ? AND worktree = ? ORDER BY created_at, env_id",
            (project_id, worktree),
        ).fetchone()
        return str(row[0]) if row else None

    def bind(self, db: sqlite3.Connection, project_id: str, worktree: str, env_id: str) -> None:
        db.execute(
            "INSERT OR IGNORE INTO bindings (project_id, worktree, env_id, created_at) VALUES (?, ?, ?, ?)",
            (project_id, worktree, env_id, utcnow()),
        )

    @_guarded
    def bindings_here(self, project_id: str, worktree: str) -> list[str]:
        """Every env_id this worktree is bound to (a worktree may own several Environments)."""
        rows = self._db.execute(
            "SELECT env_id FROM bindings WHERE project_id = ? AND worktree = ? ORDER BY created_at, env_id",
            (project_id, worktree),
        )
        return [str(r[0]) for r in rows]

    @_guarded
    def project_bindings(self, project_id: str) -> dict[str, list[str]]:
        """env_id → the worktrees bound to it, for every bound Environment of the project."""
        out: dict[str, list[str]] = {}
        rows = self._db.execute(
            "SELECT env_id, worktree FROM bindings WHERE project_id = ? ORDER BY worktree", (project_id,)
        )
        for env_id, worktree in rows:
            out.setdefault(str(env_id), []).append(str(worktree))
        return out

    @_guarded
    def bound_env_ids(self, project_id: str) -> set[str]:
        rows = self._db.execute("SELECT DISTINCT env_id FROM bindings WHERE project_id = ?", (project_id,))
        return {str(r[0]) for r in rows}

    @_guarded
    def bindings_of(self, env_id: str) -> list[str]:
        rows = self._db.execute("SELECT worktree FROM bindings WHERE env_id = ? ORDER BY worktree", (env_id,))
        return [str(r[0]) for r in rows]

    # --- machines and volumes ---------------------------------------------------------------------------------

    @_guarded
    def machines(self, env_id: str) -> list[MachineRecord]:
        rows = self._db.execute("SELECT * FROM machines WHERE env_id = ? ORDER BY created_at, name", (env_id,))
        return [machine_record(r) for r in rows]

    @_guarded
    def machine(self, env_id: str, machine_id: str) -> MachineRecord | None:
        row = self._db.execute(
            "SELECT * FROM machines WHERE env_id = ? AND machine_id = ?", (env_id, machine_id)
        ).fetchone()
        return machine_record(row) if row else None

    def put_machine(
        self,
        db: sqlite3.Connection,
        *,
        env_id: str,
        machine_id: str,
        name: str,
        workspace_id: str,
        driver: str,
        spec: dict[str, Any],
        state: str,
    ) -> None:
        """Insert or replace the Machine row (identity columns never change once written)."""
        now = utcnow()
        db.execute(
            "INSERT INTO machines (env_id, machine_id, name, workspace_id, driver, spec, state, created_at, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (env_id, machine_id) DO UPDATE SET driver = excluded.driver, spec = excluded.spec, "
            "state = excluded.state, updated_at = excluded.updated_at",
            (env_id, machine_id, name, workspace_id, driver, json.dumps(spec, sort_keys=True), state, now, now),
        )

    def set_machine_state(self, db: sqlite3.Connection, env_id: str, machine_id: str, state: str) -> None:
        db.execute(
            "UPDATE machines SET state = ?, updated_at = ? WHERE env_id = ? AND machine_id = ?",
            (state, utcnow(), env_id, machine_id),
        )

    def delete_machine(
        self, db: sqlite3.Connection, env_id: str, machine_id: str, *, with_volumes: bool = True
    ) -> None:
        """Remove a Machine's record; its volume records go too (unless marked kept, or ``with_volumes`` is
        false: `vz delete` handles them after the Machines)."""
        if with_volumes:
            db.execute(
                "DELETE FROM volumes WHERE env_id = ? AND machine_id = ? AND state != 'kept'", (env_id, machine_id)
            )
        db.execute("DELETE FROM machines WHERE env_id = ? AND machine_id = ?", (env_id, machine_id))

    @_guarded
    def volumes(self, env_id: str, machine_id: str | None = None) -> list[VolumeRecord]:
        if machine_id is None:
            rows = self._db.execute("SELECT * FROM volumes WHERE env_id = ? ORDER BY machine_id, name", (env_id,))
        else:
            rows = self._db.execute(
                "SELECT * FROM volumes WHERE env_id = ? AND machine_id = ? ORDER BY name", (env_id, machine_id)
            )
        return [volume_record(r) for r in rows]

    @_guarded
    def all_volumes(self) -> list[VolumeRecord]:
        """Every recorded volume of every project: those of existing Machines (``attached``) and the kept ones."""
        rows = self._db.execute("SELECT * FROM volumes ORDER BY state, backend_name")
        return [volume_record(r) for r in rows]

    @_guarded
    def kept_volumes(self, project_id: str | None = None) -> list[VolumeRecord]:
        """Volumes kept after their Environment or Machine was deleted (``vz volume list``)."""
        if project_id is None:
            rows = self._db.execute("SELECT * FROM volumes WHERE state = 'kept' ORDER BY backend_name")
        else:
            rows = self._db.execute(
                "SELECT * FROM volumes WHERE state = 'kept' AND project_id = ? ORDER BY backend_name", (project_id,)
            )
        return [volume_record(r) for r in rows]

    def put_volume(
        self,
        db: sqlite3.Connection,
        env_id: str,
        machine_id: str,
        name: str,
        backend_name: str,
        *,
        project_id: str = "",
        driver: str = "",
        driver_options: dict[str, Any] | None = None,
    ) -> None:
        db.execute(
            "INSERT OR IGNORE INTO volumes (env_id, machine_id, name, backend_name, created_at, project_id, driver, "
            "driver_options) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                env_id,
                machine_id,
                name,
                backend_name,
                utcnow(),
                project_id,
                driver,
                json.dumps(driver_options or {}, sort_keys=True),
            ),
        )

    def delete_operations(self, db: sqlite3.Connection, env_id: str) -> int:
        """Forget an Environment's operation records (once the Environment itself is deleted); how many."""
        return db.execute("DELETE FROM operations WHERE env_id = ?", (env_id,)).rowcount

    @_guarded
    def volume(self, backend_name: str) -> VolumeRecord | None:
        row = self._db.execute("SELECT * FROM volumes WHERE backend_name = ?", (backend_name,)).fetchone()
        return volume_record(row) if row else None

    def keep_volume(self, db: sqlite3.Connection, backend_name: str) -> None:
        db.execute("UPDATE volumes SET state = 'kept' WHERE backend_name = ?", (backend_name,))

    def forget_volume(self, db: sqlite3.Connection, backend_name: str) -> None:
        db.execute("DELETE FROM volumes WHERE backend_name = ?", (backend_name,))

    # --- operations -------------------------------------------------------------------------------------------

    def begin_operation(
        self, db: sqlite3.Connection, *, env_id: str, project_id: str, kind: str, plan: Any = None
    ) -> str:
        op_id = new_operation_id()
        db.execute(
            "INSERT INTO operations (op_id, env_id, project_id, kind, status, pid, plan, started_at) "
            "VALUES (?, ?, ?, ?, 'running', ?, ?, ?)",
            (op_id, env_id, project_id, kind, os.getpid(), json.dumps(plan) if plan is not None else None, utcnow()),
        )
        return op_id

    def set_operation_plan(self, db: sqlite3.Connection, op_id: str, plan: Any) -> None:
        db.execute("UPDATE operations SET plan = ? WHERE op_id = ?", (json.dumps(plan), op_id))

    def operation_step(self, db: sqlite3.Connection, op_id: str, step: str) -> None:
        db.execute("UPDATE operations SET step = ? WHERE op_id = ?", (step, op_id))

    def finish_operation(self, db: sqlite3.Connection, op_id: str, status: str, error: str = "") -> None:
        db.execute(
            "UPDATE operations SET status = ?, error = ?, finished_at = ? WHERE op_id = ?",
            (status, error, utcnow(), op_id),
        )

    @_guarded
    def operation(self, op_id: str) -> OperationRecord | None:
        row = self._db.execute("SELECT * FROM operations WHERE op_id = ?", (op_id,)).fetchone()
        return operation_record(row) if row else None

    @_guarded
    def operations(self, env_id: str, *, status: str | None = None) -> list[OperationRecord]:
        """Operation records of an Environment, oldest first."""
        if status is None:
            rows = self._db.execute("SELECT * FROM operations WHERE env_id = ? ORDER BY started_at, rowid", (env_id,))
        else:
            rows = self._db.execute(
                "SELECT * FROM operations WHERE env_id = ? AND status = ? ORDER BY started_at, rowid", (env_id, status)
            )
        return [operation_record(r) for r in rows]
