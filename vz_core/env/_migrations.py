"""The state store's schema, as numbered migrations applied in order, once (``vz_core.env._store`` applies them)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIGRATIONS", "Migration"]


@dataclass(frozen=True)
class Migration:
    """One schema step: applied once, in order, in one exclusive transaction."""

    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "projects, environments, machines, volumes, bindings, operations",
        (
            """CREATE TABLE projects (
                project_id TEXT PRIMARY KEY,
                definition_path TEXT NOT NULL,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL)""",
            """CREATE TABLE environments (
                env_id TEXT PRIMARY KEY,
                project_id TEXT NOT NULL REFERENCES projects(project_id),
                name TEXT NOT NULL,
                state TEXT NOT NULL,
                worktree TEXT NOT NULL,
                default_machine TEXT,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL,
                UNIQUE (project_id, name))""",
            """CREATE TABLE machines (
                env_id TEXT NOT NULL REFERENCES environments(env_id) ON DELETE CASCADE,
                machine_id TEXT NOT NULL UNIQUE,
                name TEXT NOT NULL,
                workspace_id TEXT NOT NULL UNIQUE,
                driver TEXT NOT NULL,
                spec TEXT NOT NULL,
                state TEXT NOT NULL,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL,
                PRIMARY KEY (env_id, machine_id),
                UNIQUE (env_id, name))""",
            """CREATE TABLE volumes (
                env_id TEXT NOT NULL,
                machine_id TEXT NOT NULL,
                name TEXT NOT NULL,
                backend_name TEXT NOT NULL UNIQUE,
                created_at TEXT NOT NULL,
                PRIMARY KEY (env_id, machine_id, name),
                FOREIGN KEY (env_id, machine_id) REFERENCES machines(env_id, machine_id) ON DELETE CASCADE)""",
            """CREATE TABLE bindings (
                project_id TEXT NOT NULL,
                worktree TEXT NOT NULL,
                env_id TEXT NOT NULL REFERENCES environments(env_id) ON DELETE CASCADE,
                created_at TEXT NOT NULL,
                PRIMARY KEY (project_id, worktree))""",
            """CREATE TABLE operations (
                op_id TEXT PRIMARY KEY,
                env_id TEXT NOT NULL,
                project_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                status TEXT NOT NULL,
                pid INTEGER NOT NULL,
                step TEXT NOT NULL DEFAULT '',
                plan TEXT,
                error TEXT NOT NULL DEFAULT '',
                started_at TEXT NOT NULL,
                finished_at TEXT)""",
            "CREATE INDEX operations_env ON operations (env_id, started_at)",
        ),
    ),
    Migration(
        2,
        "one worktree may own several Environments; volumes outlive their Machine's record (kept volumes)",
        (
            """CREATE TABLE bindings_v2 (
                project_id TEXT NOT NULL,
                worktree TEXT NOT NULL,
                env_id TEXT NOT NULL REFERENCES environments(env_id) ON DELETE CASCADE,
                created_at TEXT NOT NULL,
                PRIMARY KEY (project_id, worktree, env_id))""",
            "INSERT INTO bindings_v2 SELECT project_id, worktree, env_id, created_at FROM bindings",
            "DROP TABLE bindings",
            "ALTER TABLE bindings_v2 RENAME TO bindings",
            """CREATE TABLE volumes_v2 (
                env_id TEXT NOT NULL,
                machine_id TEXT NOT NULL,
                name TEXT NOT NULL,
                backend_name TEXT NOT NULL UNIQUE,
                created_at TEXT NOT NULL,
                project_id TEXT NOT NULL DEFAULT '',
                driver TEXT NOT NULL DEFAULT '',
                driver_options TEXT NOT NULL DEFAULT '{}',
                state TEXT NOT NULL DEFAULT 'attached',
                PRIMARY KEY (env_id, machine_id, name))""",
            """INSERT INTO volumes_v2 (env_id, machine_id, name, backend_name, created_at, project_id, driver,
                    driver_options)
                SELECT v.env_id, v.machine_id, v.name, v.backend_name, v.created_at, e.project_id, m.driver,
                    COALESCE(json_extract(m.spec, '$.driver_options'), '{}')
                FROM volumes v JOIN machines m ON m.env_id = v.env_id AND m.machine_id = v.machine_id
                JOIN environments e ON e.env_id = v.env_id""",
            "DROP TABLE volumes",
            "ALTER TABLE volumes_v2 RENAME TO volumes",
        ),
    ),
    Migration(
        3,
        "events: the daemon's numbered event log (vz_core.daemon._events)",
        (
            """CREATE TABLE events (
                revision INTEGER PRIMARY KEY AUTOINCREMENT,
                time TEXT NOT NULL,
                kind TEXT NOT NULL,
                environment_id TEXT,
                machine_id TEXT,
                data TEXT NOT NULL DEFAULT '{}')""",
            "CREATE INDEX events_environment ON events (environment_id, revision)",
        ),
    ),
    Migration(
        4,
        "environment_networks: the topology plan the daemon serves for a version 2 Environment, its export ports",
        (
            """CREATE TABLE environment_networks (
                env_id TEXT PRIMARY KEY REFERENCES environments(env_id) ON DELETE CASCADE,
                plan TEXT NOT NULL,
                ports TEXT NOT NULL DEFAULT '[]',
                updated_at TEXT NOT NULL)""",
        ),
    ),
)
"""Every schema migration, oldest first. Append new ones; never edit an applied one."""
