"""Wide Exec frames between a vz host and a vz plugin: what the plugin's driver is told (exec_output_limit), and
the pipes exec_local copies through."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

from vz_conformance.fake import FakeDriver

from vz_core import MAX_CHUNK, ExecEvent, ExecExit, ExecOutput, ExecSpec, RunImageRequest
from vz_core.rpc import MAX_WIDE_CHUNK, connect_in_process, exec_output_limit

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


async def test_the_driver_sees_a_wide_limit_only_when_the_host_agreed(tmp_path: Path) -> None:
    fake = _Recording(tmp_path / "state")
    fake.limits = []
    try:
        async with connect_in_process(fake, local_exec=False) as remote:
            await remote.run_image(RunImageRequest("m", "img"))
            narrow = [e async for e in remote.exec(ExecSpec("m", ("cat",)), _stdin())]
            wide = [e async for e in remote._wide_exec(ExecSpec("m", ("cat",)), _stdin())]
        assert fake.limits == [MAX_CHUNK, MAX_WIDE_CHUNK]
        assert exec_output_limit.get() == MAX_CHUNK  # nothing leaks out of the call
        for events in (narrow, wide):
            assert events[-1] == ExecExit(0)
            assert b"".join(e.data for e in events if isinstance(e, ExecOutput)) == _DATA
        assert max(len(e.data) for e in narrow if isinstance(e, ExecOutput)) == MAX_CHUNK
        assert max(len(e.data) for e in wide if isinstance(e, ExecOutput)) == MAX_WIDE_CHUNK
    finally:
        await fake.close()


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
