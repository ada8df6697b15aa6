"""Trust for external drivers: manifests and checksum verification before every launch (PROTOCOL.md §6).

A manifest (JSON) declares one driver::

    {
      "manifest_version": 1,
      "name": "acme",                          # a driver name: [a-z][a-z0-9_-]{0,62} (vz_core.registry)
      "version": "1.4.0",                      # the driver's own version (free text)
      "api_version": "1.3",                    # Runtime Protocol it speaks: "1.<minor>"
      "binaries": {                            # one entry per "os/arch" (os: linux, darwin, windows;
        "linux/amd64": {                       #                           arch: amd64, arm64)
          "path": "bin/acme",                  # relative to the manifest's directory, or absolute
          "sha256": "9f86d0...",               # 64 hex digits, compared case-insensitively; required
        },
        "darwin/arm64": {"url": "https://...", "file": "acme-darwin", "sha256": "..."}
      },
      "args": ["--serve"],                     # extra arguments for the binary
      "options": {"type": "object", ...},      # JSON Schema of the driver's options (documentation: vz passes
                                               # an external driver no options, so it checks none of them)
      "plaintext": false,                      # true: this driver cannot do AutoMTLS (never implied)
      "signature": {"format": "ed25519", "key_id": "...", "value": "..."}   # vz_core._signing
    }

A ``url`` entry names where the binary comes from (absolute, or relative to the manifest's URL): ``vz driver
add URL`` downloads it to ``file`` in the install directory (``vz_core._install``); verification itself never
downloads: the file must already be at ``file`` inside the driver directory. Signatures are checked against the
trust roots and policy (``vz_core._trustroots``) when a manifest is added, before anything is recorded.

Before **every** launch (never cached), ``verify_binary`` checks: the path is absolute; it does not resolve
through a symlink to outside its driver directory (the manifest's directory, or the binary's own directory
for an absolute path); it is a regular file, executable by us; the SHA-256 of the bytes read through one open
file descriptor matches. Those same bytes are copied into a sealed memfd (Linux) or a private read-only copy
(elsewhere) and that copy is what gets executed, which closes the time-of-check/time-of-use gap even against
in-place writes. A copy is executed as ``/proc/self/fd/N`` (or ``fexecve``), so a script with a ``#!`` line
works too: the descriptor stays open (not close-on-exec) for the interpreter to read it. A file that changes
between two operations fails the second. Verification never downloads, runs or deletes the file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vz_core.errors import TrustError
from vz_core.platform.files import SEALED_MEMFD, memfd_sealed_copy, seal_memfd
from vz_core.rules import DRIVER_NAME_PATTERN, is_driver_name

__all__ = [
    "BinaryEntry",
    "Manifest",
    "VerifiedBinary",
    "host_platform",
    "load_manifest",
    "parse_manifest",
    "sha256_of",
    "verify_binary",
]

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_PLATFORM = re.compile(r"(linux|darwin|windows)/(amd64|arm64)")
_CHUNK = 1 << 20
MAX_MANIFEST_BYTES = 1 << 20
"""A manifest file larger than this is refused unread (a manifest is a few hundred bytes)."""
_MAX_DEPTH = 32


def _no_nul(value: str | None, what: str) -> str | None:
    if value is not None and "\x00" in value:
        raise ValueError(f"{what} must not contain a NUL character")
    return value


class BinaryEntry(BaseModel):
    """The binary for one os/arch: a ``path``, or a ``url`` plus the ``file`` it is stored as; and its SHA-256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = None
    url: str | None = None
    file: str | None = None
    sha256: str = Field(description="SHA-256 of the binary, 64 hex digits (case-insensitive)")

    @field_validator("path", "url", "file")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return _no_nul(value, "the value")

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _SHA256.fullmatch(value):
            raise ValueError(f"must be 64 hexadecimal digits, got {len(value)} characters {value[:80]!r}")
        return value.lower()

    @model_validator(mode="after")
    def _one_source(self) -> BinaryEntry:
        if (self.path is None) == (self.url is None):
            raise ValueError("give exactly one of 'path' or 'url'")
        if self.url is not None and not self.file:
            raise ValueError("a 'url' entry needs 'file': the name it is stored as in the driver directory")
        if self.file is not None and ("/" in self.file or "\\" in self.file or self.file in ("", ".", "..")):
            raise ValueError("'file' must be a plain file name")
        return self


class Endorsement(BaseModel):
    """An old key's signature over a new public key (a key rotation, ``vz_core._signing``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key_id: str
    value: str


class Signature(BaseModel):
    """An Ed25519 signature over the manifest's canonical bytes (``vz_core._signing``), checked against the
    user's trust roots (``vz_core._trustroots``) before a manifest is recorded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str
    value: str
    key_id: str = ""
    public_key: str = ""
    endorsement: Endorsement | None = None


