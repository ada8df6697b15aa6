"""Exec data frames on the wire without protobuf messages in between: the bytes protobuf itself produces.

An exec moves its data in ``ExecClientMessage{stdin}`` and ``ExecServerMessage{stdout|stderr: OutputChunk{data}}``
frames. Building a message for each and serializing it copies the data three times, and parsing one copies it
twice; at wide frames those copies are most of what a host and a plugin spend per MiB. So both halves encode
data frames directly (a few header bytes joined with the data: one copy) and decode the frames they receive
directly when a frame has exactly the shape the encoder produces (one slice). Anything else (a start, a
close_stdin, an exit, unknown fields, repeated fields, a malformed frame) goes through protobuf as before. The
encoding is byte for byte what ``SerializeToString`` gives for the same message, so peers cannot tell.

Serializers given to grpcio (``serialize``) take either a message or these pre-encoded bytes.
"""

from __future__ import annotations

from typing import Any, Literal

from vz_core._proto.devsy.runtime.v1 import runtime_pb2 as pb
from vz_core._types import ExecOutput

__all__ = ["StdinFrame", "decode_client", "decode_server", "encode_output", "encode_stdin", "serialize"]

_STDIN = 0x12  # ExecClientMessage.stdin: field 2, length-delimited
_STDOUT = 0x0A  # ExecServerMessage.stdout: field 1, length-delimited
_STDERR = 0x12  # ExecServerMessage.stderr: field 2, length-delimited
_DATA = 0x0A  # OutputChunk.data: field 1, length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length(raw: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; (-1, pos) when it does not end within 5 bytes."""
    value = 0
    shift = 0
    end = min(len(raw), pos + 5)
    while pos < end:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return -1, pos


def encode_stdin(data: bytes) -> bytes:
    """``ExecClientMessage(stdin=data).SerializeToString()``."""
    return b"".join((b"\x12", _varint(len(data)), data))


def encode_output(stream: str, data: bytes) -> bytes:
    """``ExecServerMessage(stdout|stderr=OutputChunk(data=data)).SerializeToString()``."""
    tag = b"\x12" if stream == "stderr" else b"\x0a"
    if not data:
        return tag + b"\x00"  # proto3: an empty data field is not written, the chunk is
    size = _varint(len(data))
    return b"".join((tag, _varint(1 + len(size) + len(data)), b"\x0a", size, data))


def serialize(message: Any) -> bytes:
    """A grpcio request/response serializer: pre-encoded bytes as they are, a message serialized."""
    if type(message) is bytes:
        return message
    out: bytes = message.SerializeToString()
    return out


class StdinFrame:
    """A decoded ``ExecClientMessage`` carrying stdin: what the exec server reads of a message (``WhichOneof``,
    ``stdin``), without a message."""

    __slots__ = ("stdin",)

    def __init__(self, stdin: bytes) -> None:
        self.stdin = stdin

    def WhichOneof(self, group: str) -> str | None:
        return "stdin" if group == "payload" else None


def decode_client(raw: bytes) -> StdinFrame | None:
    """The stdin frame ``raw`` is exactly (one ``stdin`` field and nothing else), or None: decode it with protobuf."""
    if len(raw) < 2 or raw[0] != _STDIN:
        return None
    size, pos = _length(raw, 1)
    if size < 0 or pos + size != len(raw):
        return None
    return StdinFrame(raw[pos:])


def decode_server(raw: bytes) -> Any:
    """A grpcio response deserializer for Exec: an ``ExecOutput`` for an output frame of exactly the encoder's
    shape, else the parsed ``pb.ExecServerMessage``."""
    if len(raw) >= 2 and (raw[0] == _STDOUT or raw[0] == _STDERR):
        size, pos = _length(raw, 1)
        if size >= 0 and pos + size == len(raw):
            stream: Literal["stdout", "stderr"] = "stdout" if raw[0] == _STDOUT else "stderr"
            if size == 0:
                return ExecOutput(stream, b"")
            if raw[pos] == _DATA:
                inner, start = _length(raw, pos + 1)
                if inner > 0 and start + inner == len(raw):
                    return ExecOutput(stream, raw[start:])
    return pb.ExecServerMessage.FromString(raw)
