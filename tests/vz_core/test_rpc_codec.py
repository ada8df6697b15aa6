"""Exec data frames encoded and decoded without messages (vz_core.rpc._codec): the very bytes protobuf gives, and
anything of another shape left to protobuf."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from vz_core import ExecExit, ExecOutput
from vz_core.rpc import _codec
from vz_core.rpc._server import MALFORMED, _lenient
from vz_core.rpc.pb import runtime_pb2 as pb

SIZES = [0, 1, 127, 128, 16383, 16384, 32768, 2097151, 2097152, 1 << 20]


@pytest.mark.parametrize("size", SIZES)
def test_frames_are_the_bytes_protobuf_gives(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    assert _codec.encode_stdin(data) == pb.ExecClientMessage(stdin=data).SerializeToString()
    for stream in ("stdout", "stderr"):
        msg = pb.ExecServerMessage()
        getattr(msg, stream).SetInParent()
        getattr(msg, stream).data = data
        assert _codec.encode_output(stream, data) == msg.SerializeToString()


@pytest.mark.parametrize("size", SIZES)
def test_data_frames_decode_to_their_data(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    frame = _codec.decode_client(_codec.encode_stdin(data))
    assert frame is not None and frame.stdin == data and frame.WhichOneof("payload") == "stdin"
    for stream in ("stdout", "stderr"):
        assert _codec.decode_server(_codec.encode_output(stream, data)) == ExecOutput(stream, data)


def test_frames_of_any_other_shape_go_to_protobuf() -> None:
    data = b"abc"
    stdin = _codec.encode_stdin(data)
    start = pb.ExecClientMessage(start=pb.ExecStart(argv=["cat"])).SerializeToString()
    close = pb.ExecClientMessage(close_stdin=pb.CloseStdin()).SerializeToString()
    for raw in (start, close, b"", stdin + close, stdin[:-1], stdin + b"\x12\x01x"):
        assert _codec.decode_client(raw) is None
    decode = _lenient(pb.ExecClientMessage)
    assert decode(stdin + b"\x12\x01x").stdin == b"x"  # the last of a repeated oneof field, as protobuf says
    assert decode(stdin[:-1]) is MALFORMED
    assert decode(start).WhichOneof("payload") == "start"

    out = _codec.encode_output("stdout", data)
    exit_ = pb.ExecServerMessage(exit=pb.ExecExit(exit_code=3)).SerializeToString()
    unknown = out[:1] + bytes([out[1] + 2]) + out[2:] + b"\x10\x01"  # OutputChunk with an unknown field 2
    for raw, expected in ((exit_, ExecExit(3)), (unknown, ExecOutput("stdout", data))):
        msg = _codec.decode_server(raw)
        assert isinstance(msg, pb.ExecServerMessage)
        assert (ExecExit(msg.exit.exit_code) if msg.HasField("exit") else ExecOutput("stdout", msg.stdout.data)) == (
            expected
        )
    with pytest.raises(DecodeError):  # as the generated stub's deserializer raises
        _codec.decode_server(out[:-1])


def test_the_serializer_takes_messages_and_encoded_frames() -> None:
    msg = pb.ExecClientMessage(close_stdin=pb.CloseStdin())
    assert _codec.serialize(msg) == msg.SerializeToString()
    raw = _codec.encode_stdin(b"x")
    assert _codec.serialize(raw) is raw