class Manifest(BaseModel):
    """An external driver's manifest (see the module docstring for the JSON shape)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    manifest_version: Literal[1] = 1
    name: str = Field(pattern=DRIVER_NAME_PATTERN, description="a driver name (vz_core.rules.DRIVER_NAME_PATTERN)")
    version: str = Field(min_length=1)
    api_version: str = Field(pattern=r"^1\.\d+$", description='Runtime Protocol version, "1.<minor>"')
    binaries: dict[str, BinaryEntry] = Field(min_length=1)
    args: tuple[str, ...] = ()
    options: dict[str, Any] = Field(default_factory=dict, description="JSON Schema of the driver's options")
    plaintext: bool = False
    signature: Signature | None = None

    @field_validator("name")
    @classmethod
    def _driver_name(cls, value: str) -> str:
        if not is_driver_name(value):  # the pattern's "$" alone would let a trailing newline through
            raise ValueError(f"{value[:80]!r} is not a driver name ({DRIVER_NAME_PATTERN})")
        return value

    @field_validator("args")
    @classmethod
    def _args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arg in value:
            _no_nul(arg, "an argument")
        return value

    @field_validator("binaries")
    @classmethod
    def _platforms(cls, value: dict[str, BinaryEntry]) -> dict[str, BinaryEntry]:
        for key in value:
            if not _PLATFORM.fullmatch(key):
                raise ValueError(
                    f"unknown platform {key!r}: use 'os/arch' with os linux|darwin|windows, arch amd64|arm64"
                )
        return value

    def entry_for(self, plat: str | None = None) -> BinaryEntry:
        """The binary entry for ``plat`` (default: this host); ``TrustError`` naming what exists."""
        plat = plat or host_platform()
        try:
            return self.binaries[plat]
        except KeyError:
            have = ", ".join(sorted(self.binaries))
            raise TrustError(f"driver {self.name!r} ships no binary for {plat} (it has: {have})") from None

    def binary_home(self, driver_dir: Path, plat: str | None = None) -> Path:
        """The directory the binary must stay in (symlinks may not leave it): ``driver_dir``, or for an
        absolute ``path`` the binary's own directory."""
        entry = self.entry_for(plat)
        if entry.path is not None and Path(entry.path).is_absolute():
            return Path(entry.path).parent
        return driver_dir

    def binary_path(self, driver_dir: Path, plat: str | None = None) -> Path:
        """Where this host's binary is: ``path`` (joined to ``driver_dir`` when relative) or ``driver_dir/file``."""
        entry = self.entry_for(plat)
        if entry.path is not None:
            declared = Path(entry.path)
            return declared if declared.is_absolute() else driver_dir / declared
        assert entry.file is not None
        return driver_dir / entry.file


