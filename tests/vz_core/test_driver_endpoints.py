"""The descriptors a local exec copies through (``copy_exec_local``'s endpoints) leave the caller's
descriptors as they were and keep none of their own once closed."""

from __future__ import annotations

import os
import socket

from vz_core._driver import _Endpoint


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


async def test_a_socket_endpoint_closes_its_duplicate_and_keeps_the_callers_socket() -> None:
    ours, theirs = socket.socketpair()
    try:
        before = _open_fds()
        endpoint = _Endpoint(ours.fileno(), write=True)
        assert len(_open_fds() - before) == 1  # a duplicate of its own, used with MSG_DONTWAIT
        await endpoint.write(b"through the duplicate")
        endpoint.close()
        assert _open_fds() == before
        assert theirs.recv(100) == b"through the duplicate"
        ours.sendall(b"still open")  # the caller's descriptor is untouched
        assert theirs.recv(100) == b"still open"
    finally:
        ours.close()
        theirs.close()


async def test_a_pipe_endpoint_closes_its_reopened_description() -> None:
    r, w = os.pipe()
    try:
        before = _open_fds()
        endpoint = _Endpoint(r, write=False)
        os.write(w, b"data")
        assert await endpoint.read() == b"data"
        endpoint.close()
        assert _open_fds() == before
        os.write(w, b"more")
        assert os.read(r, 10) == b"more"
    finally:
        os.close(r)
        os.close(w)
