"""EXEC_FDS: the command's stdin, stdout and stderr are descriptors the host passed (SCM_RIGHTS), nothing copied."""

from __future__ import annotations

import array
import asyncio
import hashlib
import json
import os
import socket
import threading
from pathlib import Path

import pytest
from agent_helpers import AgentProcess, alive, descendants, eventually, run, spec
from exec_local_testlib import opened

from vz_core.errors import InvalidArgumentError
from vz_drivers._agent import AgentClient
from vz_drivers._agent import _protocol as p

_PAYLOAD = os.urandom(1 << 20) * 8  # 8 MiB


def _feed(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb", closefd=True) as f:
        f.write(data)


def _drain(fd: int, sink: list[bytes]) -> None:
    with os.fdopen(fd, "rb", closefd=True) as f:
        sink.append(f.read())


async def test_cat_of_a_pipe_into_a_pipe_moves_every_byte(client: AgentClient) -> None:
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    got: list[bytes] = []
    errs: list[bytes] = []
    feeder = threading.Thread(target=_feed, args=(in_w, _PAYLOAD))
    reader = threading.Thread(target=_drain, args=(out_r, got))
    err_reader = threading.Thread(target=_drain, args=(err_r, errs))
    for t in (feeder, reader, err_reader):
        t.start()
    try:
        exit_ = await client.exec_fds(spec("cat"), (in_r, out_w, err_w))
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)  # ours: the agent closed its copies, so the readers see the end
    await asyncio.to_thread(feeder.join)
    await asyncio.to_thread(reader.join)
    await asyncio.to_thread(err_reader.join)
    assert exit_.success
    assert hashlib.sha256(got[0]).hexdigest() == hashlib.sha256(_PAYLOAD).hexdigest()
    assert errs == [b""]


