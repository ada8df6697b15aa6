"""Wide Exec frames between a vz host and a vz plugin: what the plugin's driver is told (exec_output_limit), what
``exec`` hands its caller (wide frames cut to the contract's chunks, everything else as sent), and the pipes
exec_local copies through."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

from vz_conformance.fake import FakeDriver

from vz_core import MAX_CHUNK, ExecEvent, ExecExit, ExecOutput, ExecSpec, RunImageRequest
from vz_core.rpc import (
    MAX_WIDE_CHUNK,
    WIDE_CHUNK_KEY,
    RemoteDriver,
    connect_in_process,
    exec_output_limit,
    serve_in_process,
)
from vz_core.rpc.pb import runtime_pb2 as pb
from vz_core.rpc.pb import runtime_pb2_grpc as pb_grpc

_DATA = os.urandom(1 << 20) * 3


class _Recording(FakeDriver):
    """The fake, noting the output limit its exec runs under and yielding output chunks that wide."""

    limits: list[int]

    async def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncGenerator[ExecEvent, None]:
        limit = exec_output_limit.get()
        self.limits.append(limit)
        pending = b""
        async for event in super().exec(spec, stdin):
            if isinstance(event, ExecOutput):
                pending += event.data
                while len(pending) >= limit:
                    yield ExecOutput(event.stream, pending[:limit])
                    pending = pending[limit:]
                continue
            if pending:
                yield ExecOutput("stdout", pending)
                pending = b""
            yield event


async def _stdin() -> AsyncIterator[bytes]:
    for i in range(0, len(_DATA), 1 << 20):
        yield _DATA[i : i + (1 << 20)]


async def _raw_exec(channel: Any) -> list[Any]:
    """cat of ``_DATA`` over a bare Exec call that offers no wide frames (a host that is not vz): the frames."""
    call = pb_grpc.RuntimeDriverStub(channel).Exec()  # type: ignore[no-untyped-call]
    await call.write(pb.ExecClientMessage(start=pb.ExecStart(workspace_id="m", argv=["cat"])))
    for i in range(0, len(_DATA), MAX_CHUNK):
        await call.write(pb.ExecClientMessage(stdin=_DATA[i : i + MAX_CHUNK]))
    await call.write(pb.ExecClientMessage(close_stdin=pb.CloseStdin()))
    await call.done_writing()
    frames = [msg async for msg in call]
    assert all(key != WIDE_CHUNK_KEY for key, _ in await call.initial_metadata() or ())
    return frames


async def test_the_driver_sees_a_wide_limit_only_when_the_host_agreed(tmp_path: Path) -> None:
    fake = _Recording(tmp_path / "state")
    fake.limits = []
    try:
        async with serve_in_process(fake, local_exec=False) as channel:
            remote = RemoteDriver(channel=channel)
            try:
                await remote.run_image(RunImageRequest("m", "img"))
                cut = [e async for e in remote.exec(ExecSpec("m", ("cat",)), _stdin())]
                wide = [e async for e in remote._wide_exec(ExecSpec("m", ("cat",)), _stdin())]
            finally:
                await remote.close()
            frames = await _raw_exec(channel)
        assert fake.limits == [MAX_WIDE_CHUNK, MAX_WIDE_CHUNK, MAX_CHUNK]
        assert exec_output_limit.get() == MAX_CHUNK  # nothing leaks out of the call
        for events in (cut, wide):
            assert events[-1] == ExecExit(0)
            assert b"".join(e.data for e in events if isinstance(e, ExecOutput)) == _DATA
        # exec hands its caller the contract's chunks: the wide frames cut into MAX_CHUNK pieces
        assert {len(e.data) for e in cut if isinstance(e, ExecOutput)} == {MAX_CHUNK}
        assert max(len(e.data) for e in wide if isinstance(e, ExecOutput)) == MAX_WIDE_CHUNK
        # a host that offers nothing gets the protocol's frames
        assert frames[-1].WhichOneof("payload") == "exit"
        assert b"".join(f.stdout.data for f in frames[:-1]) == _DATA
        assert max(len(f.stdout.data) for f in frames[:-1]) == MAX_CHUNK
    finally:
        await fake.close()


class _Odd(FakeDriver):
    """A driver yielding, under a wide limit, what it may not: an empty chunk and chunks over the agreed size,
    between lawful ones."""

    async def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncGenerator[ExecEvent, None]:
        async for _ in stdin:
            pass
        yield ExecOutput("stdout", b"a" * 100)
        yield ExecOutput("stdout", b"")
        yield ExecOutput("stdout", b"b" * 100)
        yield ExecOutput("stdout", b"c" * (MAX_WIDE_CHUNK + 1))
        yield ExecOutput("stderr", b"d" * (3 * MAX_CHUNK + 5))
        yield ExecExit(0)


async def test_exec_hands_on_every_frame_a_plugin_may_not_send_as_it_came(tmp_path: Path) -> None:
    fake = _Odd(tmp_path / "state")
    try:
        async with connect_in_process(fake, local_exec=False) as remote:
            await remote.run_image(RunImageRequest("m", "img"))
            events = [e async for e in remote.exec(ExecSpec("m", ("x",)), _stdin())]
    finally:
        await fake.close()
    sizes = [(e.stream, len(e.data)) for e in events if isinstance(e, ExecOutput)]
    assert sizes == [
        ("stdout", 100),
        ("stdout", 0),  # never joined with the chunk after it
        ("stdout", 100),
        ("stdout", MAX_WIDE_CHUNK + 1),  # over the agreed size: not cut, the caller sees the violation
        *[("stderr", MAX_CHUNK)] * 3,
        ("stderr", 5),
    ]
    assert events[-1] == ExecExit(0)


async def test_exec_local_over_frames_widens_the_pipes_it_copies_through(tmp_path: Path) -> None:
    fake = _Recording(tmp_path / "state")
    fake.limits = []
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    got = bytearray()

    def feed() -> None:
        with os.fdopen(in_w, "wb") as f:
            f.write(_DATA)

    def drain() -> None:
        with os.fdopen(out_r, "rb") as f:
            got.extend(f.read())

    threads = [threading.Thread(target=feed), threading.Thread(target=drain)]
    try:
        assert fcntl.fcntl(in_r, fcntl.F_GETPIPE_SZ) < MAX_WIDE_CHUNK  # a default pipe
        async with connect_in_process(fake, local_exec=False) as remote:
            await remote.run_image(RunImageRequest("m", "img"))
            for t in threads:
                t.start()
            exit_ = await remote.exec_local("m", ExecSpec("m", ("cat",)), (in_r, out_w, null))
            sizes = (fcntl.fcntl(in_r, fcntl.F_GETPIPE_SZ), fcntl.fcntl(out_w, fcntl.F_GETPIPE_SZ))
    finally:
        for fd in (in_r, out_w, null):
            os.close(fd)
        for t in threads:
            await asyncio.to_thread(t.join)
        await fake.close()
    assert exit_ == ExecExit(0) and bytes(got) == _DATA
    assert sizes == (MAX_WIDE_CHUNK, MAX_WIDE_CHUNK)
    assert fake.limits == [MAX_WIDE_CHUNK]
