"""Wire rules both halves share: exec frame rules, the exec-end convention and the message limits.

Exec frames (PROTOCOL.md §4): the first client frame is one ``start`` with a non-empty argv; then stdin frames
of 1..``MAX_CHUNK`` bytes, one ``close_stdin``, and the half-close. ``start_problem`` and ``stdin_problem``
are the one statement of those rules: the client refuses locally what the server would refuse.

``STOP_INPUT_KEY``: response-header metadata a vz plugin sends when it refuses an Exec before any output (a
missing Machine, an unsupported tty, a driver failure) while the client may still be sending stdin. The
status follows once the client half-closed (or after a bounded wait). A vz host that sees the key stops
sending stdin and half-closes at once; other hosts ignore unknown metadata and are simply drained.

Wide exec frames (vz host and vz plugin only): per-frame cost is what limits exec throughput over gRPC, and
the protocol's 32 KiB frames are small. A vz host sends request metadata ``WIDE_CHUNK_KEY: <n>`` on Exec; a vz
plugin that understands it answers with the same key in its response headers (sent with its first output
frame) and then accepts stdin frames of up to ``n`` bytes (at most ``MAX_WIDE_CHUNK``) and sends output frames
of up to that size, joining output chunks the driver has ready (never an empty chunk or one over the agreed
size: those go alone, as the driver sent them). The host sends wide stdin frames only after it saw the answer,
and hands the caller of ``exec`` output in chunks of at most ``MAX_CHUNK`` as the contract says: each agreed
wide frame cut into ``MAX_CHUNK`` pieces, any other frame (an empty one, one over the agreed size, every frame
of a plugin that did not agree) exactly as sent. Hosts and plugins that do not know the key ignore it: the
32 KiB rules apply unchanged.

Terminal frames (``vz.machine.v1.MachineExtensions/ExecPty``) follow the same rules, plus window sizes:
``terminal_start_problem`` (rows and columns 0..MAX_WINDOW, 0 = the default) and ``resize_problem``
(1..MAX_WINDOW each). Resize frames may come at any time after the start, also after ``close_stdin``.

Message limits: every peer-filled buffer is bounded. ``MAX_MESSAGE`` caps any one gRPC message either side
receives (an Info, a Find, a frame); exec frames are ≤ 1 MiB (wide) and log frames ≤ 32 KiB, so it never
limits a stream.
``MAX_INFO`` caps an Info reply (a host checks it before anything else). ``MAX_EXEC_START`` caps the
serialized start frame (argv, environment, user, workdir): larger requests are refused with INVALID_ARGUMENT
before anything runs, by the client and by the server.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from vz_core._types import MAX_CHUNK, MAX_WINDOW
from vz_core.transport import CHANNEL_OPTIONS, MAX_MESSAGE, SERVER_OPTIONS

__all__ = [
    "CHANNEL_OPTIONS",
    "MAX_EXEC_START",
    "MAX_INFO",
    "MAX_MESSAGE",
    "MAX_WIDE_CHUNK",
    "SERVER_OPTIONS",
    "STOP_INPUT_KEY",
    "WIDE_CHUNK_KEY",
    "exec_output_limit",
    "resize_problem",
    "start_problem",
    "stdin_problem",
    "terminal_start_problem",
    "wide_chunk",
]

STOP_INPUT_KEY = "vz-exec-stop-input"
WIDE_CHUNK_KEY = "vz-exec-chunk"
MAX_WIDE_CHUNK = 1024 * 1024
"""Bytes: the largest exec stdin/stdout/stderr frame a vz host and a vz plugin agree on (``WIDE_CHUNK_KEY``)."""

exec_output_limit: ContextVar[int] = ContextVar("vz_exec_output_limit", default=MAX_CHUNK)
"""The largest ``ExecOutput`` chunk the consumer of an exec started in this context takes (``Driver.exec``'s
contract: ``MAX_CHUNK``). A vz plugin sets it, for its driver's ``exec`` only, to the frame size it agreed on
with a vz host (``WIDE_CHUNK_KEY``); a driver may then yield output chunks of up to that size (the guest agent
client asks its agent for frames that wide), never larger. Anything else sees ``MAX_CHUNK``."""

MAX_INFO = 64 * 1024
"""Bytes: the largest Info reply a vz host accepts (names, versions and capabilities are short)."""
MAX_EXEC_START = 1024 * 1024
"""Bytes: the largest serialized exec start frame (argv + environment + user + workdir)."""


def start_problem(start: Any) -> str | None:
    """What is wrong with an exec start frame (a ``runtime_pb2.ExecStart``), or None."""
    if not start.argv:
        return "exec start frame has an empty argv"
    size = start.ByteSize()
    if size > MAX_EXEC_START:
        return (
            f"exec request of {size} bytes (argv, environment, user, workdir) is over the limit of "
            f"{MAX_EXEC_START} bytes"
        )
    return None


def stdin_problem(data: bytes, stdin_closed: bool, limit: int = MAX_CHUNK) -> str | None:
    """What is wrong with one stdin frame's data, or None (``limit``: the agreed frame size)."""
    if stdin_closed:
        return "a stdin frame after close_stdin"
    if not data:
        return "an empty stdin frame"
    if len(data) > limit:
        return f"a stdin frame of {len(data)} bytes (at most {limit})"
    return None


def wide_chunk(metadata: Any) -> int:
    """The exec frame size a peer's metadata asks for with ``WIDE_CHUNK_KEY`` (``MAX_CHUNK`` when it does not,
    at most ``MAX_WIDE_CHUNK``)."""
    for key, value in metadata or ():
        if key == WIDE_CHUNK_KEY:
            try:
                asked = int(value)
            except (TypeError, ValueError):
                return MAX_CHUNK
            return max(MAX_CHUNK, min(asked, MAX_WIDE_CHUNK))
    return MAX_CHUNK


def terminal_start_problem(start: Any) -> str | None:
    """What is wrong with a terminal start frame (an ``extensions_pb2.PtyStart``), or None."""
    if not start.argv:
        return "terminal start frame has an empty argv"
    if start.rows > MAX_WINDOW or start.cols > MAX_WINDOW:
        return f"terminal size {start.rows}x{start.cols} is over {MAX_WINDOW} rows or columns"
    size = start.ByteSize()
    if size > MAX_EXEC_START:
        return (
            f"terminal request of {size} bytes (argv, environment, user, workdir, term) is over the limit of "
            f"{MAX_EXEC_START} bytes"
        )
    return None


def resize_problem(rows: int, cols: int) -> str | None:
    """What is wrong with a window size in a resize frame, or None."""
    if not (1 <= rows <= MAX_WINDOW and 1 <= cols <= MAX_WINDOW):
        return f"a resize to {rows}x{cols} (rows and columns must be 1..{MAX_WINDOW})"
    return None
