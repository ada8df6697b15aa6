"""The host end of an agent channel: never through a link, only to the expected listener."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from vz_core.errors import UnavailableError
from vz_drivers._machine import open_agent_socket


@pytest.fixture
def listener(tmp_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "agent.sock"))
    sock.listen()
    return sock


async def test_the_expected_listener_is_reached(listener: socket.socket, tmp_path: Path) -> None:
    try:
        _reader, writer = await open_agent_socket(tmp_path / "agent.sock", os.getpid(), what="Machine 'w'")
        conn, _ = listener.accept()
        writer.write(b"ping")
        await writer.drain()
        assert conn.recv(4) == b"ping"
        conn.close()
        writer.close()
        await writer.wait_closed()
    finally:
        listener.close()


async def test_another_listener_is_refused_before_anything_is_sent(listener: socket.socket, tmp_path: Path) -> None:
    try:
        with pytest.raises(UnavailableError, match=f"served by process {os.getpid()}, not by"):
            await open_agent_socket(tmp_path / "agent.sock", os.getpid() + 1, what="Machine 'w'")
        listener.setblocking(False)
        conn, _ = listener.accept()  # the refused connection arrived, and carries nothing
        conn.setblocking(False)
        with pytest.raises((BlockingIOError, ConnectionError)):
            assert conn.recv(1) == b""
            raise ConnectionError
        conn.close()
    finally:
        listener.close()


async def test_a_link_is_refused_not_followed(listener: socket.socket, tmp_path: Path) -> None:
    link = tmp_path / "link.sock"
    link.symlink_to(tmp_path / "agent.sock")
    try:
        with pytest.raises(UnavailableError, match="symbolic link"):
            await open_agent_socket(link, os.getpid(), what="Machine 'w'")
    finally:
        listener.close()


async def test_missing_and_non_socket_paths_are_unavailable(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError, match="cannot be opened"):
        await open_agent_socket(tmp_path / "missing.sock", os.getpid(), what="Machine 'w'")
    (tmp_path / "file").write_text("")
    with pytest.raises(UnavailableError, match="not a socket"):
        await open_agent_socket(tmp_path / "file", os.getpid(), what="Machine 'w'")
