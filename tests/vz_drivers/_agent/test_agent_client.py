"""AgentClient against a scripted peer: handshake tolerance, error mapping, connection loss."""

from __future__ import annotations

import asyncio
import json
import os
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


async def _exec_output(client: AgentClient) -> list[ExecOutput]:
    """Output of one exec to its exit, or until the connection is lost (then the error propagates)."""
    out: list[ExecOutput] = []
    async for event in client.exec(spec("cat"), no_input(), chunk=p.MAX_WIDE_DATA):
        if isinstance(event, ExecOutput):
            out.append(event)
    return out


def _wide_reply(nonce: str) -> bytes:
    doc = {"version": 1, "nonce": nonce, "pid": 1, "nproc": 1, "mem_total": 1, "mode": "unix"}
    return p.frame(p.T_HELLO_REPLY, 0, json.dumps({**doc, "max_data": p.MAX_WIDE_DATA}).encode())


async def test_frames_are_cut_out_wherever_the_reads_split_them(cleanup: list[asyncio.Task[None]]) -> None:
    """Small frames many to a read, a wide frame over several reads, a frame sent with the handshake reply: all
    arrive whole and in order (the socket is read by the frame reader, no reader task)."""
    wide = bytes(range(256)) * 4096  # 1 MiB

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonce = await read_hello(reader)
        writer.write(_wide_reply(nonce))
        _, stream, _ = await read_frame(reader)
        small = b"".join(p.frame(p.T_STDOUT, stream, b"%d" % i) for i in range(50))
        big = p.frame(p.T_STDOUT, stream, wide)
        payload = small + big + p.frame(p.T_STDERR, stream, b"err") + p.frame(p.T_EXIT, stream, p.encode_exit(0, ""))
        for start in range(0, len(payload), 100_003):  # cuts through headers and payloads alike
            writer.write(payload[start : start + 100_003])
            await writer.drain()
            await asyncio.sleep(0.001)
        await reader.read()
        writer.close()

    client, task = await connect_pair(peer, wait_ready=False)
    cleanup.append(task)
    try:
        assert client._reader_task is None
        out = await _exec_output(client)
        stdout = [e.data for e in out if e.stream == "stdout"]
        assert stdout[:50] == [b"%d" % i for i in range(50)] and b"".join(stdout[50:]) == wide
        assert [e.data for e in out if e.stream == "stderr"] == [b"err"]
    finally:
        await client.close()
        await asyncio.wait([task], timeout=5)  # the peer saw the close and closed its end


async def test_what_the_agent_sent_with_its_handshake_reply_is_not_lost(cleanup: list[asyncio.Task[None]]) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonce = await read_hello(reader)
        # The start of the answer to the first request in the same write as the reply: the client's StreamReader
        # buffers it during the handshake, the frame reader must carry it on.
        pong = p.frame(p.T_PONG, 1, b"")
        writer.write(_wide_reply(nonce) + pong[:5])
        await writer.drain()
        assert (await read_frame(reader))[:2] == (p.T_PING, 1)
        writer.write(pong[5:])
        await reader.read()
        writer.close()

    client, task = await connect_pair(peer, wait_ready=False)
    cleanup.append(task)
    try:
        async with asyncio.timeout(5):
            assert await client.ping() >= 0
    finally:
        await client.close()
        await asyncio.wait([task], timeout=5)  # the peer saw the close and closed its end


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        pytest.param(b"XX" + b"\x00" * 10, "broke the protocol: bad frame header", id="bad-header"),
        pytest.param(p.HEADER.pack(p.MAGIC, p.T_STDOUT, 0, 1, 100_000) + b"x" * 5000, "middle of a frame", id="cut"),
    ],
)
async def test_a_broken_stream_is_unavailable_with_its_reason(
    cleanup: list[asyncio.Task[None]], tail: bytes, message: str
) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_wide_reply(await read_hello(reader)))
        _, stream, _ = await read_frame(reader)
        writer.write(p.frame(p.T_STDOUT, stream, b"partial") + tail)
        await writer.drain()
        writer.close()

    client, task = await connect_pair(peer, wait_ready=False)
    cleanup.append(task)
    try:
        with pytest.raises(UnavailableError, match=message):
            await _exec_output(client)
        assert client.closed
    finally:
        await client.close()
        await asyncio.wait([task], timeout=5)  # the peer saw the close and closed its end


async def test_a_pipe_pair_is_read_by_the_reader_task(cleanup: list[asyncio.Task[None]]) -> None:
    """Transports that are not sockets (a character device, pipes) keep the StreamReader and its reader task."""
    loop = asyncio.get_running_loop()
    to_guest_r, to_guest_w = os.pipe()
    to_host_r, to_host_w = os.pipe()

    async def streams(read_fd: int, write_fd: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(write_fd, "wb", 0)
        )
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    wide = os.urandom(300_000)

    async def peer() -> None:
        reader, writer = await streams(to_guest_r, to_host_w)
        writer.write(_wide_reply(await read_hello(reader)))
        _, stream, _ = await read_frame(reader)
        writer.write(p.frame(p.T_STDOUT, stream, wide) + p.frame(p.T_EXIT, stream, p.encode_exit(0, "")))
        await writer.drain()
        await reader.read()
        writer.close()

    task = asyncio.create_task(peer())
    cleanup.append(task)
    reader, writer = await streams(to_host_r, to_guest_w)
    client = await AgentClient.from_streams(reader, writer, timeout=5)
    try:
        assert client._reader_task is not None
        assert b"".join(e.data for e in await _exec_output(client)) == wide
    finally:
        await client.close()
        await asyncio.wait([task], timeout=5)  # the peer saw the close and closed its end
