"""On-disk state of the fake driver: one directory per Machine, a JSON record, per-workspace locks.

Layout under the state directory::

    machines/<key>/machine.json   the record (written atomically: temp file + os.replace)
    machines/<key>/root/          Machine-local data (survives stop/start, gone on recreation/delete)
    machines/<key>/log            merged output of the Machine's main process (bounded tail)
    locks/<sha256(key)>.lock      fcntl lock serializing mutations across processes

``<key>`` is the SHA-256 of the workspace id, so ids containing ``/``, ``..``, spaces or unicode never reach
a path. New Machines are assembled in a staging directory and renamed into place, and removed ones are
renamed away before deletion, so a crash never leaves a half-made Machine under its key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import sys
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from vz_core.errors import RuntimeFailureError, UnavailableError
from vz_core.platform.locks import lock_file

__all__ = ["MachineRecord", "MachineStore", "atomic_write"]

RECORD_VERSION = 1
_LOCK_TIMEOUT = 60.0


@dataclass
class MachineRecord:
    """What the fake remembers about one Machine.

    Only the names of the main process's environment variables are kept (``environment_names``): every value
    is a secret, and the values live in the driver's memory (``FakeDriver``), never on disk. A record written
    by an older fake still holding ``environment`` values is read with them in ``legacy_environment`` (never
    written back) and rewritten without them.
    """

    workspace_id: str
    id: str
    created_at: str
    started_at: str
    status: Literal["running", "stopped"]
    image: str
    labels: dict[str, str]
    user: str
    working_dir: str
    identity: str
    mount_policy: list[dict[str, str]] = field(default_factory=list)
    mounts: list[dict[str, str]] = field(default_factory=list)
    entrypoint: str = ""
    args: list[str] = field(default_factory=list)
    environment_names: list[str] = field(default_factory=list)
    # The running main process (pid = its process group) and its start time; 0 when none runs.
    main_pid: int = 0
    main_started: float = 0.0
    # Set only under the "find-stale-status" fault: the status Find reports instead of ``status``.
    reported_status: Literal["running", "stopped", ""] = ""
    # Not part of the record: the values found in an old record (see above); None when it had none.
    legacy_environment: dict[str, str] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> bytes:
        data = asdict(self)
        del data["legacy_environment"]
        return json.dumps({"version": RECORD_VERSION, **data}, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> MachineRecord:
        data: dict[str, Any] = json.loads(raw)
        version = data.pop("version", None)
        if version != RECORD_VERSION:
            raise ValueError(f"record version {version!r}, expected {RECORD_VERSION}")
        data.pop("legacy_environment", None)
        legacy = data.pop("environment", None)
        if legacy is not None:
            if not isinstance(legacy, dict):
                raise ValueError("environment: expected an object")
            data.setdefault("environment_names", sorted(legacy))
        record = cls(**data)
        if legacy is not None:
            record.legacy_environment = {str(k): str(v) for k, v in legacy.items()}
        return record


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class MachineStore:
    """Paths, records and locks of the Machines under one state directory.

    ``raw_id_paths`` implements the fault mode of the same name: keys are the raw id with "/" replaced by
    "_" (prefixed so that ".." stays a plain name), which makes distinct ids collide.
    """

    def __init__(
        self,
        root: Path,
        *,
        raw_id_paths: bool = False,
        keep_legacy_environment: Callable[[str, MachineRecord], None] | None = None,
    ) -> None:
        self.root = root
        # Called with an old record's values (``legacy_environment``) before it is rewritten without them.
        self._keep_legacy_environment = keep_legacy_environment
        self._machines = root / "machines"
        self._lock_dir = root / "locks"
        self._raw_id_paths = raw_id_paths
        # Per event loop: an asyncio.Lock belongs to the loop it first waited on, and one driver object may
        # outlive a loop (a test session running each test in a fresh loop).
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
            weakref.WeakKeyDictionary()
        )

    def key(self, workspace_id: str) -> str:
        if self._raw_id_paths:
            return "raw-" + workspace_id.replace("/", "_")
        return _sha256(workspace_id)

    def machine_dir(self, key: str) -> Path:
        return self._machines / key

    def root_dir(self, key: str) -> Path:
        return self.machine_dir(key) / "root"

    def _record_path(self, key: str) -> Path:
        return self.machine_dir(key) / "machine.json"

    def read(self, key: str) -> MachineRecord | None:
        """The record under ``key``, or None. Lock-free: records are only ever replaced atomically."""
        path = self._record_path(key)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            record = MachineRecord.from_json(raw)
        except (ValueError, TypeError) as exc:
            raise RuntimeFailureError(
                f"the fake driver's record {path} is unreadable; delete the directory {path.parent} to discard "
                "that Machine",
                runtime_message=str(exc),
            ) from exc
        if record.legacy_environment is not None:
            # An older fake's record holding environment values: rewrite it at once with the names only.
            # Only if it is still the same file (another process may have replaced it since it was read).
            if self._keep_legacy_environment is not None and record.legacy_environment:
                self._keep_legacy_environment(key, record)
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                if path.read_bytes() == raw:
                    atomic_write(path, record.to_json())
        return record

    def write(self, key: str, record: MachineRecord) -> None:
        """Replace the record of an existing Machine atomically."""
        atomic_write(self._record_path(key), record.to_json())

    def install(self, key: str, record: MachineRecord) -> Path | None:
        """Create (or replace) the Machine under ``key``: fresh directory, empty ``root/``, the record.

        Call with the key's lock held. Returns the replaced Machine's directory (renamed away, to pass to
        ``discard``), or None.
        """
        self._machines.mkdir(parents=True, exist_ok=True)
        tag = _sha256(key)[:16]
        self._sweep(tag)
        staging = self._machines / f".new-{tag}-{secrets.token_hex(4)}"
        staging.mkdir(mode=0o755)
        (staging / "root").mkdir(mode=0o755)
        atomic_write(staging / "machine.json", record.to_json())
        old = self._move_away(key, tag)
        os.rename(staging, self.machine_dir(key))
        return old

    def remove(self, key: str) -> Path | None:
        """Take the Machine under ``key`` out of place (call with its lock held).

        Returns the renamed directory to pass to ``discard`` (None when there was no Machine).
        """
        return self._move_away(key, _sha256(key)[:16])

    @staticmethod
    async def discard(path: Path | None) -> None:
        """Delete a directory returned by ``install``/``remove`` (in a thread: it may be large)."""
        if path is not None:
            await asyncio.to_thread(_rmtree, path)

    def _move_away(self, key: str, tag: str) -> Path | None:
        target = self._machines / f".old-{tag}-{secrets.token_hex(4)}"
        try:
            os.rename(self.machine_dir(key), target)
        except FileNotFoundError:
            return None
        return target

    def _sweep(self, tag: str) -> None:
        # Leftovers of an operation on this key that crashed half-way (we hold the key's lock).
        for prefix in (".new-", ".old-"):
            for leftover in self._machines.glob(f"{prefix}{tag}-*"):
                _rmtree(leftover)

    @contextlib.asynccontextmanager
    async def locked(self, key: str, *, cross_process: bool = True) -> AsyncIterator[None]:
        """Hold the key's lock: an asyncio lock in this process and, by default, an fcntl lock across processes."""
        locks = self._locks.setdefault(asyncio.get_running_loop(), {})
        lock = locks.setdefault(key, asyncio.Lock())
        async with lock:
            if not cross_process:
                yield
                return
            self._lock_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_dir / f"{_sha256(key)}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                await _flock(fd)
                yield
            finally:
                os.close(fd)  # releases the fcntl lock


async def _flock(fd: int) -> None:
    # Non-blocking attempts: a blocking flock would stall the event loop. Contention only comes from another
    # process (this process serializes on the asyncio lock first), so polling is rare and short.
    deadline = time.monotonic() + _LOCK_TIMEOUT
    delay = 0.001
    while True:
        if lock_file(fd, blocking=False):
            return
        if time.monotonic() > deadline:
            raise UnavailableError(
                f"another process has held the fake driver's state lock for {_LOCK_TIMEOUT:.0f} s; retry later"
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + os.replace, mode 0600)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # No fsync: the guarantee needed is "a crashed process never leaves a torn record", which
        # os.replace gives; surviving power loss is not a goal of the fake.
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _rmtree(path: Path) -> None:
    def retry_writable(func: Callable[[str], object], target: str, _exc: BaseException) -> None:
        # Commands may leave read-only directories behind; make the parent writable and retry once.
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            func(target)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry_writable)
    else:
        shutil.rmtree(path, onerror=lambda func, target, info: retry_writable(func, target, info[1]))
