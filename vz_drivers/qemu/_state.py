"""On-disk state of the qemu driver: one directory and one JSON record per Machine.

Layout under the driver state root (``<state>``)::

    <state>/locks/<key>.lock             one advisory lock per Machine (cross-process)
    <state>/machines/<key>/record.json   creation-time contract and the running VM's identity (0600)
    <state>/machines/<key>/disk.img      the root disk: the image's root filesystem as ext4 (Machine-local data)
    <state>/machines/<key>/cfg/          the read-only 9p share "vzcfg": config.sh (0600), hosts, resolv.conf
    <state>/machines/<key>/run/          QEMU's working directory: qmp.sock, agent-<n>.sock, qemu.pid,
                                         console.log, port-<n>.lock (which host process holds which port)
    <state>/volumes/<vkey>/data          named volumes, shared over 9p; they outlive Machines

``<key>`` is a SHA-256 prefix of the workspace id, so ids with ``/``, ``..``, spaces or unicode never become
paths. QEMU runs detached in its own session: the record (pid plus kernel start time) is how any later driver
process finds it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MachinePaths", "MachineRecord", "MountRecord", "StateStore", "atomic_write", "machine_key", "volume_key"]

RECORD_VERSION = 1


def machine_key(workspace_id: str) -> str:
    """A filesystem-safe key for a workspace id (32 hex chars)."""
    return hashlib.sha256(workspace_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def volume_key(name: str) -> str:
    """A filesystem-safe key for a volume name."""
    return hashlib.sha256(b"volume\0" + name.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True)
class MountRecord:
    """A mount as realized: ``type`` is "bind", "volume" or "tmpfs"; ``host_path`` is what QEMU shares."""

    type: str
    source: str
    target: str
    read_only: bool = False
    host_path: str = ""
    options: tuple[str, ...] = ()
    guest_target: str = ""
    """``target`` with the image's symlinks resolved inside its root filesystem."""


@dataclass
class MachineRecord:
    """Everything needed to (re)boot a Machine and to answer Find/ReusePreflight without the VM.

    ``environment`` holds secret values: the record is written mode 0600 and never logged.
    """

    workspace_id: str
    key: str
    machine_id: str
    created_at: str
    image_ref: str
    image_digest: str
    argv: list[str]
    environment: dict[str, str]
    image_env: list[str]
    working_dir: str
    user: str
    developer_identity: str
    labels: dict[str, str]
    mounts: list[MountRecord]
    cpus: int
    memory_bytes: int
    disk_bytes: int
    egress: str
    accelerator: str = ""
    status: str = "stopped"
    started_at: str = ""
    qemu_pid: int = 0
    qemu_start_time: int = 0
    exit_code: int = 0
    error: str = ""
    version: int = RECORD_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["mounts"] = [dataclasses.asdict(m) for m in self.mounts]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MachineRecord:
        raw = dict(data)
        raw["mounts"] = [MountRecord(**{**m, "options": tuple(m.get("options", ()))}) for m in raw.get("mounts", [])]
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


@dataclass(frozen=True)
class MachinePaths:
    """Host paths of one Machine."""

    root: Path

    @property
    def record(self) -> Path:
        return self.root / "record.json"

    @property
    def disk(self) -> Path:
        return self.root / "disk.img"

    @property
    def new_disk(self) -> Path:
        """Where a replacement root disk is built before the old Machine is touched (recreation)."""
        return self.root / "disk.img.new"

    @property
    def cfg(self) -> Path:
        return self.root / "cfg"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def qmp(self) -> Path:
        return self.run / "qmp.sock"

    @property
    def pidfile(self) -> Path:
        return self.run / "qemu.pid"

    @property
    def console(self) -> Path:
        return self.run / "console.log"

    def agent_socket(self, port: int) -> Path:
        return self.run / f"agent-{port}.sock"

    def port_lock(self, port: int) -> Path:
        return self.run / f"port-{port}.lock"


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class StateStore:
    """The driver's state root: Machine records, locks and volumes."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def machines_dir(self) -> Path:
        return self.root / "machines"

    @property
    def volumes_dir(self) -> Path:
        return self.root / "volumes"

    def ensure(self) -> None:
        for d in (self.root, self.machines_dir, self.volumes_dir, self.root / "locks"):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)

    def paths(self, key: str) -> MachinePaths:
        return MachinePaths(self.machines_dir / key)

    def load(self, key: str) -> MachineRecord | None:
        """The record of a Machine, or None when it does not exist (or was half-written by a crash)."""
        try:
            data = json.loads(self.paths(key).record.read_bytes())
        except (OSError, ValueError):
            return None
        return MachineRecord.from_json(data)

    def save(self, record: MachineRecord) -> None:
        paths = self.paths(record.key)
        paths.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(paths.record, json.dumps(record.to_json(), sort_keys=True, indent=1).encode())

    def records(self) -> Iterator[MachineRecord]:
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
        """Hold the cross-process lock of one Machine (blocking; callers run it in a thread)."""
        lock_dir = self.root / "locks"
        lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(lock_dir / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
