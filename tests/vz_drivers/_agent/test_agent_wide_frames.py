"""Wide data frames: negotiated in HELLO (``max_data``) and asked for per exec; the 32 KiB rules stay the default.

Both directions of compatibility: a host that does not ask keeps 32 KiB frames (a larger one ends the session as
before), and a client talking to an agent that does not answer ``max_data`` sends and asks for nothing wide.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import AgentProcess, chunks, spec

from vz_core import ExecExit, ExecOutput
from vz_core.rpc import exec_output_limit
from vz_drivers._agent import AgentClient
from vz_drivers._agent import _protocol as p

_MIB = 1 << 20


class _Raw:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def send(self, type_: int, stream: int, payload: bytes = b"") -> None:
        self.writer.write(p.frame(type_, stream, payload))

    async def recv(self) -> tuple[int, int, bytes]:
        header = await asyncio.wait_for(self.reader.readexactly(p.HEADER_SIZE), 20)
        magic, type_, flags, stream, length = p.HEADER.unpack(header)
        assert (magic, flags) == (p.MAGIC, 0)
        return type_, stream, await asyncio.wait_for(self.reader.readexactly(length), 20)

    async def hello(self, **extra: object) -> dict[str, Any]:
        self.send(p.T_HELLO, 0, json.dumps({"versions": [1], "nonce": "n", **extra}).encode())
        type_, _, payload = await self.recv()
        assert type_ == p.T_HELLO_REPLY
        doc: dict[str, Any] = json.loads(payload)
        return doc

    async def cat(self, stream: int, data: bytes, frame: int, **request: object) -> list[int]:
        """``cat`` with ``data`` as stdin frames of ``frame`` bytes; the sizes of its stdout frames (data checked)."""
        self.send(p.T_EXEC_START, stream, json.dumps({"argv": ["cat"], **request}).encode())
        for i in range(0, len(data), frame):
            self.send(p.T_STDIN, stream, data[i : i + frame])
        self.send(p.T_STDIN_CLOSE, stream)
        out = bytearray()
        sizes: list[int] = []
        while True:
            type_, got, payload = await self.recv()
            assert got in (0, stream)
            if type_ == p.T_STDOUT:
                sizes.append(len(payload))
                out += payload
            elif type_ == p.T_EXIT:
                assert p.decode_exit(payload) == (0, "")
                break
            elif type_ == p.T_ERROR:
                raise AssertionError(f"the agent refused: {payload!r}")
        assert bytes(out) == data
        return sizes


@pytest.fixture
async def raw(agent: AgentProcess) -> AsyncIterator[_Raw]:
    reader, writer = await asyncio.open_unix_connection(str(agent.socket))
    try:
        yield _Raw(reader, writer)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_host_that_does_not_ask_keeps_32_kib_frames(raw: _Raw) -> None:
    assert (await raw.hello())["max_data"] == p.MAX_DATA
    data = os.urandom(3 * p.MAX_DATA)
    sizes = await raw.cat(1, data, p.MAX_DATA, window=4 * _MIB, max_data=_MIB)  # a wide exec is not agreed
    assert max(sizes) <= p.MAX_DATA
    raw.send(p.T_EXEC_START, 2, json.dumps({"argv": ["cat"]}).encode())
    raw.send(p.T_STDIN, 2, bytes(p.MAX_DATA + 1))  # over the limit: the session ends, as before
    with pytest.raises(asyncio.IncompleteReadError):
        while True:
            await raw.recv()


@pytest.mark.parametrize(("asked", "agreed"), [(_MIB, _MIB), (100_000, 100_000), (1 << 30, _MIB), (1000, p.MAX_DATA)])
async def test_hello_agrees_on_the_frame_size_asked_within_the_agents_limit(raw: _Raw, asked: int, agreed: int) -> None:
    assert (await raw.hello(max_data=asked))["max_data"] == agreed


async def test_wide_frames_both_ways_only_for_the_exec_that_asks(raw: _Raw) -> None:
    await raw.hello(max_data=_MIB)
    data = os.urandom(4 * _MIB)
    # Stdin in 1 MiB frames within a 4 MiB credit; output frames of up to 1 MiB.
    wide = await raw.cat(1, data, _MIB, window=8 * _MIB, max_data=_MIB, stdin_window=4 * _MIB)
    assert max(wide) > p.MAX_DATA and max(wide) <= _MIB
    assert len(wide) < len(data) // p.MAX_DATA
    # On the same session an exec that does not ask gets the protocol's frames (its stdin may still be wide).
    narrow = await raw.cat(3, data[: 256 * 1024], 256 * 1024, window=8 * _MIB)
    assert max(narrow) <= p.MAX_DATA


async def test_client_agrees_and_keeps_32_kib_events_unless_asked(client: AgentClient) -> None:
    assert client.info.max_data == p.MAX_WIDE_DATA
    data = os.urandom(8 * _MIB)
    blocks = [data[i : i + _MIB] for i in range(0, len(data), _MIB)]

    async def cat(**kwargs: Any) -> list[int]:
        sizes: list[int] = []
        out = hashlib.sha256()
        exit_: ExecExit | None = None
        async for event in client.exec(spec("cat"), chunks(*blocks), **kwargs):
            if isinstance(event, ExecOutput):
                sizes.append(len(event.data))
                out.update(event.data)
            else:
                exit_ = event
        assert exit_ == ExecExit(0) and out.hexdigest() == hashlib.sha256(data).hexdigest()
        return sizes

    assert max(await cat()) <= p.MAX_DATA  # Driver.exec's contract by default
    assert p.MAX_DATA < max(await cat(chunk=p.MAX_WIDE_DATA)) <= p.MAX_WIDE_DATA
    token = exec_output_limit.set(256 * 1024)  # what a vz plugin sets for a host that agreed on wide frames
    try:
        assert p.MAX_DATA < max(await cat()) <= 256 * 1024
    finally:
        exec_output_limit.reset(token)


async def test_a_32_kib_consumer_still_gets_wide_agent_frames_cut_into_events(client: AgentClient) -> None:
    frames: list[int] = []
    dispatch = client._dispatch

    def counting(type_: int, stream: int, payload: bytes) -> None:
        if type_ == p.T_STDOUT:
            frames.append(len(payload))
        dispatch(type_, stream, payload)

    client._dispatch = counting  # type: ignore[method-assign]
    data = os.urandom(4 * _MIB)
    events = [
        e async for e in client.exec(spec("cat"), chunks(*[data[i : i + _MIB] for i in range(0, len(data), _MIB)]))
    ]
    sizes = [len(e.data) for e in events if isinstance(e, ExecOutput)]
    assert events[-1] == ExecExit(0) and b"".join(e.data for e in events if isinstance(e, ExecOutput)) == data
    assert max(sizes) == p.MAX_DATA and max(frames) > p.MAX_DATA and len(frames) < len(sizes) // 4


async def test_client_with_an_agent_that_predates_wide_frames(tmp_path: Path) -> None:
    """An agent whose HELLO reply has no ``max_data``: 32 KiB stdin frames, no wide fields in EXEC_START."""
    seen: dict[str, Any] = {"stdin": []}

    async def old_agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            header = await reader.readexactly(p.HEADER_SIZE)
            _, type_, _, stream, length = p.HEADER.unpack(header)
            payload = await reader.readexactly(length)
            if type_ == p.T_HELLO:
                nonce = json.loads(payload)["nonce"]
                reply = {"version": 1, "nonce": nonce, "features": ["exec"], "mode": "unix"}
                writer.write(p.frame(p.T_HELLO_REPLY, 0, json.dumps(reply).encode()))
            elif type_ == p.T_EXEC_START:
                seen["start"] = json.loads(payload)
            elif type_ == p.T_STDIN:
                seen["stdin"].append(length)
                writer.write(p.frame(p.T_WINDOW, stream, p.encode_window(p.CH_STDIN, length)))
            elif type_ == p.T_STDIN_CLOSE:
                writer.write(p.frame(p.T_EXIT, stream, p.encode_exit(0)))
                await writer.drain()
                writer.close()
                return

    path = tmp_path / "old.sock"
    server = await asyncio.start_unix_server(old_agent, str(path))
    try:
        client = await AgentClient.connect_unix(path)
        try:
            assert client.info.max_data == p.MAX_DATA
            events = [e async for e in client.exec(spec("cat"), chunks(bytes(_MIB)), chunk=p.MAX_WIDE_DATA)]
            assert events == [ExecExit(0)]
        finally:
            await client.close()
    finally:
        server.close()
        await server.wait_closed()
    assert "max_data" not in seen["start"] and "stdin_window" not in seen["start"]
    assert max(seen["stdin"]) == p.MAX_DATA and sum(seen["stdin"]) == _MIB
