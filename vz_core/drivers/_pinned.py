"""The pinned record of a built-in's console script, and the checks a launch repeats on pinned files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vz_core.errors import TrustError

__all__ = ["PinnedScript", "source_sha256", "trust_reason"]


@dataclass(frozen=True)
class PinnedScript:
    """The manifest-equivalent record of a built-in's installed console script (``pin_builtin``)."""

    name: str
    script: Path
    """Absolute path of the console script (``<scripts dir>/vz-driver-<name>``)."""
    sha256: str
    """Its SHA-256 when it was pinned; every launch verifies the file against it."""
    args: tuple[str, ...]
    interpreter: str
    """The interpreter its ``#!`` line names (the pinning interpreter)."""
    anchor: str
    """Where the expected hash was confirmed: ``"installation RECORD"`` (the installer's hash matched),
    ``"pinned"`` (no installer hash for it: taken from the file as found when pinned) or ``"generated"`` (a
    declaration without a console script: the daemon wrote this launcher script itself)."""
    pinned_at: str
    module_file: str = ""
    """The registration module's source file (pinned too: it is what the script imports first)."""
    module_sha256: str = ""

    def describe(self) -> dict[str, Any]:
        return {
            "script": str(self.script),
            "sha256": self.sha256,
            "interpreter": self.interpreter,
            "anchor": self.anchor,
            "pinned_at": self.pinned_at,
            "module_file": self.module_file,
            "module_sha256": self.module_sha256,
        }


def trust_reason(exc: TrustError, name: str) -> str:
    """What a verification error says is wrong with the file, without the advice meant for manifests."""
    text = str(exc).split("; the file changed after the manifest was written", 1)[0]
    return text.removeprefix(f"driver {name!r}: ").replace("the manifest says", "pinned")


def source_sha256(path: Path) -> str:
    """SHA-256 of a source file (a regular file, not through a final symlink); ``TrustError`` otherwise."""
    import hashlib
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise TrustError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise TrustError(f"{path} is not a regular file")
        digest = hashlib.sha256()
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
