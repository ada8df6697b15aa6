"""The local wire: message round trips (sync and asyncio), descriptors with their message, malformed input."""

from __future__ import annotations

import array
import os
import socket
import struct
from collections.abc import Iterator

import pytest

from vz_core.daemon import MAX_FDS, MAX_MESSAGE, AsyncChannel, Channel, WireError
from vz_core.wire._frames import decode, encode_binary, encode_json


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    "message",
    [
        {"hello": {"protocol": 1, "version": "0.1.0", "pid": 7}},
        {"call": {"method": "Machines.Exec", "request": {"argv": ["sh", "-c", "echo é ✓"], "n": 2**62}}},
        {},
        (0, b""),
        (1, b"\x00\xffbinary\n"),
        (3, os.urandom(70000)),
    ],
    ids=["hello", "unicode-call", "empty-object", "empty-stdin", "stdout-bytes", "terminal-70k"],
)
def test_sync_round_trip(
    pair: tuple[socket.socket, socket.socket], message: dict[str, object] | tuple[int, bytes]
) -> None:
    a, b = pair
    Channel(a).send(message)
    got = Channel(b).receive()
    assert got == (message, [])


def test_binary_write_splits_into_bounded_messages(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    data = os.urandom(600 * 1024)
    sender, receiver = Channel(a), Channel(b)
    import threading

    t = threading.Thread(target=sender.write, args=(2, data))
    t.start()
    chunks: list[bytes] = []
    total = 0
    while total < len(data):
        got = receiver.receive()
        assert got is not None
        message, fds = got
        assert isinstance(message, tuple)
        stream, chunk = message
        assert stream == 2 and fds == []
        assert len(chunk) <= 256 * 1024
        chunks.append(chunk)
        total += len(chunk)
    t.join()
    assert b"".join(chunks) == data
    assert len(chunks) == 3


def test_fds_belong_to_their_message(pair: tuple[socket.socket, socket.socket]) -> None:
    """Messages sent back to back: the descriptors arrive with the one message that carried them."""
    a, b = pair
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    r3, w3 = os.pipe()
    sender, receiver = Channel(a), Channel(b)
    try:
        sender.send({"n": 1})
        sender.send({"n": 2}, fds=[w1, w2, w3])
        sender.send((1, b"x" * 10))
        sender.send({"n": 4}, fds=[w1])
        first = receiver.receive()
        second = receiver.receive()
        third = receiver.receive()
        fourth = receiver.receive()
        assert first == ({"n": 1}, [])
        assert third == ((1, b"x" * 10), [])
        assert second is not None and second[0] == {"n": 2} and len(second[1]) == 3
        assert fourth is not None and fourth[0] == {"n": 4} and len(fourth[1]) == 1
        for fd, (r, _) in zip(second[1], [(r1, w1), (r2, w2), (r3, w3)], strict=True):
            assert os.get_inheritable(fd) is False  # close-on-exec
            os.write(fd, b"through the passed fd")
            os.close(fd)
            assert os.read(r, 100) == b"through the passed fd"
        os.close(fourth[1][0])
    finally:
        for fd in (r1, w1, r2, w2, r3, w3):
            os.close(fd)


def test_too_many_fds_refused_on_both_sides(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(MAX_FDS + 1)]
    try:
        with pytest.raises(WireError, match="at most 3 file descriptors"):
            Channel(a).send({"x": 1}, fds=fds)
        before = _fd_count()
        # A peer that ignores the rule: raw sendmsg with four descriptors on one message.
        data = encode_json({"x": 1})
        a.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
        with pytest.raises(WireError, match="more than 3 file descriptors"):
            Channel(b).receive()
        assert _fd_count() == before  # the received ones were closed
    finally:
        for fd in fds:
            os.close(fd)


def _raw(n: int, kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", n) + kind + payload


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (_raw(0, b"J", b""), "declared length 0"),
        (_raw(MAX_MESSAGE + 1, b"J", b""), f"declared length {MAX_MESSAGE + 1}"),
        (struct.pack(">I", 0xFFFFFFFF) + b"J", "declared length 4294967295"),
        (_raw(3, b"X", b"{}"), "unknown message kind 'X'"),
        (_raw(3, b"\x00", b"{}"), "unknown message kind '0x00'"),
        (_raw(3, b"J", b"\xff\xfe"), "not valid UTF-8"),
        (_raw(3, b"J", b"[]"), "must be one object, got list"),
        (_raw(5, b"J", b'{"a"'), "does not parse"),
        (_raw(1, b"B", b""), "no stream byte"),
        (_raw(3, b"B", b"\x07x"), "names stream 7"),
        (b"\x00\x00", "closed in the middle of a message header"),
        (_raw(10, b"J", b'{"a":'), "closed in the middle of a message"),
    ],
    ids=[
        "zero-length",
        "over-16MiB",
        "huge-length",
        "unknown-kind",
        "nul-kind",
        "bad-utf8",
        "json-array",
        "bad-json",
        "binary-no-stream",
        "binary-bad-stream",
        "eof-in-header",
        "eof-in-payload",
    ],
)
def test_malformed_input_is_a_clear_error(pair: tuple[socket.socket, socket.socket], raw: bytes, match: str) -> None:
    a, b = pair
    a.sendall(raw)
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(WireError, match=match):
        Channel(b).receive()


