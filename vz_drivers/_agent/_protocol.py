"""Wire format of the guest agent protocol (docs/agent-protocol.md is the reference).

Every frame is a fixed 12-byte header followed by ``length`` payload bytes::

    offset  size  field
    0       2     magic  b"VZ"
    2       1     type   (one of the ``T_*`` constants)
    3       1     flags  (0; reserved)
    4       4     stream id, big endian (0 = the connection itself)
    8       4     payload length, big endian

Data frames (STDIN/STDOUT/STDERR) carry 1..``MAX_DATA`` raw bytes; control frames carry at most
``MAX_CONTROL`` bytes (JSON or the fixed binary layouts below). This module is pure: no I/O.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = [
    "CH_STDERR",
    "CH_STDIN",
    "CH_STDOUT",
    "DEFAULT_WINDOW",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_CONTROL",
    "MAX_DATA",
    "MAX_WIDE_DATA",
    "OUTPUT_WINDOW",
    "PROTOCOL_VERSION",
    "READY_PAYLOAD",
    "SUPPORTED_VERSIONS",
    "TYPE_NAMES",
    "T_ERROR",
    "T_EXEC_FDS",
    "T_EXEC_START",
    "T_EXEC_STARTED",
    "T_EXIT",
    "T_HELLO",
    "T_HELLO_REPLY",
    "T_KILL",
    "T_LOGS",
    "T_PING",
    "T_PONG",
    "T_READY",
    "T_RESIZE",
    "T_SERVICES",
    "T_SERVICES_REPLY",
    "T_SERVICE_LOGS",
    "T_SERVICE_LOGS_REPLY",
    "T_SERVICE_STATES",
    "T_SERVICE_STATES_REPLY",
    "T_SHUTDOWN",
    "T_SHUTDOWN_ACK",
    "T_STATUS",
    "T_STATUS_REPLY",
    "T_STDERR",
    "T_STDIN",
    "T_STDIN_CLOSE",
    "T_STDOUT",
    "T_WINDOW",
    "WIDE_OUTPUT_WINDOW",
    "WIDE_STDIN_WINDOW",
    "decode_exit",
    "decode_resize",
    "decode_window",
    "encode_exit",
    "encode_resize",
    "encode_window",
    "frame",
]

MAGIC: Final = b"VZ"
HEADER: Final = struct.Struct(">2sBBII")
HEADER_SIZE: Final = HEADER.size  # 12

PROTOCOL_VERSION: Final = 1
SUPPORTED_VERSIONS: Final = (1,)

MAX_DATA: Final = 32768
"""Largest payload of a STDIN/STDOUT/STDERR frame."""
MAX_WIDE_DATA: Final = 1 << 20
"""Largest data frame a host may agree on with an agent (HELLO ``max_data``; agents that predate it answer
nothing and keep ``MAX_DATA``)."""
WIDE_STDIN_WINDOW: Final = 4 << 20
"""The stdin credit a host asks for (EXEC_START ``stdin_window``) on an exec with wide frames."""
WIDE_OUTPUT_WINDOW: Final = 4 << 20
"""The output credit a host asks for (EXEC_START ``window``) on an exec with wide output frames."""
MAX_CONTROL: Final = 1 << 20
"""Largest payload of any other frame."""
DEFAULT_WINDOW: Final = 256 * 1024
OUTPUT_WINDOW: Final = 1024 * 1024
"""The output credit ``AgentClient`` asks for per exec (EXEC_START ``window``): with the default the agent
stalls every 256 KiB waiting for a grant, which halves the throughput of a busy command; 1 MiB keeps it
streaming and bounds the host's buffer at 2 MiB per exec."""
"""Initial credit, in bytes, of every flow-controlled channel (stdin, stdout, stderr) of a stream."""

READY_PAYLOAD: Final = b"vz-agent"