async def test_files_as_stdin_and_stdout(client: AgentClient, tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.write_bytes(_PAYLOAD)
    target = tmp_path / "out"
    with opened((source, os.O_RDONLY), (target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), (os.devnull, os.O_RDWR)) as (
        src,
        dst,
        null,
    ):
        exit_ = await client.exec_fds(spec("cat"), (src, dst, null))
    assert exit_.success
    assert target.read_bytes() == _PAYLOAD


async def test_stdout_and_stderr_are_the_given_descriptors(client: AgentClient, tmp_path: Path) -> None:
    out, err = tmp_path / "out", tmp_path / "err"
    with opened(
        (os.devnull, os.O_RDWR),
        (out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ) as (null, o, e):
        exit_ = await client.exec_fds(
            spec("sh", "-c", "echo to-out; echo to-err >&2; ls /proc/self/fd; exit 7"),
            (null, o, e),
        )
    assert exit_.exit_code == 7 and exit_.signal == ""
    lines = out.read_text().split()
    assert lines[0] == "to-out"
    # 0, 1, 2 and the descriptor ls reads the directory with: nothing of the agent or the host leaked in
    assert sorted(int(x) for x in lines[1:]) == [0, 1, 2, 3]
    assert err.read_text() == "to-err\n"


async def test_signal_exit_is_reported(client: AgentClient) -> None:
    with opened((os.devnull, os.O_RDWR)) as (null,):
        fd = null
        exit_ = await client.exec_fds(spec("sh", "-c", "kill -TERM $$"), (fd, fd, fd))
    assert (exit_.exit_code, exit_.signal) == (143, "SIGTERM")


async def test_missing_executable_is_127_with_the_message_on_the_given_stderr(
    client: AgentClient, tmp_path: Path
) -> None:
    err = tmp_path / "err"
    with opened((os.devnull, os.O_RDWR), (err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)) as (null, e):
        exit_ = await client.exec_fds(spec("no-such-command-here"), (null, null, e))
    assert exit_.exit_code == 127
    assert "executable file not found" in err.read_text()


async def test_unknown_user_is_invalid_argument(client: AgentClient) -> None:
    with opened((os.devnull, os.O_RDWR)) as (null,):
        fd = null
        with pytest.raises(InvalidArgumentError):
            await client.exec_fds(spec("true", user="no-such-user-here"), (fd, fd, fd))
    assert (await run(client, "true")).exit.success


async def _tree(agent: AgentProcess, out_r: int) -> dict[int, float]:
    line = await asyncio.to_thread(os.read, out_r, 100)
    assert line == b"ready\n"
    await eventually(lambda: len(descendants(agent.pid)) == 4, 10, "the command tree to be complete")
    return descendants(agent.pid)


_TREE = "echo ready; sh -c 'sleep 300 & sleep 300' & wait"


async def test_cancel_kills_the_whole_tree(agent: AgentProcess, client: AgentClient) -> None:
    out_r, out_w = os.pipe()
    with opened((os.devnull, os.O_RDWR)) as (null,):
        task = asyncio.create_task(client.exec_fds(spec("sh", "-c", _TREE), (null, out_w, null)))
        try:
            tree = await _tree(agent, out_r)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await eventually(lambda: not alive(tree), 10, "the whole tree to be killed")
        finally:
            os.close(out_w)
            os.close(out_r)
    assert (await run(client, "true")).exit.success


async def test_closing_the_connection_kills_the_command(agent: AgentProcess) -> None:
    client = await agent.client()
    out_r, out_w = os.pipe()
    with opened((os.devnull, os.O_RDWR)) as (null,):
        task = asyncio.create_task(client.exec_fds(spec("sh", "-c", _TREE), (null, out_w, null)))
        try:
            tree = await _tree(agent, out_r)
            await client.close()
            with pytest.raises(Exception):  # noqa: B017 - UnavailableError; the point is the kill below
                await task
            await eventually(lambda: not alive(tree), 10, "the tree of a lost connection to be killed")
        finally:
            os.close(out_w)
            os.close(out_r)


async def test_a_terminal_is_refused_by_the_client(client: AgentClient) -> None:
    master, slave = os.openpty()
    try:
        with opened((os.devnull, os.O_RDWR)) as (null,), pytest.raises(InvalidArgumentError, match="terminal"):
            await client.exec_fds(spec("true"), (null, slave, null))
    finally:
        os.close(master)
        os.close(slave)


def _raw_exec_fds(path: Path, fds: list[int], request: dict[str, object]) -> tuple[int, bytes]:
    """HELLO, then one EXEC_FDS carrying ``fds``, over a plain socket; the type and payload of the answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        sock.sendall(p.frame(p.T_HELLO, 0, json.dumps({"versions": [1], "nonce": "ab"}).encode()))
        f = sock.makefile("rb")

        def frame() -> tuple[int, int, bytes]:
            magic, type_, _flags, stream, length = p.HEADER.unpack(f.read(p.HEADER_SIZE))
            assert magic == p.MAGIC
            return type_, stream, f.read(length)

        assert frame()[0] == p.T_HELLO_REPLY
        data = p.frame(p.T_EXEC_FDS, 5, json.dumps(request).encode())
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
        while True:
            type_, stream, payload = frame()
            if stream == 5 and type_ in (p.T_ERROR, p.T_EXIT):
                return type_, payload


async def test_a_terminal_is_refused_by_the_agent(agent: AgentProcess) -> None:
    master, slave = os.openpty()
    try:
        with opened((os.devnull, os.O_RDWR)) as (null,):
            fds = [null, null, slave]
            type_, payload = await asyncio.to_thread(
                _raw_exec_fds, agent.socket, fds, {"argv": ["sh", "-c", "echo injected >&2"], "fds": 3}
            )
        os.set_blocking(master, False)
        try:
            leaked = os.read(master, 100)  # what the command would have written to the terminal
        except BlockingIOError:
            leaked = b""
    finally:
        os.close(slave)
        os.close(master)
    assert type_ == p.T_ERROR
    doc = json.loads(payload)
    assert doc["code"] == "INVALID_ARGUMENT" and "stderr descriptor is a terminal" in doc["message"]
    assert leaked == b""


async def test_missing_descriptors_are_refused(agent: AgentProcess) -> None:
    with opened((os.devnull, os.O_RDWR)) as (null,):
        type_, payload = await asyncio.to_thread(_raw_exec_fds, agent.socket, [null], {"argv": ["true"], "fds": 3})
    assert type_ == p.T_ERROR
    assert json.loads(payload)["code"] == "INVALID_ARGUMENT"


async def test_many_in_a_row_leak_no_descriptor_in_the_agent(agent: AgentProcess, client: AgentClient) -> None:
    def count() -> int:
        return len(os.listdir(f"/proc/{agent.pid}/fd"))

    with opened((os.devnull, os.O_RDWR)) as (null,):
        fd = null
        assert (await client.exec_fds(spec("true"), (fd, fd, fd))).success
        before = count()
        for _ in range(20):
            assert (await client.exec_fds(spec("true"), (fd, fd, fd))).success
    assert count() == before