def test_clean_close_between_messages_is_none(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    Channel(a).send({"last": True})
    a.shutdown(socket.SHUT_WR)
    receiver = Channel(b)
    assert receiver.receive() == ({"last": True}, [])
    assert receiver.receive() is None


def test_encode_limits() -> None:
    with pytest.raises(WireError, match="larger than the local wire's limit"):
        encode_json({"x": "a" * MAX_MESSAGE})
    with pytest.raises(WireError, match="larger than the local wire's limit"):
        encode_binary(1, b"\0" * MAX_MESSAGE)
    with pytest.raises(WireError, match="stream 9"):
        encode_binary(9, b"")
    assert decode(0x42, b"\x01hi") == (1, b"hi")
    assert encode_binary(1, b"hi") == b"\x00\x00\x00\x04B\x01hi"


async def test_async_channel_round_trip_with_fds(pair: tuple[socket.socket, socket.socket]) -> None:
    """The daemon's asyncio side against the client's blocking side, both directions, with descriptors."""
    import asyncio

    a, b = pair
    server = AsyncChannel(a)
    client = Channel(b)
    r, w = os.pipe()
    try:
        await asyncio.to_thread(client.send, {"call": {"method": "X"}}, [w])
        got = await server.receive()
        assert got is not None
        message, fds = got
        assert message == {"call": {"method": "X"}} and len(fds) == 1
        os.write(fds[0], b"ok")
        os.close(fds[0])
        assert os.read(r, 2) == b"ok"
        big = os.urandom(3 * 1024 * 1024)  # larger than the socket buffer: sends must wait for the reader
        reader = asyncio.create_task(asyncio.to_thread(lambda: [client.receive() for _ in range(14)]))  # noqa: RUF006
        await server.send({"progress": {"step": 1}}, fds=[r])
        await server.write(1, big)
        await server.send({"result": {}})
        received = await reader
        assert received[0] is not None and received[0][0] == {"progress": {"step": 1}}
        assert len(received[0][1]) == 1
        os.close(received[0][1][0])
        data = b"".join(m[0][1] for m in received[1:13] if m is not None and isinstance(m[0], tuple))
        assert data == big
        assert received[13] == ({"result": {}}, [])
        await asyncio.to_thread(client.sock.shutdown, socket.SHUT_WR)
        assert await server.receive() is None
    finally:
        os.close(r)
        os.close(w)


async def test_async_malformed_and_peek(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    server = AsyncChannel(a)
    b.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert await server.peek(4) == b"PRI "
    assert await server.peek(4) == b"PRI "  # peeking consumes nothing
    with pytest.raises(WireError, match="declared length"):
        await server.receive()


JSON_SAMPLES: list[object] = [
    {"s": 'é ✓ \x00 \n \t " \\ \u2028 \U0001f600'},
    {"n": [0, -1, 2**70, 1.5, -0.0, 1e300, float("inf"), float("-inf")], "b": [True, False, None]},
    {"nested": {"a": [{"b": []}, {}], "c": {"d": {"e": "f"}}}},
    {"argv": ["sh", "-c", "echo $HOME"], "env": {"K": "v"}, "stdio": [True, False, True]},
]


@pytest.mark.parametrize("obj", JSON_SAMPLES)
def test_json_is_exactly_what_the_json_module_writes_and_reads(obj: dict[str, object]) -> None:
    """The C accelerator path (used where the interpreter has it) and the json module agree byte for byte."""
    import json
    import sys

    from vz_core.wire import _frames as _wire

    if sys.implementation.name == "cpython":
        assert _wire._FAST_JSON is not None, "the accelerated JSON path is not in use on CPython"
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    assert encode_json(obj)[5:] == text.encode("utf-8", "surrogateescape")
    assert repr(decode(0x4A, text.encode("utf-8", "surrogateescape"))) == repr(json.loads(text))


@pytest.mark.parametrize(
    "payload",
    [b'{"a": 1} x', b'{"a":', b"", b" ", b'{"a": tru}', b'{"a": "\x01"}', b'{"a": 1,}', b"[1]", b'"s"'],
)
def test_malformed_json_is_reported_with_the_json_module_s_words(payload: bytes) -> None:
    import json

    try:
        expected = json.loads(payload.decode())
    except ValueError as exc:
        message = f"a JSON message does not parse: {exc}"
    else:
        message = f"a JSON message must be one object, got {type(expected).__name__}"
    with pytest.raises(WireError) as caught:
        decode(0x4A, payload)
    assert str(caught.value) == message


def test_what_json_cannot_encode_fails_as_json_fails() -> None:
    import json

    circular: dict[str, object] = {}
    circular["self"] = circular
    for bad in ({"x": object()}, {"x": {1, 2}}, circular):
        with pytest.raises((TypeError, ValueError)) as ours:
            encode_json(bad)
        with pytest.raises((TypeError, ValueError)) as theirs:
            json.dumps(bad)
        assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))