# Connection-level messages (stream 0) and request/response pairs (stream = request id).
T_HELLO: Final = 0x01
T_HELLO_REPLY: Final = 0x02
T_READY: Final = 0x03
T_PING: Final = 0x04
T_PONG: Final = 0x05
T_STATUS: Final = 0x06
T_STATUS_REPLY: Final = 0x07
T_SHUTDOWN: Final = 0x08
T_SHUTDOWN_ACK: Final = 0x09
# Exec streams (stream id chosen by the host, non-zero).
T_EXEC_START: Final = 0x10
T_EXEC_STARTED: Final = 0x11
T_STDIN: Final = 0x12
T_STDIN_CLOSE: Final = 0x13
T_STDOUT: Final = 0x14
T_STDERR: Final = 0x15
T_EXIT: Final = 0x16
T_KILL: Final = 0x17
T_WINDOW: Final = 0x18
T_LOGS: Final = 0x19
T_RESIZE: Final = 0x1A
"""Terminal sessions: the new window size of an exec started with "pty" (u16 rows, u16 cols)."""
T_EXEC_FDS: Final = 0x1B
"""An exec whose stdin, stdout and stderr are the three descriptors passed with this frame (SCM_RIGHTS on the
sendmsg carrying its first header byte; Unix socket connections only). JSON: EXEC_START's fields + "fds": 3."""
T_ERROR: Final = 0x1F
# Services (request id; JSON both ways except SERVICE_LOGS_REPLY, which is the raw log tail).
T_SERVICES: Final = 0x20
T_SERVICES_REPLY: Final = 0x21
T_SERVICE_STATES: Final = 0x22
T_SERVICE_STATES_REPLY: Final = 0x23
T_SERVICE_LOGS: Final = 0x24
T_SERVICE_LOGS_REPLY: Final = 0x25

TYPE_NAMES: Final = {
    value: name[2:] for name, value in dict(globals()).items() if name.startswith("T_") and isinstance(value, int)
}

# WINDOW channels.
CH_STDIN: Final = 0
CH_STDOUT: Final = 1
CH_STDERR: Final = 2

_WINDOW = struct.Struct(">BI")
_EXIT_CODE = struct.Struct(">i")
_RESIZE = struct.Struct(">HH")


def frame(type_: int, stream: int, payload: bytes = b"") -> bytes:
    """One encoded frame."""
    return HEADER.pack(MAGIC, type_, 0, stream, len(payload)) + payload


def encode_window(channel: int, increment: int) -> bytes:
    """Payload of a WINDOW frame: channel (u8) and credit increment (u32)."""
    return _WINDOW.pack(channel, increment)


def decode_window(payload: bytes) -> tuple[int, int]:
    """(channel, increment) of a WINDOW payload; ``ValueError`` when malformed."""
    if len(payload) != _WINDOW.size:
        raise ValueError(f"WINDOW payload must be {_WINDOW.size} bytes, got {len(payload)}")
    channel, increment = _WINDOW.unpack(payload)
    return int(channel), int(increment)


def encode_exit(exit_code: int, signal: str = "") -> bytes:
    """Payload of an EXIT frame: exit code (i32) then the signal name in ASCII ("" or e.g. "SIGKILL")."""
    return _EXIT_CODE.pack(exit_code) + signal.encode("ascii")


def decode_exit(payload: bytes) -> tuple[int, str]:
    """(exit_code, signal) of an EXIT payload; ``ValueError`` when malformed."""
    if len(payload) < _EXIT_CODE.size or len(payload) > _EXIT_CODE.size + 32:
        raise ValueError(f"EXIT payload must be 4..36 bytes, got {len(payload)}")
    (code,) = _EXIT_CODE.unpack_from(payload)
    return int(code), payload[_EXIT_CODE.size :].decode("ascii")


def encode_resize(rows: int, cols: int) -> bytes:
    """Payload of a RESIZE frame: rows (u16) and columns (u16), each 1..65535."""
    return _RESIZE.pack(rows, cols)


def decode_resize(payload: bytes) -> tuple[int, int]:
    """(rows, cols) of a RESIZE payload; ``ValueError`` when malformed."""
    if len(payload) != _RESIZE.size:
        raise ValueError(f"RESIZE payload must be {_RESIZE.size} bytes, got {len(payload)}")
    rows, cols = _RESIZE.unpack(payload)
    return int(rows), int(cols)
