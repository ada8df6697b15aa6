"""The Windows daemon endpoint (vz_core.platform.pipes, vz_core.daemon._pipe) and the local wire's byte channel.

What runs on every host: the pipe's name, its security descriptor, the refusal of other users' clients, and
the local wire's framing over a stream that is not a socket (what the CLI reads the pipe through). What needs a
Windows host (a real named pipe, its DACL, FILE_FLAG_FIRST_PIPE_INSTANCE, the client's SID) runs in the Windows
lane (.github/workflows/windows.yml) and is skipped elsewhere with the reason "Windows only".
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from vz_core.platform.pipes import PIPE_PREFIX, client_refusal, is_sid, owner_only_sddl, pipe_name
from vz_core.wire._frames import Channel, WireError, encode_binary, encode_json

windows_only = pytest.mark.skipif(sys.platform != "win32", reason="Windows only")

USER_SID = "S-1-5-21-3623811015-3361044348-30300820-1013"


def test_pipe_name_is_per_user_and_per_home() -> None:
    name = pipe_name("alice", "/home/alice/.local/state/vz")
    assert name.startswith(PIPE_PREFIX + "vz-alice-")
    digest = name.rsplit("-", 1)[1]
    assert len(digest) == 16 and all(c in "0123456789abcdef" for c in digest)
    assert pipe_name("alice", "/home/alice/.local/state/vz") == name
    assert pipe_name("bob", "/home/alice/.local/state/vz") != name
    assert pipe_name("alice", "/home/alice/other") != name


def test_pipe_name_folds_case_and_trailing_separators_like_windows_paths() -> None:
    assert pipe_name("a", "/Users/A/State") == pipe_name("a", "/users/a/state/")


def test_pipe_name_keeps_only_safe_user_characters() -> None:
    name = pipe_name("dom\\us er:*", "/h")
    tail = name[len(PIPE_PREFIX) :]
    assert "\\" not in tail and " " not in tail and ":" not in tail and "*" not in tail
    assert tail.startswith("vz-dom_us_er__-")
    assert pipe_name("", "/h").startswith(PIPE_PREFIX + "vz-user-")


def test_owner_only_sddl_grants_the_user_and_system_only() -> None:
    assert owner_only_sddl(USER_SID) == f"D:P(A;;GA;;;{USER_SID})(A;;GA;;;SY)"


@pytest.mark.parametrize(
    "bad",
    ["", "WD", "S-1-5-21-1)(A;;GA;;;WD", "S-1", "S-2-5-18", "S-1-5-x", "S-1-5-99999999999", "S-1-5-21-1;WD"],
)
def test_owner_only_sddl_refuses_anything_but_a_sid(bad: str) -> None:
    assert not is_sid(bad)
    with pytest.raises(ValueError, match="is not a SID"):
        owner_only_sddl(bad)


def test_is_sid_accepts_the_forms_windows_renders() -> None:
    assert is_sid("S-1-5-18")
    assert is_sid(USER_SID)
    assert is_sid("S-1-0x500000000-32-579")


def test_only_the_daemons_own_user_is_admitted() -> None:
    assert client_refusal(42, USER_SID, USER_SID) is None
    other = "S-1-5-21-3623811015-3361044348-30300820-1014"
    reason = client_refusal(42, other, USER_SID)
    assert reason is not None and other in reason and "pid 42" in reason
    assert client_refusal(7, "S-1-5-18", USER_SID) is not None  # SYSTEM may open the pipe, it is no vz client
    unknown = client_refusal(9, None, USER_SID)
    assert unknown is not None and "could not be identified" in unknown


class _MemoryStream:
    """An in-memory stand-in for the pipe's client end: what ``Channel`` needs, and nothing of a socket."""

    def __init__(self, incoming: bytes, chunk: int = 3) -> None:
        self.incoming = bytearray(incoming)
        self.chunk = chunk
        self.sent = bytearray()
        self.closed = False

    def fileno(self) -> int:
        return -1

    def recv(self, n: int) -> bytes:
        take = bytes(self.incoming[: min(n, self.chunk)])
        del self.incoming[: len(take)]
        return take

    def recv_into(self, buffer: memoryview) -> int:
        data = self.recv(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def sendall(self, data: bytes | memoryview) -> None:
        self.sent += bytes(data)

    def close(self) -> None:
        self.closed = True


def test_the_framing_runs_over_a_stream_that_is_not_a_socket() -> None:
    wire = encode_json({"hello": {"pid": 1}}) + encode_binary(1, b"x" * 10) + encode_json({"result": {}})
    stream = _MemoryStream(wire, chunk=3)  # every read short: headers and payloads arrive in pieces
    channel = Channel(stream, fd_passing=False)  # type: ignore[arg-type]
    assert channel.receive() == ({"hello": {"pid": 1}}, [])
    assert channel.receive() == ((1, b"x" * 10), [])
    assert channel.receive() == ({"result": {}}, [])
    assert channel.receive() is None
    channel.send({"call": {"method": "System.Status", "request": {}}})
    channel.write(0, b"in")
    assert bytes(stream.sent) == encode_json({"call": {"method": "System.Status", "request": {}}}) + encode_binary(
        0, b"in"
    )


def test_a_stream_without_descriptor_passing_refuses_descriptors_before_sending() -> None:
    stream = _MemoryStream(b"")
    channel = Channel(stream, fd_passing=False)  # type: ignore[arg-type]
    r, w = os.pipe()
    try:
        with pytest.raises(WireError, match="cannot hand file descriptors"):
            channel.send({"call": {}}, fds=[r])
    finally:
        os.close(r)
        os.close(w)
    assert not stream.sent


def test_a_stream_closing_inside_a_header_is_a_wire_error() -> None:
    channel = Channel(_MemoryStream(encode_json({"a": 1})[:3]), fd_passing=False)  # type: ignore[arg-type]
    with pytest.raises(WireError, match="middle of a message header"):
        channel.receive()


def test_a_bad_length_is_refused_over_a_stream_too() -> None:
    channel = Channel(_MemoryStream(b"PRI * HTTP/2.0"), fd_passing=False)  # type: ignore[arg-type]
    with pytest.raises(WireError, match="declared length"):
        channel.receive()


# ---- Windows lane ---------------------------------------------------------------------------------------------


def _unique_pipe() -> str:
    return f"{PIPE_PREFIX}vz-test-{os.getpid()}-{threading.get_ident()}-{os.urandom(4).hex()}"


@windows_only
def test_the_first_instance_is_exclusive() -> None:
    import _winapi

    from vz_core.platform.pipes import create_pipe, current_sid

    name, sddl = _unique_pipe(), owner_only_sddl(current_sid())
    first = create_pipe(name, sddl, first=True)
    try:
        with pytest.raises(PermissionError):
            create_pipe(name, sddl, first=True)
        second = create_pipe(name, sddl, first=False)
        _winapi.CloseHandle(second)
    finally:
        _winapi.CloseHandle(first)


@windows_only
def test_a_client_of_the_daemons_pipe_is_our_user_and_the_wire_runs_over_it() -> None:
    from vz_core.daemon._pipe import AsyncPipeChannel, PipeListener, admit
    from vz_core.platform.pipes import current_sid, open_pipe, pipe_server_pid

    name = _unique_pipe()

    async def main() -> None:
        listener = PipeListener(name)
        try:
            accepting = asyncio.ensure_future(listener.accept())
            stream = await asyncio.to_thread(open_pipe, name)
            assert stream is not None
            assert pipe_server_pid(stream.fileno()) == os.getpid()
            pipe = await accepting
            pid, refusal = admit(pipe, current_sid())
            assert refusal is None and pid == os.getpid()
            server = AsyncPipeChannel(pipe)
            client = Channel(stream)
            await asyncio.to_thread(client.send, {"hello": {"pid": pid}})
            assert await server.receive() == ({"hello": {"pid": pid}}, [])
            await server.send({"result": {"ok": True}})
            await server.write(1, b"y" * 300_000)
            assert await asyncio.to_thread(client.receive) == ({"result": {"ok": True}}, [])
            assert await asyncio.to_thread(client.receive) == ((1, b"y" * 262_144), [])
            assert await asyncio.to_thread(client.receive) == ((1, b"y" * (300_000 - 262_144)), [])
            server.close()
            assert await asyncio.to_thread(client.receive) is None
            client.close()
        finally:
            listener.close()

    asyncio.run(main())


@windows_only
def test_a_second_daemon_on_the_same_pipe_is_refused() -> None:
    from vz_core.daemon._pipe import PipeListener
    from vz_core.wire._frames import DaemonError

    name = _unique_pipe()
    listener = PipeListener(name)
    try:
        with pytest.raises(DaemonError, match="exists already"):
            PipeListener(name)
    finally:
        listener.close()


@windows_only
def test_no_pipe_means_no_daemon() -> None:
    from vz_core.platform.pipes import open_pipe

    assert open_pipe(_unique_pipe()) is None
