"""The REST client against a stand-in server speaking vfkit's documented API over a real Unix socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from vfkit_standin import StandinVm, serve_rest

from vz_drivers.vfkit._rest import RestError, RestUnreachable, VfkitRest


@pytest.fixture
async def served(short_dir: Path) -> AsyncIterator[tuple[VfkitRest, StandinVm]]:
    vm = StandinVm()
    path = str(short_dir / "rest.sock")
    server = await serve_rest(path, vm)
    try:
        yield VfkitRest(path, timeout=5), vm
    finally:
        server.close()
        await server.wait_closed()


async def test_state_reads_every_documented_field(served: tuple[VfkitRest, StandinVm]) -> None:
    rest, vm = served
    state = await rest.state()
    assert state.running and not state.stopped
    assert (state.can_stop, state.can_hard_stop, state.can_pause, state.can_resume, state.can_start) == (
        True,
        True,
        True,
        False,
        False,
    )
    assert vm.requests[-1][:2] == ("GET", "/vm/state")


async def test_state_changes_post_the_documented_body(served: tuple[VfkitRest, StandinVm]) -> None:
    rest, vm = served
    await rest.change_state("Pause")
    assert (await rest.state()).state == "VirtualMachineStatePaused"
    await rest.change_state("Resume")
    await rest.change_state("Stop")
    method, path, body = next(r for r in vm.requests if r[0] == "POST" and json.loads(r[2])["state"] == "Stop")
    assert (method, path, json.loads(body)) == ("POST", "/vm/state", {"state": "Stop"})
    await asyncio.wait_for(vm.stopped.wait(), 5)
    assert (await rest.state()).stopped


async def test_a_failed_change_carries_vfkits_error(served: tuple[VfkitRest, StandinVm]) -> None:
    rest, vm = served
    vm.behaviour = "ignore-all"
    with pytest.raises(RestError, match="VZErrorDomain") as info:
        await rest.change_state("HardStop")
    assert info.value.status == 500


async def test_undocumented_states_are_refused_before_sending(served: tuple[VfkitRest, StandinVm]) -> None:
    rest, vm = served
    before = len(vm.requests)
    with pytest.raises(ValueError, match="Stop, HardStop, Pause, Resume"):
        await rest.change_state("Reboot")
    assert len(vm.requests) == before


async def test_inspect_reads_the_served_and_the_documented_spelling(served: tuple[VfkitRest, StandinVm]) -> None:
    rest, vm = served
    vm.devices = [{"kind": "virtio-blk", "path": "/d.img"}]
    vm.chunked = True  # a chunked body is read too
    got = await rest.inspect()
    assert (got.cpus, got.memory_bytes, got.devices) == (2, 2048 << 20, ({"kind": "virtio-blk", "path": "/d.img"},))


async def test_documented_inspect_shape(short_dir: Path) -> None:
    path = str(short_dir / "doc.sock")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = json.dumps({"cpus": 4, "memory": 1 << 30, "devices": []}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=path)
    try:
        got = await VfkitRest(path).inspect()
    finally:
        server.close()
        await server.wait_closed()
    assert (got.cpus, got.memory_bytes) == (4, 1 << 30)


async def test_no_socket_is_unreachable(short_dir: Path) -> None:
    with pytest.raises(RestUnreachable, match="cannot connect"):
        await VfkitRest(str(short_dir / "missing.sock")).state()


async def test_a_silent_server_times_out_as_unreachable(short_dir: Path) -> None:
    path = str(short_dir / "mute.sock")
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=path)
    try:
        with pytest.raises(RestUnreachable, match="did not answer"):
            await VfkitRest(path, timeout=0.3).state()
    finally:
        release.set()
        server.close()
        await server.wait_closed()


async def test_garbage_is_a_rest_error(short_dir: Path) -> None:
    path = str(short_dir / "junk.sock")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nnope!")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=path)
    try:
        with pytest.raises(RestError, match="not JSON"):
            await VfkitRest(path).state()
    finally:
        server.close()
        await server.wait_closed()