def host_platform() -> str:
    """This host as "os/arch" (e.g. "linux/amd64")."""
    osname = {"linux": "linux", "darwin": "darwin", "win32": "windows"}.get(sys.platform, sys.platform)
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return f"{osname}/{arch}"


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "manifest"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "missing" + (" (every binary needs a SHA-256 checksum)" if err["loc"][-1] == "sha256" else "")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def _depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests (lists/dicts), counting no further than ``limit + 1``; iterative."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_manifest(data: str | bytes | dict[str, Any], *, source: str = "manifest") -> Manifest:
    """Validate a manifest; ``TrustError`` names every problem (field, what is wrong). Any input ends in a
    ``Manifest`` or a ``TrustError`` (bad JSON, bad encoding, too large, nested too deeply, huge numbers)."""
    if isinstance(data, str | bytes) and len(data) > MAX_MANIFEST_BYTES:
        raise TrustError(f"{source} is larger than {MAX_MANIFEST_BYTES} bytes; a manifest is a small JSON file")
    try:
        raw = json.loads(data) if isinstance(data, str | bytes) else data
    except json.JSONDecodeError as exc:
        raise TrustError(f"{source} is not valid JSON: {exc}") from None
    except RecursionError:
        raise TrustError(f"{source} nests too deeply (more than {_MAX_DEPTH} levels)") from None
    except ValueError as exc:  # undecodable bytes, an integer beyond Python's digit limit
        raise TrustError(f"{source} is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(raw, dict):
        raise TrustError(f"{source} must be a JSON object")
    if _depth(raw, _MAX_DEPTH) > _MAX_DEPTH:
        raise TrustError(f"{source} nests too deeply (more than {_MAX_DEPTH} levels)")
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise TrustError(f"{source} is invalid: {_describe(exc)}") from None
    except (ValueError, TypeError, RecursionError) as exc:  # a value pydantic could not even inspect
        raise TrustError(f"{source} is invalid: {type(exc).__name__}: {str(exc)[:200]}") from None


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read and validate a manifest file (``TrustError`` for anything wrong, the file included)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise TrustError(f"manifest {p} is not a regular file")
            text = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise TrustError(f"cannot read manifest {p}: {exc.strerror or exc}") from None
    except ValueError as exc:  # e.g. a NUL in the path
        raise TrustError(f"cannot read manifest {p!r}: {exc}") from None
    return parse_manifest(text, source=f"manifest {p}")


@dataclass
class VerifiedBinary:
    """A binary that passed verification, plus the sealed copy to execute. ``close()`` releases the copy."""

    path: str
    """The declared path (what argv[0] shows)."""
    real_path: str
    sha256: str
    size: int
    fd: int | None = None
    """Linux: a sealed memfd holding exactly the verified bytes (execute ``/proc/self/fd/N``)."""
    copy_path: str | None = None
    """Elsewhere: a private read-only copy of the verified bytes."""
    _copy_dir: str | None = field(default=None, repr=False)

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        if self._copy_dir is not None:
            shutil.rmtree(self._copy_dir, ignore_errors=True)
            self._copy_dir = None
            self.copy_path = None

    def __enter__(self) -> VerifiedBinary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _within(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def _memfd_exec_allowed() -> bool:
    if not SEALED_MEMFD:
        return False
    try:
        return Path("/proc/sys/vm/memfd_noexec").read_text().strip() != "2"
    except OSError:
        return True


def _open_checked(path: Path, driver_dir: Path | None) -> tuple[int, str, os.stat_result]:
    if not path.is_absolute():
        raise TrustError(f"driver binary path {str(path)!r} is not absolute")
    home = os.path.realpath(driver_dir if driver_dir is not None else path.parent)
    real = os.path.realpath(path)
    if not _within(real, home):
        raise TrustError(
            f"driver binary {path} resolves to {real}, outside its driver directory {home}; "
            "symlinks may only point inside the driver directory"
        )
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(real, flags)
    except FileNotFoundError:
        raise TrustError(f"driver binary {path} does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TrustError(f"driver binary {path} was replaced by a symlink while being verified") from None
        raise TrustError(f"cannot open driver binary {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TrustError(f"driver binary {path} is not a regular file")
        if not st.st_mode & 0o111 or not os.access(real, os.X_OK):
            raise TrustError(f"driver binary {path} is not executable by this user (chmod +x it)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, real, st


def sha256_of(path: str | os.PathLike[str], *, driver_dir: Path | None = None) -> str:
    """Run every check and hash the file, without making a copy (for ``vz driver verify``)."""
    fd, _, _ = _open_checked(Path(path), driver_dir)
    try:
        digest = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def verify_binary(
    path: str | os.PathLike[str],
    sha256: str,
    *,
    driver_dir: Path | None = None,
    name: str = "driver",
) -> VerifiedBinary:
    """Check ``path`` and its SHA-256, and return a sealed copy of exactly the verified bytes to execute.

    ``TrustError`` (nothing launched, nothing changed) for: a relative path, a symlink leaving the driver
    directory, a missing, non-regular or non-executable file, a malformed expected checksum, or a mismatch.
    """
    expected = sha256.lower()
    if not _SHA256.fullmatch(expected):
        raise TrustError(f"driver {name!r}: expected checksum {sha256[:80]!r} is not 64 hexadecimal digits")
    p = Path(path)
    fd, real, st = _open_checked(p, driver_dir)
    copy_fd: int | None = None
    copy_dir: str | None = None
    copy_path: str | None = None
    try:
        if SEALED_MEMFD and _memfd_exec_allowed():
            # Close-on-exec here; the launcher passes it on explicitly (pass_fds), and there it stays open across
            # exec so that a "#!" script can be read back by its interpreter through /proc/self/fd/N.
            copy_fd = memfd_sealed_copy(f"vz-driver-{name}")
            out_fd = copy_fd
        else:
            copy_dir = tempfile.mkdtemp(prefix="vz-driver-")
            copy_path = os.path.join(copy_dir, os.path.basename(real))
            out_fd = os.open(copy_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        digest = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out_fd, view) :]
            size += len(chunk)
        actual = digest.hexdigest()
        if copy_fd is not None:
            seal_memfd(copy_fd)
        else:
            os.close(out_fd)
            os.chmod(copy_path, 0o500)  # type: ignore[arg-type]
        if not hmac.compare_digest(actual, expected):
            raise TrustError(
                f"driver {name!r}: SHA-256 mismatch for {p}: the manifest says {expected}, the file has {actual}; "
                "the file changed after the manifest was written (restore the right binary or add an updated "
                "manifest with `vz driver add`)"
            )
    except BaseException:
        if copy_fd is not None:
            os.close(copy_fd)
        if copy_dir is not None:
            shutil.rmtree(copy_dir, ignore_errors=True)
        raise
    finally:
        os.close(fd)
    del st
    return VerifiedBinary(
        path=str(p),
        real_path=real,
        sha256=actual,
        size=size,
        fd=copy_fd,
        copy_path=copy_path,
        _copy_dir=copy_dir,
    )
