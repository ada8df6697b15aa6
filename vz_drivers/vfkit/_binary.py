"""The vfkit binary: found, pinned by SHA-256 (trust on first use), run from a private verified copy.

* Found at the ``vfkit`` option (an absolute path) or on PATH.
* Its SHA-256 is compared with a pin before every launch: the ``vfkit_sha256`` option when given, otherwise
  ``<state>/trust.json`` written on first use. A changed binary (a ``brew upgrade``) is refused with what to do.
* What runs is a private copy made from the very descriptor that was hashed (``<state>/bin/<sha256>/vfkit``,
  mode 0500 in a 0700 directory), so replacing the original between check and launch changes nothing. A
  copy keeps the code signature Mach-O binaries embed (and with it vfkit's virtualization entitlement).
* ``vfkit --version`` prints ``vfkit version: v0.6.1`` (cobra's template with vfkit's ``:``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError

__all__ = ["INSTALL_HINT", "MIN_VERSION", "NESTED_MIN_VERSION", "VerifiedVfkit", "VfkitBinary", "parse_version"]

INSTALL_HINT = "install vfkit (`brew install vfkit`) or set the driver option vfkit=<absolute path>"
MIN_VERSION = (0, 6, 0)
NESTED_MIN_VERSION = (0, 6, 2)
"""``--nested`` (nested virtualization) exists in vfkit from v0.6.2 on (crc-org/vfkit ``pkg/cmdline/cmdline.go``
and ``doc/usage.md``); an older vfkit stops at the unknown flag."""
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
_VERSION = re.compile(r"\bversion:?\s*v?(\d+)\.(\d+)(?:\.(\d+))?([0-9A-Za-z.+~-]*)")


def parse_version(output: str) -> tuple[str, tuple[int, int, int] | None]:
    """``("0.6.1", (0, 6, 1))`` from ``vfkit --version`` output; ``(text, None)`` when it has no version number."""
    match = _VERSION.search(output)
    if match is None:
        return output.strip()[:80], None
    numbers = (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))
    text = f"{match.group(1)}.{match.group(2)}" + (f".{match.group(3)}" if match.group(3) else "") + match.group(4)
    return text, numbers


def _sha256_of(fd: int) -> str:
    with os.fdopen(os.dup(fd), "rb") as fh:
        fh.seek(0)
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _atomic_json(path: Path, data: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".trust-")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class VerifiedVfkit:
    """A verified vfkit: ``source`` is what the user installed, ``path`` the private copy that is executed."""

    source: str
    path: str
    sha256: str


class VfkitBinary:
    """Locates, verifies and versions vfkit. Blocking methods: call them through ``asyncio.to_thread``."""

    def __init__(self, configured: str, *, state_root: Path, pinned_sha256: str = "") -> None:
        if configured and not os.path.isabs(configured):
            raise InvalidArgumentError(f"vfkit={configured!r} must be an absolute path", details={"option": "vfkit"})
        if pinned_sha256 and not _HEX64.match(pinned_sha256):
            raise InvalidArgumentError("vfkit_sha256 must be 64 hex characters", details={"option": "vfkit_sha256"})
        self.configured = configured
        self.pinned = pinned_sha256.lower()
        self.trust_file = state_root / "trust.json"
        self.bin_dir = state_root / "bin"
        self._verified: tuple[tuple[int, ...], VerifiedVfkit] | None = None
        self._version: tuple[str, tuple[int, int, int] | None] | None = None

    def locate(self) -> str:
        """The vfkit the user means (not yet verified); ``UnavailableError`` when there is none."""
        if self.configured:
            if not os.path.isfile(self.configured):
                raise UnavailableError(f"vfkit not found at {self.configured}; {INSTALL_HINT}")
            return self.configured
        found = shutil.which("vfkit")
        if not found:
            raise UnavailableError(f"vfkit not found on PATH; {INSTALL_HINT}")
        return os.path.abspath(found)

    def _expected(self, source: str) -> tuple[str, str]:
        if self.pinned:
            return self.pinned, "the vfkit_sha256 option"
        try:
            data = json.loads(self.trust_file.read_text())
        except (OSError, ValueError):
            return "", ""
        if not isinstance(data, dict) or data.get("path") != source:
            return "", ""
        return str(data.get("sha256", "")).lower(), str(self.trust_file)

    def verify(self) -> VerifiedVfkit:
        """Hash vfkit, compare it with the pin (recording it on first use) and return its private copy.

        ``UnavailableError`` when vfkit is missing or not an executable file; ``FailedPreconditionError`` when
        its SHA-256 differs from the pinned one.
        """
        source = self.locate()
        try:
            fd = os.open(source, os.O_RDONLY)
        except OSError as exc:
            raise UnavailableError(f"cannot open vfkit at {source}: {exc.strerror}; {INSTALL_HINT}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
                raise UnavailableError(f"{source} is not an executable file; {INSTALL_HINT}")
            identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if self._verified is not None and self._verified[0] == identity and self._copy_intact(self._verified[1]):
                return self._verified[1]
            digest = _sha256_of(fd)
            expected, origin = self._expected(source)
            if not expected:
                _atomic_json(self.trust_file, {"path": source, "sha256": digest})
            elif digest != expected:
                raise FailedPreconditionError(
                    f"vfkit at {source} changed: SHA-256 {digest} does not match the trusted {expected} (from "
                    f"{origin}); if the update is intended, remove {self.trust_file} (or update the vfkit_sha256 "
                    "option) to trust the new binary",
                    details={"path": source, "expected_sha256": expected, "actual_sha256": digest},
                )
            verified = VerifiedVfkit(source=source, path=str(self._private_copy(fd, digest)), sha256=digest)
        finally:
            os.close(fd)
        self._verified = (identity, verified)
        return verified

    def _copy_intact(self, verified: VerifiedVfkit) -> bool:
        try:
            st = os.lstat(verified.path)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o222

    def _private_copy(self, fd: int, digest: str) -> Path:
        directory = self.bin_dir / digest
        target = directory / "vfkit"
        self.bin_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        directory.mkdir(exist_ok=True, mode=0o700)
        os.chmod(self.bin_dir, 0o700)
        os.chmod(directory, 0o700)
        if target.is_file() and not target.is_symlink():
            with open(target, "rb") as fh:
                if hashlib.file_digest(fh, "sha256").hexdigest() == digest and self._copy_intact(
                    VerifiedVfkit("", str(target), digest)
                ):
                    return target
            target.unlink()
        tmp_fd, tmp = tempfile.mkstemp(dir=directory, prefix=".vfkit-")
        try:
            with os.fdopen(tmp_fd, "wb") as out, os.fdopen(os.dup(fd), "rb") as src:
                src.seek(0)
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            with open(tmp, "rb") as fh:
                if hashlib.file_digest(fh, "sha256").hexdigest() != digest:
                    raise FailedPreconditionError(f"vfkit changed while it was being copied ({tmp}); retry")
            os.chmod(tmp, 0o500)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return target

    def version(self) -> tuple[str, tuple[int, int, int] | None]:
        """``vfkit --version`` of the verified copy, parsed; ``UnavailableError`` when it does not run."""
        if self._version is None:
            verified = self.verify()
            try:
                done = subprocess.run(
                    [verified.path, "--version"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise UnavailableError(f"`{verified.source} --version` failed: {exc}; {INSTALL_HINT}") from None
            text = (done.stdout or done.stderr).strip()
            if done.returncode != 0:
                raise UnavailableError(
                    f"`{verified.source} --version` exited {done.returncode}: {text[:200]}; {INSTALL_HINT}"
                )
            self._version = parse_version(text)
        return self._version

    def check_version(self) -> str:
        """The version text; ``FailedPreconditionError`` when older than ``MIN_VERSION``."""
        text, numbers = self.version()
        if numbers is not None and numbers < MIN_VERSION:
            wanted = ".".join(map(str, MIN_VERSION))
            raise FailedPreconditionError(
                f"vfkit {text} is older than {wanted}, the oldest version this driver is written for; "
                "upgrade it (`brew upgrade vfkit`)",
                details={"version": text, "minimum": wanted},
            )
        return text

    def check_nested(self) -> None:
        """``FailedPreconditionError`` when this vfkit predates ``--nested`` (or its version is unknown)."""
        text, numbers = self.version()
        if numbers is None or numbers < NESTED_MIN_VERSION:
            wanted = ".".join(map(str, NESTED_MIN_VERSION))
            raise FailedPreconditionError(
                f"nested=on needs vfkit {wanted} or newer (its --nested flag arrived in v{wanted}); this vfkit is "
                f"{text}: upgrade it (`brew upgrade vfkit`) or set nested=off",
                details={"option": "nested", "version": text, "minimum": wanted},
            )
