"""The OCI runtime (runc): verified before every use, run with a driver-private ``--root``.

Trust: the runc binary's SHA-256 is compared with a pinned value before each launch. The pin comes from the
``runc_sha256`` option, else from ``<state>/trust.json`` (recorded on first use, trust on first use); a
changed binary is refused with instructions. The verified file is executed through ``/proc/self/fd`` of the
descriptor that was hashed, so what runs is what was checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vz_core.errors import (
    FailedPreconditionError,
    RuntimeFailureError,
    RuntimeTimeoutError,
    UnavailableError,
)
from vz_drivers._machine import atomic_write

__all__ = ["Runc", "RuncResult", "file_sha256"]

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


def file_sha256(fd: int) -> str:
    """SHA-256 of an open file descriptor's whole content (hex)."""
    h = hashlib.sha256()
    offset = 0
    while True:
        block = os.pread(fd, 1 << 20, offset)
        if not block:
            return h.hexdigest()
        h.update(block)
        offset += len(block)


@dataclass(frozen=True)
class RuncResult:
    returncode: int
    stdout: bytes
    stderr: bytes


class Runc:
    """Thin async wrapper over the runc CLI."""

    def __init__(self, path: str, root: Path, trust_file: Path, pinned_sha256: str = "") -> None:
        self.path = path
        self.root = root
        self.trust_file = trust_file
        if pinned_sha256 and not _HEX64.match(pinned_sha256):
            raise ValueError("runc_sha256 must be 64 hex characters")
        self.pinned_sha256 = pinned_sha256.lower()
        self.version = ""
        self._verified: tuple[int, ...] | None = None

    def _expected(self) -> tuple[str, str]:
        if self.pinned_sha256:
            return self.pinned_sha256, "the runc_sha256 option"
        try:
            data = json.loads(self.trust_file.read_text())
        except (OSError, ValueError):
            return "", ""
        if data.get("path") != self.path:
            return "", ""
        return str(data.get("sha256", "")).lower(), str(self.trust_file)

    def verify(self) -> int:
        """Open, check and hash the runc binary; return a descriptor of the verified file.

        Raises ``UnavailableError`` when runc is missing and ``FailedPreconditionError`` when its checksum
        differs from the pinned one. The first verification without a pin records the hash.
        """
        if not self.path or not os.path.isabs(self.path):
            raise UnavailableError(
                "runc was not found; install it (Debian: `apt-get install runc`) or set the runc option to its "
                "absolute path"
            )
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise UnavailableError(
                f"cannot open the runc binary {self.path}: {exc.strerror}; install runc (`apt-get install runc`)"
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
                raise UnavailableError(f"{self.path} is not an executable regular file; reinstall runc")
            identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if identity == self._verified:
                return fd
            digest = file_sha256(fd)
            expected, source = self._expected()
            if not expected:
                self.trust_file.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(self.trust_file, json.dumps({"path": self.path, "sha256": digest}).encode(), 0o600)
            elif digest != expected:
                raise FailedPreconditionError(
                    f"the runc binary {self.path} changed: SHA-256 {digest} does not match the trusted {expected} "
                    f"(from {source}); if the update is intended, remove {self.trust_file} (or update the "
                    "runc_sha256 option) to trust the new binary",
                    details={"path": self.path, "expected_sha256": expected, "actual_sha256": digest},
                )
            # Any change of the content changes ctime (which no user can set back), so an unchanged identity
            # means unchanged bytes: hashing 9 MiB before every runc call would dominate Machine start.
            self._verified = identity
        except BaseException:
            os.close(fd)
            raise
        return fd

    async def run(
        self,
        *args: str,
        limit: float = 30.0,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        log: Path | None = None,
        new_session: bool = False,
        capture: bool = True,
    ) -> RuncResult:
        """Run ``runc --root <root> [--log <log>] args...`` from a freshly verified descriptor."""
        fd = await asyncio.to_thread(self.verify)
        try:
            argv = [self.path, "--root", str(self.root)]
            if log is not None:
                argv += ["--log", str(log)]
            argv += list(args)
            proc = await asyncio.create_subprocess_exec(
                "runc",
                *argv[1:],
                executable=f"/proc/self/fd/{fd}",
                stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=stdout if stdout is not None else (asyncio.subprocess.PIPE if capture else None),
                stderr=stderr if stderr is not None else (asyncio.subprocess.PIPE if capture else None),
                pass_fds=(fd,),
                start_new_session=new_session,
            )
        finally:
            os.close(fd)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), limit)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise RuntimeTimeoutError(f"runc {args[0]} did not finish within {limit:.0f} s") from None
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return RuncResult(proc.returncode, out or b"", err or b"")

    async def check(self, *args: str, what: str, **kwargs: Any) -> RuncResult:
        """Like ``run`` but raise ``RuntimeFailureError`` (with runc's message) on a non-zero exit."""
        result = await self.run(*args, **kwargs)
        if result.returncode != 0:
            log: Path | None = kwargs.get("log")
            message = result.stderr.decode(errors="replace").strip()
            if log is not None:
                message = (message + "\n" + _last_errors(log)).strip()
            raise RuntimeFailureError(f"{what} failed (runc exit {result.returncode})", runtime_message=message)
        return result

    async def get_version(self) -> str:
        if not self.version:
            result = await self.run("--version", limit=10)
            first = result.stdout.decode(errors="replace").splitlines()
            self.version = first[0].removeprefix("runc version ").strip() if first else ""
        return self.version

    async def state(self, container_id: str) -> dict[str, Any] | None:
        """runc's view of a container, or None when runc does not know it."""
        result = await self.run("state", container_id, limit=10)
        if result.returncode != 0:
            return None
        try:
            data: dict[str, Any] = json.loads(result.stdout)
        except ValueError:
            return None
        return data

    async def delete_force(self, container_id: str) -> None:
        """Kill and remove a container (missing containers are fine)."""
        await self.run("delete", "--force", container_id, limit=30)

    def list_ids(self) -> Sequence[str]:
        """Container ids in runc's state directory (no runc call)."""
        try:
            return sorted(p.name for p in self.root.iterdir() if p.is_dir())
        except OSError:
            return ()


def _last_errors(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()[-5:]
    except OSError:
        return ""
    out = []
    for line in lines:
        try:
            out.append(str(json.loads(line).get("msg", line)))
        except ValueError:
            out.append(line)
    return "\n".join(out)
