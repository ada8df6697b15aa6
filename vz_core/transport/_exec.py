"""Exec-stream conventions shared by our host client and our plugin SDK (beyond the Runtime Protocol's frames).

``STOP_INPUT_KEY``: response-header metadata a vz plugin sends when it refuses an Exec before any output (a
missing Machine, an unsupported tty, a driver failure) while the client may still be sending stdin. The
status follows once the client half-closed (or after a bounded wait). A vz host that sees the key stops
sending stdin and half-closes at once; other hosts ignore unknown metadata and are simply drained.
"""

from __future__ import annotations

__all__ = ["STOP_INPUT_KEY"]

STOP_INPUT_KEY = "vz-exec-stop-input"
