"""Secret redaction for text and byte streams (PROTOCOL.md §6).

Secrets (RunImage and exec environment values, provider options) must never reach logs, errors, status
output or echoes of a plugin's stderr. A ``Redactor`` holds the secrets known so far; ``redact()`` cleans a
finished text and ``stream()`` cleans a byte stream written in arbitrary pieces: it holds back the last
``len(longest secret) - 1`` bytes of every write so a secret split across two writes is still caught.

Values shorter than ``MIN_SECRET_LENGTH`` are not treated as secrets: masking every "1" or "on" would mangle
all output while hiding nothing an observer could not guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MASK", "MIN_SECRET_LENGTH", "RedactingStream", "Redactor"]

MASK = "***"
MIN_SECRET_LENGTH = 4


class Redactor:
    """A growing set of secrets and the patterns that mask them. Shared by every stream made from it."""

    def __init__(self, secrets: Iterable[str | bytes] = ()) -> None:
        self._secrets: set[bytes] = set()
        self._bytes_pattern: re.Pattern[bytes] | None = None
        self._text_pattern: re.Pattern[str] | None = None
        self._longest = 0
        self.add(*secrets)

    def add(self, *secrets: str | bytes) -> None:
        """Register more secrets (empty and very short values are ignored)."""
        changed = False
        for secret in secrets:
            raw = secret.encode() if isinstance(secret, str) else bytes(secret)
            if len(raw) >= MIN_SECRET_LENGTH and raw not in self._secrets:
                self._secrets.add(raw)
                changed = True
        if changed:
            # Longest first, so a secret that contains another is masked whole.
            ordered = sorted(self._secrets, key=len, reverse=True)
            self._bytes_pattern = re.compile(b"|".join(re.escape(s) for s in ordered))
            texts = [s.decode(errors="surrogateescape") for s in ordered]
            self._text_pattern = re.compile("|".join(re.escape(t) for t in texts))
            self._longest = len(ordered[0])

    @property
    def longest(self) -> int:
        """Length in bytes of the longest secret (0 when there is none)."""
        return self._longest

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced by ``MASK``."""
        if self._text_pattern is None or not text:
            return text
        return self._text_pattern.sub(MASK, text)

    def redact_bytes(self, data: bytes) -> bytes:
        """``data`` with every secret replaced by ``MASK``."""
        if self._bytes_pattern is None or not data:
            return data
        return self._bytes_pattern.sub(MASK.encode(), data)

    def stream(self) -> RedactingStream:
        """A streaming redactor over this secret set (secrets added later apply from then on)."""
        return RedactingStream(self)


class RedactingStream:
    """Redacts a byte stream fed in pieces. ``feed`` returns what is safe to emit now; ``flush`` the rest."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        buf = self._held + data
        pattern = self._redactor._bytes_pattern
        if pattern is None:
            self._held = b""
            return buf
        # Any secret that starts before `cut` ends inside `buf`, so it is matched now; what follows `cut`
        # may be the beginning of a secret whose end has not arrived yet.
        cut = max(0, len(buf) - (self._redactor.longest - 1))
        out: list[bytes] = []
        pos = 0
        mask = MASK.encode()
        for match in pattern.finditer(buf):
            if match.start() >= cut:
                break
            out.append(buf[pos : match.start()])
            out.append(mask)
            pos = match.end()
            cut = max(cut, pos)
        out.append(buf[pos:cut])
        self._held = buf[cut:]
        return b"".join(out)

    def flush(self) -> bytes:
        """Everything still held back, redacted (call at end of stream)."""
        held, self._held = self._held, b""
        return self._redactor.redact_bytes(held)
