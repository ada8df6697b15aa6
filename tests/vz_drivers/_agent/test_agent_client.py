"""AgentClient against a scripted peer: handshake tolerance, error mapping, connection loss."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import no_input, spec

from vz_core import ExecOutput
from vz_core.errors import IncompatibleVersionError, PermissionDeniedError, UnavailableError
from vz_drivers._agent import AgentClient
from vz_drivers._agent import _protocol as p

Peer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    magic, type_, _, stream, length = p.HEADER.unpack(await reader.readexactly(p.HEADER_SIZE))
    assert magic == p.MAGIC
    return type_, stream, await reader.readexactly(length)


def reply(nonce: str, version: int = 1) -> bytes:
    doc = {"version": version, "nonce": nonce, "pid": 1, "nproc": 1, "mem_total": 1, "mode": "stream"}
    return p.frame(p.T_HELLO_REPLY, 0, json.dumps(doc).encode())


async def read_hello(reader: asyncio.StreamReader) -> str:
    type_, stream, payload = await read_frame(reader)
    assert (type_, stream) == (p.T_HELLO, 0)
    doc = json.loads(payload)
    assert doc["versions"] == [1]
    return str(doc["nonce"])


async def connect_pair(
    peer: Peer, *, wait_ready: bool, handshake_limit: float = 5
) -> tuple[AgentClient, asyncio.Task[None]]:
    host, guest = socket.socketpair()
    g_reader, g_writer = await asyncio.open_connection(sock=guest)
    task = asyncio.create_task(peer(g_reader, g_writer))
    reader, writer = await asyncio.open_connection(sock=host)
    try:
        client = await AgentClient.from_streams(reader, writer, wait_ready=wait_ready, timeout=handshake_limit)
    except BaseException:
        task.cancel()
        await asyncio.wait([task])
        g_writer.close()
        raise
    return client, task


@pytest.fixture
async def cleanup() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


async def test_stream_mode_skips_garbage_ready_and_stale_replies(cleanup: list[asyncio.Task[None]]) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonce = await read_hello(reader)
        writer.write(b"\x00garbage VZ" + p.frame(p.T_READY, 0, p.READY_PAYLOAD) + reply("stale-nonce") + reply(nonce))
        await reader.read()  # until the client closes
        writer.close()

    client, task = await connect_pair(peer, wait_ready=True)
    cleanup.append(task)
    assert client.info.pid == 1
    await client.close()


async def test_stream_mode_resends_hello_until_answered(cleanup: list[asyncio.Task[None]]) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await read_hello(reader)  # lost, like bytes sent before the agent started reading
        second = await read_hello(reader)
        assert first == second
        writer.write(reply(second))
        await reader.read()
        writer.close()

    client, task = await connect_pair(peer, wait_ready=True)
    cleanup.append(task)
    await client.close()


async def test_socket_mode_rejects_garbage(cleanup: list[asyncio.Task[None]]) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_hello(reader)
        writer.write(b"not a frame at all")
        await reader.read()
        writer.close()

    with pytest.raises(UnavailableError, match="garbage"):
        await connect_pair(peer, wait_ready=False)


async def test_handshake_timeout_is_unavailable() -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    with pytest.raises(UnavailableError, match="handshake"):
        await connect_pair(peer, wait_ready=False, handshake_limit=0.2)


async def test_unknown_protocol_version_in_reply(cleanup: list[asyncio.Task[None]]) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(await read_hello(reader), version=2))
        await reader.read()
        writer.close()

    with pytest.raises(IncompatibleVersionError):
        await connect_pair(peer, wait_ready=False)


async def test_connect_to_missing_socket_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError, match="cannot connect"):
        await AgentClient.connect_unix(tmp_path / "nothing.sock", timeout=2)


async def test_stream_error_maps_to_its_category(cleanup: list[asyncio.Task[None]]) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(await read_hello(reader)))
        type_, stream, _ = await read_frame(reader)
        assert type_ == p.T_EXEC_START
        error = {"code": "PERMISSION_DENIED", "message": "may not switch user"}
        writer.write(p.frame(p.T_ERROR, stream, json.dumps(error).encode()))
        await reader.read()
        writer.close()

    client, task = await connect_pair(peer, wait_ready=False)
    cleanup.append(task)
    try:
        with pytest.raises(PermissionDeniedError, match="may not switch user"):
            async for _ in client.exec(spec("true"), no_input()):
                pass
    finally:
        await client.close()


async def test_connection_lost_mid_exec_is_unavailable(cleanup: list[asyncio.Task[None]]) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(await read_hello(reader)))
        _, stream, _ = await read_frame(reader)
        writer.write(p.frame(p.T_STDOUT, stream, b"partial"))
        await writer.drain()
        writer.close()

    client, task = await connect_pair(peer, wait_ready=False)
    cleanup.append(task)
    try:
        events = client.exec(spec("cat"), no_input())
        assert await anext(events) == ExecOutput("stdout", b"partial")
        with pytest.raises(UnavailableError, match="closed the connection"):
            await anext(events)
        assert client.closed
        with pytest.raises(UnavailableError):
            await client.ping()
    finally:
        await client.close()
