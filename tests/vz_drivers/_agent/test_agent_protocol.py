"""The wire protocol itself: frame codecs, and the agent driven with raw frames."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from agent_helpers import AgentProcess, alive, descendants, eventually

from vz_core.errors import IncompatibleVersionError
from vz_drivers._agent import AgentClient
from vz_drivers._agent import _protocol as p


def test_frame_layout() -> None:
    assert p.frame(p.T_STDOUT, 0x01020304, b"ab") == b"VZ\x14\x00\x01\x02\x03\x04\x00\x00\x00\x02ab"
    assert p.HEADER_SIZE == 12


def test_window_and_exit_codecs() -> None:
    assert p.encode_window(p.CH_STDERR, 65536) == b"\x02\x00\x01\x00\x00"
    assert p.decode_window(p.encode_window(p.CH_STDIN, 7)) == (p.CH_STDIN, 7)
    assert p.decode_exit(p.encode_exit(137, "SIGKILL")) == (137, "SIGKILL")
    assert p.decode_exit(p.encode_exit(-1)) == (-1, "")
    with pytest.raises(ValueError):
        p.decode_window(b"\x00")
    with pytest.raises(ValueError):
        p.decode_exit(b"\x00")


def test_type_names_are_unique() -> None:
    assert len(set(p.TYPE_NAMES.values())) == len(p.TYPE_NAMES)
    assert p.TYPE_NAMES[p.T_EXEC_START] == "EXEC_START"


class Raw:
    """A host speaking raw frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, agent: AgentProcess) -> Raw:
        reader, writer = await asyncio.open_unix_connection(str(agent.socket))
        return cls(reader, writer)

    def send(self, type_: int, stream: int, payload: bytes = b"") -> None:
        self.writer.write(p.frame(type_, stream, payload))

    async def recv(self) -> tuple[int, int, bytes]:
        header = await asyncio.wait_for(self.reader.readexactly(p.HEADER_SIZE), 10)
        magic, type_, flags, stream, length = p.HEADER.unpack(header)
        assert (magic, flags) == (p.MAGIC, 0)
        return type_, stream, await self.reader.readexactly(length)

    async def hello(self, nonce: str = "n1", versions: tuple[int, ...] = (1,)) -> tuple[int, int, bytes]:
        self.send(p.T_HELLO, 0, json.dumps({"versions": list(versions), "nonce": nonce}).encode())
        return await self.recv()

    def exec(self, stream: int, argv: list[str], **extra: object) -> None:
        self.send(p.T_EXEC_START, stream, json.dumps({"argv": argv, **extra}).encode())

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


@pytest.fixture
async def raw(agent: AgentProcess) -> AsyncIterator[Raw]:
    conn = await Raw.connect(agent)
    try:
        yield conn
    finally:
        await conn.close()


async def test_hello_reply_carries_version_nonce_and_facts(raw: Raw) -> None:
    type_, stream, payload = await raw.hello("abc")
    assert (type_, stream) == (p.T_HELLO_REPLY, 0)
    doc = json.loads(payload)
    assert doc["version"] == 1
    assert doc["nonce"] == "abc"
    assert doc["pid"] > 0
    assert doc["nproc"] >= 1
    assert doc["mem_total"] > 0


async def test_requests_before_hello_are_refused(raw: Raw) -> None:
    raw.exec(1, ["true"])
    type_, stream, payload = await raw.recv()
    assert (type_, stream) == (p.T_ERROR, 1)
    assert json.loads(payload)["code"] == "FAILED_PRECONDITION"
    raw.send(p.T_PING, 9, b"still there?")
    assert await raw.recv() == (p.T_PONG, 9, b"still there?")


async def test_incompatible_version(raw: Raw) -> None:
    type_, stream, payload = await raw.hello(versions=(99,))
    assert (type_, stream) == (p.T_ERROR, 0)
    assert json.loads(payload)["code"] == "INCOMPATIBLE_VERSION"


