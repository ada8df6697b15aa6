"""Secret redaction for text and byte streams (PROTOCOL.md §6).

Secrets (RunImage and exec environment values, provider options) must never reach logs, errors, status
output or echoes of a plugin's stderr. A ``Redactor`` holds the secrets known so far; ``redact()`` cleans a
finished text and ``stream()`` cleans a byte stream written in arbitrary pieces: it holds back the last
``len(longest secret) - 1`` bytes of every write so a secret split across two writes is still caught.

Values shorter than ``MIN_SECRET_LENGTH`` are ambiguous. By default they are not treated as secrets: a plugin
registers every environment value it is sent, and masking every "1" or "on" would mangle all output. A Redactor
made with ``short_tokens=True`` holds only values known to be secrets (the Environment layer's: values of
declared secret references) and masks short ones too, but only as a whole token: where the value is not
preceded or followed by a letter, digit or ``_`` (so the secret "ab1" is masked in "token ab1 rejected" and in
"key=ab1", not inside "tab1e"). Longer secrets are masked wherever they occur.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

__all__ = ["MASK", "MIN_SECRET_LENGTH", "VZ_ID_VARIABLES", "RedactingStream", "Redactor"]

MASK = "***"
MIN_SECRET_LENGTH = 4
VZ_ID_VARIABLES = frozenset({"VZ_PROJECT_ID", "VZ_ENVIRONMENT_ID", "VZ_MACHINE_ID"})
"""The variables vz itself gives every Machine: its own ids, printed by `vz status`, never secrets (masking them
would hide every name built from them, such as a Machine's workspace id ``vz-<ids>``)."""

_T = TypeVar("_T")
_WORD_BYTES = rb"[A-Za-z0-9_]"
_WORD_TEXT = r"[A-Za-z0-9_]"


class Redactor:
    """A growing set of secrets and the patterns that mask them. Shared by every stream made from it."""

    def __init__(self, secrets: Iterable[str | bytes] = (), *, short_tokens: bool = False) -> None:
        self._secrets: set[bytes] = set()
        self._short: set[bytes] = set()
        self._short_tokens = short_tokens
        self._bytes_pattern: re.Pattern[bytes] | None = None
        self._text_pattern: re.Pattern[str] | None = None
        self._longest = 0
        self.add(*secrets)

    def add_environment(self, environment: Mapping[str, str]) -> None:
        """Register the values of an environment (RunImage's, an exec's) as secrets, except vz's own ids."""
        self.add(*(value for key, value in environment.items() if key not in VZ_ID_VARIABLES))

    def add(self, *secrets: str | bytes) -> None:
        """Register more secrets (empty values are ignored; short ones unless ``short_tokens``)."""
        changed = False
        for secret in secrets:
            raw = secret.encode() if isinstance(secret, str) else bytes(secret)
            if len(raw) >= MIN_SECRET_LENGTH:
                if raw not in self._secrets:
                    self._secrets.add(raw)
                    changed = True
            elif raw and self._short_tokens and raw not in self._short:
                self._short.add(raw)
                changed = True
        if changed:
            # Longest first, so a secret that contains another is masked whole.
            ordered = sorted(self._secrets, key=len, reverse=True)
            short = sorted(self._short, key=len, reverse=True)
            byte_parts = [re.escape(s) for s in ordered]
            byte_parts += [rb"(?<!" + _WORD_BYTES + rb")" + re.escape(s) + rb"(?!" + _WORD_BYTES + rb")" for s in short]
            self._bytes_pattern = re.compile(b"|".join(byte_parts))
            text_parts = [re.escape(s.decode(errors="surrogateescape")) for s in ordered]
            text_parts += [
                f"(?<!{_WORD_TEXT}){re.escape(s.decode(errors='surrogateescape'))}(?!{_WORD_TEXT})" for s in short
            ]
            self._text_pattern = re.compile("|".join(text_parts))
            # A short token is only decided once the byte after it is known: hold back one more.
            self._longest = max(len(ordered[0]) if ordered else 0, max((len(s) + 1 for s in short), default=0))

    def merge(self, other: Redactor) -> None:
        """Learn every secret ``other`` knows (its short whole-token secrets too, whatever this one's setting)."""
        if other is self:
            return
        short_tokens = self._short_tokens
        self._short_tokens = True
        try:
            self.add(*other._secrets, *other._short)
        finally:
            self._short_tokens = short_tokens

    @property
    def longest(self) -> int:
        """Length in bytes of the longest secret (0 when there is none)."""
        return self._longest

    def __bool__(self) -> bool:
        return bool(self._secrets or self._short)

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

    def redact_data(self, data: _T) -> _T:
        """A copy of JSON-like ``data`` (dicts, lists, strings) with every string redacted; keys included."""
        if self._text_pattern is None:
            return data
        return self._walk(data)  # type: ignore[return-value]

    def _walk(self, node: object) -> object:
        if isinstance(node, str):
            return self.redact(node)
        if isinstance(node, dict):
            return {self._walk(k): self._walk(v) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [self._walk(v) for v in node]
        return node

    def stream(self) -> RedactingStream:
        """A streaming redactor over this secret set (secrets added later apply from then on)."""
        return RedactingStream(self)


class RedactingStream:
    """Redacts a byte stream fed in pieces. ``feed`` returns what is safe to emit now; ``flush`` the rest."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = b""
        self._before = b""  # the last byte emitted: context for a short token's look-behind

    def feed(self, data: bytes) -> bytes:
        buf = self._before + self._held + data
        start = len(self._before)
        pattern = self._redactor._bytes_pattern
        if pattern is None:
            self._held = b""
            self._before = buf[-1:]
            return buf[start:]
        # Any secret that starts before `cut` ends inside `buf`, so it is matched now; what follows `cut`
        # may be the beginning of a secret whose end has not arrived yet.
        cut = max(start, len(buf) - (self._redactor.longest - 1))
        out: list[bytes] = []
        pos = start
        mask = MASK.encode()
        for match in pattern.finditer(buf, start):
            if match.start() >= cut:
                break
            out.append(buf[pos : match.start()])
            out.append(mask)
            pos = match.end()
            cut = max(cut, pos)
        out.append(buf[pos:cut])
        self._held = buf[cut:]
        if cut > start:
            self._before = buf[cut - 1 : cut]
        return b"".join(out)

    def flush(self) -> bytes:
        """Everything still held back, redacted (call at end of stream)."""
        held, self._held = self._before + self._held, b""
        start = len(self._before)
        self._before = b""
        pattern = self._redactor._bytes_pattern
        if pattern is None:
            return held[start:]
        out: list[bytes] = []
        pos = start
        for match in pattern.finditer(held, start):
            out.append(held[pos : match.start()])
            out.append(MASK.encode())
            pos = match.end()
        out.append(held[pos:])
        return b"".join(out)
