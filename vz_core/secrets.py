"""Where a Machine's environment values live between its starts: never on disk.

Every environment value of a RunImage request is a secret (the request does not say which are), so no driver
file holds one: records keep only the variable names. The values stay in memory: in the driver process, and
in the kernel's keyring of the driver's user (Linux ``user`` keys in the user keyring, permission of that
user only), so that a driver process started later (a new `vz` command, a relaunched plugin) can start the
Machine again with them. Kernel keys are memory only: they are gone after the host restarts, and a Machine
started then has to be recreated (``vz up --recreate``) to receive its values again. Where the keyring is not
available (macOS and Windows hosts, other kernels, a seccomp filter that forbids it, the user's key quota
exhausted; ``vz_core.platform.keyring``), the values live only in the driver process's memory and a Start from
another process is refused with the same advice.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading

from vz_core.platform.keyring import Keyring

__all__ = ["SecretKeeper"]

_CHUNK = 32000  # a "user" key holds at most 32767 bytes


class SecretKeeper:
    """The environment values of the Machines of one state directory, kept in memory (see the module docstring).

    ``put``/``get``/``drop`` take the Machine's key and id, so that a recreated Machine never receives the
    values of the one it replaced.
    """

    _memory: dict[str, dict[str, str]] = {}
    _lock = threading.Lock()

    def __init__(self, state_root: os.PathLike[str] | str) -> None:
        self._scope = hashlib.sha256(os.fsencode(os.fspath(state_root))).hexdigest()[:16]
        self._keyring = Keyring()

    def _name(self, key: str, machine_id: str) -> str:
        return f"vz:{self._scope}:{key[:32]}:{machine_id}"

    def put(self, key: str, machine_id: str, environment: dict[str, str]) -> bool:
        """Keep ``environment``; True when a later process can read it too (the kernel keyring took it)."""
        name = self._name(key, machine_id)
        with self._lock:
            self._memory[name] = dict(environment)
        if not self._keyring.usable:
            return False
        payload = json.dumps(environment, separators=(",", ":")).encode()
        chunks = [payload[i : i + _CHUNK] for i in range(0, len(payload), _CHUNK)] or [b""]
        try:
            self._remove_keys(name)
            for index, chunk in enumerate(chunks):
                self._keyring.add(f"{name}#{index}", chunk)
            self._keyring.add(name, str(len(chunks)).encode())
        except OSError:
            # No keyring here (seccomp, quota): this process's memory only.
            try:
                self._remove_keys(name)
            except OSError:
                pass
            return False
        return True

    def get(self, key: str, machine_id: str) -> dict[str, str] | None:
        """The kept values, or None when neither this process nor the keyring has them."""
        name = self._name(key, machine_id)
        with self._lock:
            known = self._memory.get(name)
        if known is not None:
            return dict(known)
        if not self._keyring.usable:
            return None
        try:
            count = self._keyring.read(name)
            if count is None:
                return None
            parts = [self._keyring.read(f"{name}#{index}") for index in range(int(count))]
        except (OSError, ValueError):
            return None
        if any(part is None for part in parts):
            return None
        values = json.loads(b"".join(p for p in parts if p is not None))
        with self._lock:
            self._memory[name] = dict(values)
        return dict(values)

    def drop(self, key: str, machine_id: str) -> None:
        """Forget the values (idempotent)."""
        name = self._name(key, machine_id)
        with self._lock:
            self._memory.pop(name, None)
        if self._keyring.usable:
            try:
                self._remove_keys(name)
            except OSError:
                pass

    def _remove_keys(self, name: str) -> None:
        count = self._keyring.read(name)
        self._keyring.remove(name)
        total = int(count) if count and count.isdigit() else 0
        for index in range(max(total, 1)):
            self._keyring.remove(f"{name}#{index}")