async def test_client_reports_incompatible_version(agent: AgentProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(p, "SUPPORTED_VERSIONS", (99,))
    with pytest.raises(IncompatibleVersionError, match="version"):
        await AgentClient.connect_unix(agent.socket)


async def test_bad_magic_closes_a_socket_session(raw: Raw) -> None:
    await raw.hello()
    raw.writer.write(b"XX" + bytes(10))
    assert await asyncio.wait_for(raw.reader.read(), 10) == b""


async def test_duplicate_stream_id_is_refused(raw: Raw) -> None:
    await raw.hello()
    raw.exec(1, ["sh", "-c", "read line; echo $line"])
    assert (await raw.recv())[0] == p.T_EXEC_STARTED
    raw.exec(1, ["true"])
    type_, stream, payload = await raw.recv()
    assert (type_, stream) == (p.T_ERROR, 1)
    assert json.loads(payload)["code"] == "INVALID_ARGUMENT"
    raw.send(p.T_STDIN, 1, b"first\n")
    raw.send(p.T_STDIN_CLOSE, 1)
    frames: list[tuple[int, int, bytes]] = []
    while not frames or frames[-1][0] != p.T_EXIT:
        frame = await raw.recv()
        if frame[0] != p.T_WINDOW:  # stdin credit coming back
            frames.append(frame)
    assert frames == [(p.T_STDOUT, 1, b"first\n"), (p.T_EXIT, 1, p.encode_exit(0))]


async def test_output_never_exceeds_granted_credit(raw: Raw) -> None:
    await raw.hello()
    window = 65536
    total = 1_000_000
    raw.exec(3, ["head", "-c", str(total), "/dev/zero"], window=window)
    raw.send(p.T_STDIN_CLOSE, 3)
    received = 0
    while received < window:
        type_, _, payload = await raw.recv()
        if type_ == p.T_STDOUT:
            assert 1 <= len(payload) <= p.MAX_DATA
            received += len(payload)
    # Everything in flight has arrived once a PING sent now is answered: still exactly the window.
    raw.send(p.T_PING, 100)
    while (frame := await raw.recv())[0] != p.T_PONG:
        assert frame[0] != p.T_STDOUT, "output beyond the granted credit"
    assert received == window
    raw.send(p.T_WINDOW, 3, p.encode_window(p.CH_STDOUT, total - window))
    while True:
        type_, _, payload = await raw.recv()
        if type_ == p.T_STDOUT:
            received += len(payload)
        elif type_ == p.T_EXIT:
            break
    assert received == total
    assert p.decode_exit(payload) == (0, "")


async def test_new_nonce_abandons_the_previous_host(agent: AgentProcess, raw: Raw) -> None:
    await raw.hello("first")
    raw.exec(1, ["sh", "-c", "echo ready; exec sleep 300"])
    raw.send(p.T_STDIN_CLOSE, 1)
    while (await raw.recv())[:2] != (p.T_STDOUT, 1):
        pass
    tree = descendants(agent.pid)
    assert tree
    # The same nonce again is a retransmission: nothing is reset.
    assert (await raw.hello("first"))[0] == p.T_HELLO_REPLY
    assert alive(tree) == tree
    # A new nonce is a host that started over: the old streams are killed without a word.
    assert (await raw.hello("second"))[0] == p.T_HELLO_REPLY
    await eventually(lambda: not alive(tree), 10, "the abandoned exec to be killed")
    raw.send(p.T_PING, 5)
    assert await raw.recv() == (p.T_PONG, 5, b"")  # and no EXIT for stream 1 came before it


async def test_kill_of_a_finished_or_unknown_stream_is_ignored(raw: Raw) -> None:
    await raw.hello()
    raw.send(p.T_KILL, 77)
    raw.send(p.T_STDIN, 77, b"x")
    raw.send(p.T_WINDOW, 77, p.encode_window(p.CH_STDOUT, 10))
    raw.send(0x7E, 0, b"unknown type")  # ignored: newer hosts may probe
    raw.send(p.T_PING, 1)
    assert await raw.recv() == (p.T_PONG, 1, b"")
