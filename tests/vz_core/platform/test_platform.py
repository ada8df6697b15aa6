"""vz_core.platform: each host's implementation for real where this host has it, and the logic of the others fed
what their OS hands back (``struct xucred`` bytes, a binary SID, kqueue exit events, console modes).

The module runs unchanged on the Linux, macOS and Windows lanes: a test of a real call is marked for the hosts
that have it; the contract tests of the pure logic run everywhere.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from vz_core import platform
from vz_core.platform import detach, fdpass, files, keyring, locks, peer, process, terminal, win32

posix = pytest.mark.skipif(sys.platform == "win32", reason="a POSIX call (Windows has its own test)")
linux = pytest.mark.skipif(sys.platform != "linux", reason="a Linux call")


def xucred(uid: int, groups: list[int], *, version: int = 0) -> bytes:
    """The bytes ``getsockopt(SOL_LOCAL, LOCAL_PEERCRED)`` returns on macOS (sys/ucred.h ``struct xucred``)."""
    padded = (groups + [0] * 16)[:16]
    return struct.pack("=IIh2x16I", version, uid, len(groups), *padded)


# ---- contract tests: pure logic, every host ---------------------------------------------------------------


def test_xucred_gives_the_uid_and_primary_group() -> None:
    raw = xucred(501, [20, 12, 61, 79])
    assert len(raw) == peer.XUCRED_SIZE
    assert peer.parse_xucred(raw) == (501, 20)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (xucred(501, [20], version=1), "version 1"),
        (xucred(501, []), "0 groups"),
        (xucred(501, [20])[:10], "fewer than"),
        (struct.pack("=IIh2x", 0, 501, 17) + bytes(64), "17 groups"),
    ],
)
def test_a_malformed_xucred_is_an_error_never_a_match(raw: bytes, words: str) -> None:
    with pytest.raises(OSError, match=words):
        peer.parse_xucred(raw)


def test_ucred_bytes() -> None:
    raw = struct.pack("3i", 4242, 1000, 1001)
    assert peer.parse_ucred(raw) == (4242, 1000, 1001)
    with pytest.raises(OSError):
        peer.parse_ucred(raw[:8])


def test_sid_bytes_render_as_windows_does() -> None:
    # Local System: S-1-5-18 (revision 1, 1 sub-authority, authority 5 big-endian in 6 bytes).
    assert win32.sid_to_string(bytes([1, 1, 0, 0, 0, 0, 0, 5]) + struct.pack("<I", 18)) == "S-1-5-18"
    # A domain user: S-1-5-21-<3 machine parts>-<RID>, as GetTokenInformation(TokenUser) hands it back.
    parts = (1004336348, 1177238915, 682003330, 1001)
    raw = bytes([1, 5, 0, 0, 0, 0, 0, 5]) + struct.pack("<5I", 21, *parts)
    assert win32.sid_to_string(raw) == "S-1-5-21-1004336348-1177238915-682003330-1001"
    with pytest.raises(ValueError, match="not a SID"):
        win32.sid_to_string(bytes([1, 5, 0, 0, 0, 0, 0, 5]) + b"\0" * 8)
    with pytest.raises(ValueError, match="at least 8"):
        win32.sid_to_string(b"\x01\x01")


def _kevent(ident: int, *, fflags: int, flags: int = 0, filter: int = -5) -> SimpleNamespace:
    return SimpleNamespace(ident=ident, filter=filter, flags=flags, fflags=fflags)


def test_a_kqueue_exit_event_is_recognised() -> None:
    note_exit, ev_error = 0x80000000, 0x4000  # sys/event.h: NOTE_EXIT, EV_ERROR; EVFILT_PROC is -5
    assert process.exit_event_matches([_kevent(77, fflags=note_exit | 0x0000FFFF)], 77)
    assert process.exit_event_matches([_kevent(77, fflags=0, flags=ev_error)], 77)  # already gone
    assert not process.exit_event_matches([_kevent(78, fflags=note_exit)], 77)  # another process
    assert not process.exit_event_matches([_kevent(77, fflags=note_exit, filter=-1)], 77)  # EVFILT_READ
    assert not process.exit_event_matches([_kevent(77, fflags=0x40000000)], 77)  # NOTE_FORK, not an exit
    assert not process.exit_event_matches([], 77)


def test_raw_console_modes() -> None:
    cooked_in = 0x0001 | 0x0002 | 0x0004 | 0x0010 | 0x0080  # processed, line, echo, window, extended flags
    raw_in, raw_out = terminal.raw_console_modes(cooked_in, 0x0001 | 0x0002)
    assert raw_in & (0x0001 | 0x0002 | 0x0004) == 0  # no Ctrl-C processing, line editing or echo
    assert raw_in & 0x0200  # ENABLE_VIRTUAL_TERMINAL_INPUT: keys arrive as the escape sequences a pty expects
    assert raw_in & 0x0010 and raw_in & 0x0080  # the rest is kept
    assert raw_out & 0x0004 and raw_out & 0x0001 and raw_out & 0x0002  # VT processing on, the rest kept


def test_detaching_options_for_this_host() -> None:
    options = detach.detach_options()
    if sys.platform == "win32":
        assert options == {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP | subprocess.DETACHED_PROCESS}
    else:
        assert options == {"start_new_session": True}


def test_host_kind() -> None:
    assert platform.HOST in ("linux", "darwin", "win32")
    assert (sys.platform == "linux") == platform.LINUX
    assert keyring.KEYRING == platform.LINUX
    assert (sys.platform != "win32") == fdpass.FD_PASSING


# ---- real calls on the hosts that have them --------------------------------------------------------------


@posix
def test_peer_credentials_of_a_real_connection() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer.peer_credentials(a) == (os.getpid(), os.geteuid(), os.getegid())


@posix
def test_peer_credentials_name_the_listener_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    code = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.bind({path!r}); s.listen(1); print('ready', flush=True)\n"
        "c, _ = s.accept(); c.recv(1)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        with platform_unix_socket() as sock:
            sock.connect(path)
            pid, uid, _gid = peer.peer_credentials(sock)
            assert (pid, uid) == (child.pid, os.geteuid())
            sock.send(b"x")
    finally:
        child.wait(timeout=30)
        assert child.stdout is not None
        child.stdout.close()


def platform_unix_socket() -> socket.socket:
    from vz_core.platform.sockets import unix_socket

    sock = unix_socket()
    assert not sock.get_inheritable()  # close-on-exec without SOCK_CLOEXEC (PEP 446)
    return sock


@posix
def test_a_nonblocking_unix_socket() -> None:
    from vz_core.platform.sockets import unix_socket

    with unix_socket(nonblocking=True) as sock:
        assert sock.getblocking() is False
        assert not sock.get_inheritable()


@posix
async def test_received_descriptors_are_close_on_exec() -> None:
    from vz_core.rpc._fdpass import recv_message, send_message

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    os.set_inheritable(r, True)  # the sender's copy is inheritable: the receiver's must not be
    a.setblocking(False)
    b.setblocking(False)
    try:
        await send_message(a, 0x4A, b"{}", (r,))
        _kind, _payload, fds = await recv_message(b)
        assert len(fds) == 1
        assert not os.get_inheritable(fds[0])
        os.close(fds[0])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_file_locks_exclude_each_other(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    one = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    two = os.open(path, os.O_RDWR)
    try:
        assert locks.lock_file(one, blocking=False)
        assert not locks.lock_file(two, blocking=False)
        assert not locks.lock_file(two, exclusive=False, blocking=False)
        locks.unlock_file(one)
        assert locks.lock_file(two, blocking=False)
    finally:
        os.close(one)
        os.close(two)


def test_shared_locks_share(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    one = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    two = os.open(path, os.O_RDWR)
    three = os.open(path, os.O_RDWR)
    try:
        assert locks.lock_file(one, exclusive=False, blocking=False)
        assert locks.lock_file(two, exclusive=False, blocking=False)
        assert not locks.lock_file(three, blocking=False)
    finally:
        for fd in (one, two, three):
            os.close(fd)


def test_a_closed_descriptor_releases_its_lock(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    one = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    two = os.open(path, os.O_RDWR)
    try:
        assert locks.lock_file(one)
        os.close(one)
        one = -1
        assert locks.lock_file(two, blocking=False)
    finally:
        os.close(two)
        if one >= 0:
            os.close(one)


async def test_an_exit_watch_sees_the_exit_and_kills() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # noqa: ASYNC220 - a raw pid
    try:
        watch = process.ExitWatch(child.pid)
        try:
            assert not watch.exited()
            watch.kill()
            await asyncio.wait_for(watch.wait(), 60)
            assert watch.exited()
        finally:
            watch.close()
    finally:
        child.kill()
        child.wait()
    assert child.returncode != 0


async def test_an_exit_watch_of_a_process_that_ends_by_itself() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)  # noqa: ASYNC220
    watch = process.ExitWatch(child.pid)
    try:
        assert child.stdin is not None
        child.stdin.close()  # the child reads EOF and exits
        await asyncio.wait_for(watch.wait(), 60)
    finally:
        watch.close()
        child.wait()
    assert child.returncode == 0


@posix
def test_no_exit_watch_for_a_process_that_does_not_exist() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names nobody now (on Windows Popen's handle keeps the process object)
    with pytest.raises(ProcessLookupError):
        process.ExitWatch(child.pid)


@posix
def test_raw_terminal_and_window_size_on_a_real_pseudo_terminal() -> None:
    import termios

    leader, follower = os.openpty()
    try:
        before = termios.tcgetattr(follower)
        assert before[3] & termios.ICANON
        raw = terminal.RawTerminal(follower)
        assert not termios.tcgetattr(follower)[3] & (termios.ICANON | termios.ECHO)
        raw.restore()
        raw.restore()  # idempotent
        assert termios.tcgetattr(follower) == before
        terminal.set_window_size(leader, 40, 132)
        assert os.get_terminal_size(follower) == os.terminal_size((132, 40))
    finally:
        os.close(leader)
        os.close(follower)


@posix
def test_a_nonblocking_pipe() -> None:
    r, w = files.nonblocking_pipe()
    try:
        assert not os.get_blocking(r) and not os.get_blocking(w)
        assert not os.get_inheritable(r) and not os.get_inheritable(w)
    finally:
        os.close(r)
        os.close(w)


@linux
def test_pipes_are_resized_on_linux() -> None:
    r, w = os.pipe()
    try:
        assert files.PIPE_RESIZABLE
        before = files.get_pipe_size(w)
        assert before is not None
        assert files.set_pipe_size(w, before * 2) >= before * 2
        assert files.get_pipe_size(r) == files.get_pipe_size(w)
    finally:
        os.close(r)
        os.close(w)


@linux
def test_a_socket_deeper_than_sun_path_is_reached_through_its_directory(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "s.sock")
    assert len(os.fsencode(path)) > files.SUN_PATH_MAX
    dir_fd = files.open_directory(deep)
    try:
        with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
            server.bind(files.socket_path_in(dir_fd, path))
            server.listen(1)
            client.connect(files.long_socket_path(dir_fd, "s.sock"))
    finally:
        os.close(dir_fd)
    assert os.path.exists(path)


@linux
def test_a_sealed_memfd_refuses_writes() -> None:
    fd = files.memfd_sealed_copy("vz-test")
    try:
        os.write(fd, b"verified bytes")
        files.seal_memfd(fd)
        with pytest.raises(PermissionError):
            os.write(fd, b"more")
    finally:
        os.close(fd)


@pytest.mark.skipif(sys.platform == "linux", reason="the other hosts' answer")
def test_other_hosts_state_what_they_lack() -> None:
    assert not files.PIPE_RESIZABLE and not files.SEALED_MEMFD and not files.XATTRS
    assert files.get_pipe_size(0) is None
    assert not keyring.Keyring().usable  # secrets stay in the driver process's memory
