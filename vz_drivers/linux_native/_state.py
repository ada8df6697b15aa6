"""On-disk state of the linux_native driver: one directory and one JSON record per Machine.

Layout under the driver state root (``<state>``)::

    <state>/trust.json                   trusted runc path and SHA-256 (trust on first use, or configured)
    <state>/runc/                        ``runc --root``: runc's own container state, never the system's
    <state>/locks/<key>.lock             one advisory lock per Machine (cross-process)
    <state>/machines/<key>/record.json   the Machine's creation-time contract and last known state (0600)
    <state>/machines/<key>/upper|work/   the Machine-local root layer (overlayfs upper and work dirs)
    <state>/machines/<key>/rootfs/       mount point of the merged root filesystem while the Machine runs
    <state>/machines/<key>/bundle/       generated OCI runtime spec (config.json)
    <state>/machines/<key>/run/          bind-mounted at /.vz/run inside: guest agent socket and main log
    <state>/machines/<key>/etc/          generated files bind-mounted inside (meminfo, hosts, resolv.conf)
    <state>/volumes/<vkey>/              named volumes (``data/`` plus a ``name`` file); they outlive Machines

``<key>`` is a SHA-256 of the workspace id, so ids with ``/``, ``..``, spaces or unicode never become paths.
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

__all__ = ["MachinePaths", "MachineRecord", "MountRecord", "StateStore", "machine_key", "volume_key"]

RECORD_VERSION = 1


def machine_key(workspace_id: str) -> str:
    """A filesystem- and runc-safe key for a workspace id (hex, 32 chars)."""
    return hashlib.sha256(workspace_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def volume_key(name: str) -> str:
    """A filesystem-safe key for a volume name."""
    return hashlib.sha256(b"volume\0" + name.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True)
class MountRecord:
    """A mount as realized: ``type`` is "bind", "volume" or "tmpfs"; ``host_path`` is what gets bind-mounted."""

    type: str
    source: str
    target: str
    read_only: bool = False
    host_path: str = ""
    options: tuple[str, ...] = ()


@dataclass
class MachineRecord:
    """Everything needed to (re)start a Machine and to answer Find/ReusePreflight without the backend.

    ``environment`` holds secret values: the record file is created mode 0600 and never logged.
    """

    workspace_id: str
    key: str
    machine_id: str
    container_id: str
    created_at: str
    image_ref: str
    image_digest: str
    lower_dir: str
    argv: list[str]
    environment: dict[str, str]
    image_env: list[str]
    working_dir: str
    user: str
    uid: int
    gid: int
    additional_gids: list[int]
    developer_identity: str
    identity_uid: int
    identity_gid: int
    labels: dict[str, str]
    mounts: list[MountRecord]
    cpus: int
    cpuset: str
    memory_bytes: int
    profile: str
    egress: str
    cap_add: list[str]
    privileged: bool
    no_new_privileges: bool
    status: str = "stopped"
    started_at: str = ""
    init_pid: int = 0
    init_start_time: int = 0
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
    def upper(self) -> Path:
        return self.root / "upper"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def rootfs(self) -> Path:
        return self.root / "rootfs"

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def socket(self) -> Path:
        return self.run / "agent.sock"

    @property
    def log(self) -> Path:
        return self.run / "main.log"

    @property
    def agent_stderr(self) -> Path:
        return self.root / "agent.stderr"

    @property
    def runc_log(self) -> Path:
        return self.root / "runc.log"


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same dir, fsync, rename)."""
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
    """The driver's state root: Machine records, locks, volumes and runc's state directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def runc_root(self) -> Path:
        return self.root / "runc"

    @property
    def trust_file(self) -> Path:
        return self.root / "trust.json"

    @property
    def machines_dir(self) -> Path:
        return self.root / "machines"

    @property
    def volumes_dir(self) -> Path:
        return self.root / "volumes"

    def ensure(self) -> None:
        for d in (self.root, self.runc_root, self.machines_dir, self.volumes_dir, self.root / "locks"):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)

    def paths(self, key: str) -> MachinePaths:
        return MachinePaths(self.machines_dir / key)

    def load(self, key: str) -> MachineRecord | None:
        """The record of a Machine, or None when it does not exist (or was half-written by a crash)."""
        try:
            data = json.loads(self.paths(key).record.read_bytes())
        except FileNotFoundError:
            return None
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

    @contextlib.contextmanager
    def global_lock(self) -> Iterator[None]:
        """Serialize allocations shared by all Machines (subnets, host firewall table)."""
        self.ensure()
        fd = os.open(self.root / "locks" / "global.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
