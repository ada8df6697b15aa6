"""The record book of an agent-Machine driver: one directory and one JSON record per Machine.

Layout under the driver state root (``<state>``); a backend adds its own entries (see its docs)::

    <state>/locks/<key>.lock             one advisory lock per Machine (cross-process)
    <state>/machines/<key>/record.json   the Machine's creation-time contract and last known state (0600)
    <state>/machines/<key>/chan/         host side of the Machine's agent channel (never visible inside it)
    <state>/machines/<key>/run/          the backend's runtime files of the current start
    <state>/machines/<key>/main.log      the main process's log kept on the host once the Machine stopped
    <state>/volumes/<vkey>/              named volumes (``data/`` plus a ``name`` file); they outlive Machines

``<key>`` is a SHA-256 prefix of the workspace id, so ids with ``/``, ``..``, spaces or unicode never become
paths (and are safe as runc container ids).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from vz_drivers._files import atomic_write, host_write_error, subpath

__all__ = ["MachinePaths", "MachineRecord", "MountRecord", "RecordBook", "machine_key", "subpath", "volume_key"]

RECORD_VERSION = 1


def machine_key(workspace_id: str) -> str:
    """A filesystem- and runc-safe key for a workspace id (32 hex chars)."""
    return hashlib.sha256(workspace_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def volume_key(name: str) -> str:
    """A filesystem-safe key for a volume name."""
    return hashlib.sha256(b"volume\0" + name.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True)
class MountRecord:
    """A mount as realized: ``type`` is "bind", "volume" or "tmpfs"; ``host_path`` is what the backend shares."""

    type: str
    source: str
    target: str
    read_only: bool = False
    host_path: str = ""
    options: tuple[str, ...] = ()
    guest_target: str = ""
    """``target`` with the image's symlinks resolved inside its root filesystem (backends that need it)."""


@dataclass(kw_only=True)
class MachineRecord:
    """Everything needed to (re)start a Machine and to answer Find/ReusePreflight without the backend.

    Backends subclass it with their own fields. ``pid`` and ``pid_start`` name the process whose life is the
    Machine's (runc's init, QEMU): the Machine runs while that process (same kernel start time) lives.
    ``environment`` holds secret values: it lives in memory only (``to_json`` writes none of them; the values
    are kept by ``SecretKeeper``), the file keeps ``environment_names``.
    """

    LEGACY_NAMES: ClassVar[dict[str, str]] = {}
    """Field names older records used, mapped to today's (read only)."""

    workspace_id: str
    key: str
    machine_id: str
    created_at: str
    image_ref: str
    image_digest: str
    argv: list[str]
    environment: dict[str, str]
    environment_names: list[str] = field(default_factory=list)
    """The names of ``environment`` (what the record file says of it)."""
    image_env: list[str]
    working_dir: str
    user: str
    developer_identity: str
    identity_uid: int = 0
    identity_gid: int = 0
    labels: dict[str, str]
    mounts: list[MountRecord]
    cpus: int
    memory_bytes: int
    egress: str
    status: str = "stopped"
    started_at: str = ""
    pid: int = 0
    pid_start: int = 0
    exit_code: int = 0
    error: str = ""
    version: int = RECORD_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        # Environment values are secrets: never at rest (see ``SecretKeeper``).
        data["environment_names"] = sorted(set(self.environment_names) | set(self.environment))
        data["environment"] = {}
        data["mounts"] = [dataclasses.asdict(m) for m in self.mounts]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MachineRecord:
        raw = {cls.LEGACY_NAMES.get(k, k): v for k, v in data.items()}
        raw["mounts"] = [MountRecord(**{**m, "options": tuple(m.get("options", ()))}) for m in raw.get("mounts", [])]
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


@dataclass(frozen=True)
class MachinePaths:
    """Host paths of one Machine; backends subclass it with their own."""

    root: Path

    record = subpath("record.json")
    chan = subpath("chan")
    """Host side of the agent channel: a directory no Machine can see or write."""
    run = subpath("run")
    kept_log = subpath("main.log")
    """The main process's log as kept on the host (written by the host only)."""


R = TypeVar("R", bound=MachineRecord)
P = TypeVar("P", bound=MachinePaths)


class RecordBook(Generic[R, P]):
    """The driver's state root: Machine records, locks and volumes."""

    def __init__(self, root: Path, record_type: type[R], paths_type: type[P]) -> None:
        self.root = root
        self._record_type = record_type
        self._paths_type = paths_type

    machines_dir = subpath("machines")
    volumes_dir = subpath("volumes")
    locks_dir = subpath("locks")

    def ensure(self, *extra: Path) -> None:
        for d in (self.root, self.machines_dir, self.volumes_dir, self.locks_dir, *extra):
            try:
                d.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise host_write_error(d, exc) from None

    def paths(self, key: str) -> P:
        return self._paths_type(self.machines_dir / key)

    def load(self, key: str) -> R | None:
        """The record of a Machine, or None when it does not exist (or was half-written by a crash)."""
        try:
            data = json.loads(self.paths(key).record.read_bytes())
        except (OSError, ValueError):
            return None
        record = self._record_type.from_json(data)
        assert isinstance(record, self._record_type)
        return record

    def save(self, record: R) -> None:
        """Write the record atomically; ``UnavailableError`` naming the file when the host cannot."""
        paths = self.paths(record.key)
        try:
            paths.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise host_write_error(paths.root, exc) from None
        atomic_write(paths.record, json.dumps(record.to_json(), sort_keys=True, indent=1).encode())

    def records(self) -> Iterator[R]:
        """Every Machine record on disk."""
        if not self.machines_dir.is_dir():
            return
        for entry in sorted(self.machines_dir.iterdir()):
            record = self.load(entry.name)
            if record is not None:
                yield record

    def volume_dir(self, name: str) -> Path:
        return self.volumes_dir / volume_key(name)

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """Hold the cross-process lock ``key`` (blocking; callers run it in a thread)."""
        from vz_core.platform.locks import lock_file

        self.locks_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.locks_dir / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            lock_file(fd)
            yield
        finally:
            os.close(fd)
