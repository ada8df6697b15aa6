"""Host processes of the fake driver: exec streams and the Machine's main process.

Every command runs as a real host process leading its own process group (which holds the command and
everything it starts), with pipes plumbed into the event loop by hand rather than through asyncio's subprocess
transport: that transport kills the direct child whenever it is closed, which would make the
"exec-ignore-cancel" fault impossible to express. Exits are awaited through a pidfd where the kernel has them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import grp
import os
import pwd
import shutil
import signal
import subprocess
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import IO, Literal

from vz_core import MAX_CHUNK, ExecEvent, ExecExit, ExecOutput
from vz_core.errors import InvalidArgumentError
from vz_core.platform.process import ExitWatch

__all__ = [
    "MINIMAL_PATH",
    "HostUser",
    "Launch",
    "exit_event",
    "kill_group",
    "resolve_user",
    "setpriv_prefix",
    "spawn",
    "stream_exec",
]

MINIMAL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_OVERSIZED_CHUNK = 2 * MAX_CHUNK
_ACCUMULATE_WINDOW = 0.02
_KILL_WAIT = 5.0

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class HostUser:
    """A host account a command runs as."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def resolve_user(spec: str) -> HostUser:
    """Resolve "name", "uid", "name:group" or "uid:gid" to a host account; ``InvalidArgumentError`` if unknown."""
    name, _, group = spec.partition(":")
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if not name.isdigit():
            raise InvalidArgumentError(
                f"user {name!r} does not exist on this host; the fake driver runs Machine processes as host "
                "accounts, so name an existing user (or a numeric uid)",
                details={"user": spec},
            ) from None
        entry = None
    uid = int(name) if entry is None else entry.pw_uid
    gid = uid if entry is None else entry.pw_gid
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise InvalidArgumentError(
                f"group {group!r} does not exist on this host; name an existing group or a numeric gid",
                details={"user": spec},
            ) from None
    groups = tuple(os.getgrouplist(entry.pw_name, gid)) if entry is not None else (gid,)
    return HostUser(uid=uid, gid=gid, groups=groups, home=entry.pw_dir if entry is not None else "/")


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one command. ``env`` values are secrets."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    user: HostUser | None = None
    netns: str | None = None
    """The Machine's network namespace (``ip netns exec``), for a Machine attached to a route domain."""

    def __repr__(self) -> str:
        return (
            f"Launch(argv={self.argv!r}, cwd={self.cwd!r}, env=<{len(self.env)} variables>, user={self.user!r}, "
            f"netns={self.netns!r})"
        )


def netns_prefix(netns: str | None) -> list[str]:
    """What runs a command inside the Machine's network namespace (and its resolv.conf); nothing without one."""
    return [] if netns is None else [shutil.which("ip") or "ip", "netns", "exec", netns]


def spawn(launch: Launch, *, stdin: int, stdout: int, stderr: int) -> subprocess.Popen[bytes]:
    """Start ``launch`` as the leader of a new process group. Raises OSError as Popen does.

    The command stays in the driver's session, so a plugin supervisor that cleans up the plugin's session
    takes it along; only its process group is its own, for killing it with everything it started.

    Switching users goes through ``setpriv`` when the host has it: Popen can only change credentials in a
    forked child, and a fork of a process running gRPC threads may abort in gRPC's fork handlers before it
    reaches exec. Without ``setpriv`` Popen changes them itself.
    """
    argv = list(launch.argv)
    user = launch.user
    if user is not None and (user.uid, user.gid) == (os.geteuid(), os.getegid()):
        user = None
    prefix = setpriv_prefix(user) if user is not None else None
    if prefix is not None:
        argv = [*prefix, *argv]
        user = None
    if launch.netns is not None and user is not None:
        raise PermissionError(errno.EPERM, "running a command of a route-domain Machine as another user needs setpriv")
    argv = [*netns_prefix(launch.netns), *argv]
    return subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=launch.cwd,
        env=dict(launch.env),
        process_group=0,
        close_fds=True,
        user=user.uid if user else None,
        group=user.gid if user else None,
        extra_groups=list(user.groups) if user else None,
    )


def setpriv_prefix(user: HostUser) -> list[str] | None:
    """The ``setpriv`` command line that runs what follows it as ``user``; None when the host has no setpriv."""
    helper = _setpriv()
    if helper is None:
        return None
    groups = f"--groups={','.join(map(str, user.groups))}" if user.groups else "--clear-groups"
    return [helper, f"--reuid={user.uid}", f"--regid={user.gid}", groups, "--"]


@functools.cache
def _setpriv() -> str | None:
    return shutil.which("setpriv", path=MINIMAL_PATH)


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group (the command and every descendant that stayed in it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


exit_event = ExecExit.from_returncode
"""The ExecExit for a Popen return code: a signal death is ``exit_code = 128 + n`` and the signal's name."""


async def _wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc`` to exit without blocking the loop, reap it and return its return code."""
    try:
        watch = ExitWatch(proc.pid)  # a pidfd, a kqueue or a process handle
    except OSError:  # none here (a kernel older than 5.3)
        return await asyncio.to_thread(proc.wait)
    try:
        if proc.poll() is None:
            await watch.wait()
    finally:
        watch.close()
    return proc.wait()


def _reap_in_background(proc: subprocess.Popen[bytes]) -> None:
    # Someone must wait(2) for a process this code no longer follows, or it stays a zombie (and Popen warns).
    if proc.poll() is None:
        threading.Thread(target=proc.wait, name=f"vz-fake-reap-{proc.pid}", daemon=True).start()


async def _finish_process(proc: subprocess.Popen[bytes], *, kill: bool) -> None:
    """Make sure ``proc`` is killed (when ``kill``) and reaped, even if this task is cancelled meanwhile."""
    if proc.returncode is not None:
        return
    if not kill:
        _reap_in_background(proc)
        return
    kill_group(proc.pid)
    try:
        async with asyncio.timeout(_KILL_WAIT):
            await _wait_exit(proc)
    except BaseException:
        _reap_in_background(proc)
        raise


class _WritePipe(asyncio.BaseProtocol):
    """The command's stdin: writes with flow control; knows when the reading end is gone."""

    def __init__(self) -> None:
        self._transport: asyncio.WriteTransport | None = None
        self._paused = False
        self._lost = False
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self._transport = transport

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def write(self, data: bytes) -> None:
        """Write ``data`` and wait until the pipe takes more. ``BrokenPipeError`` once the command stopped reading."""
        transport = self._transport
        if transport is None or self._lost or transport.is_closing():
            raise BrokenPipeError
        transport.write(data)
        while self._paused and not self._lost:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def finish(self) -> None:
        """End of input: close the pipe once buffered data is written."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def abort(self) -> None:
        """Drop unwritten data and close now (idempotent)."""
        transport = self._transport
        if transport is None or self._lost:
            return
        if transport.is_closing() and not transport.get_write_buffer_size():
            # Closing with nothing left to write means connection_lost is already scheduled (by close(), or
            # because the command closed its end); aborting would schedule it a second time on a torn-down
            # transport. Closing with data pending only waits for a flush, which abort() may cut short.
            return
        transport.abort()


async def _connect_reader(
    loop: asyncio.AbstractEventLoop, pipe: object, transports: list[asyncio.BaseTransport]
) -> asyncio.StreamReader:
    # limit = MAX_CHUNK: the transport stops reading once 2 x 32 KiB are buffered, so a paused consumer
    # leaves the command blocked on a full pipe instead of growing memory.
    reader = asyncio.StreamReader(limit=MAX_CHUNK)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    transports.append(transport)
    return reader


async def _read_pipe(
    reader: asyncio.StreamReader,
    stream: Stream,
    queue: asyncio.Queue[tuple[Stream, bytes]],
    size: int,
    accumulate: bool,
) -> None:
    """Move one pipe's output into the queue chunk by chunk; an empty chunk marks end of file."""
    while True:
        data = await reader.read(size)
        while accumulate and data and len(data) < size:
            try:
                more = await asyncio.wait_for(reader.read(size - len(data)), _ACCUMULATE_WINDOW)
            except TimeoutError:
                break
            if not more:
                break
            data += more
        await queue.put((stream, data))
        if not data:
            return


async def _pump(stdin: AsyncIterator[bytes], pipe: _WritePipe) -> None:
    """Copy the client's input to the command; after the command stops reading, keep draining the client."""
    broken = False
    async for data in stdin:
        if broken or not data:
            continue
        try:
            await pipe.write(data)
        except (BrokenPipeError, ConnectionResetError):
            broken = True
    pipe.finish()


async def stream_exec(
    proc: subprocess.Popen[bytes],
    stdin: AsyncIterator[bytes],
    *,
    faults: frozenset[str],
    on_finish: Callable[[], None],
) -> AsyncGenerator[ExecEvent, None]:
    """Stream a started command's output as ExecOutput events, then its ExecExit.

    ``proc`` was started by ``spawn`` with three pipes. Output is read only as fast as the consumer pulls
    (a two-slot queue between the pipe readers and this generator). When the generator is closed or
    cancelled before the exit, the command's process group is SIGKILLed and reaped. ``on_finish`` runs
    once the process is no longer followed. ``faults`` selects the exec fault modes.
    """
    loop = asyncio.get_running_loop()
    oversized = "exec-oversized-chunks" in faults
    ignore_cancel = "exec-ignore-cancel" in faults
    queue: asyncio.Queue[tuple[Stream, bytes]] = asyncio.Queue(maxsize=2)
    transports: list[asyncio.BaseTransport] = []
    tasks: list[asyncio.Task[None]] = []
    writer = _WritePipe()
    returncode: int | None = None
    input_failure: list[BaseException] = []

    def pump_done(task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None and returncode is None:
            # The client's input stream broke (malformed frames): stop the command, report the error.
            input_failure.append(error)
            kill_group(proc.pid)

    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        write_transport, _ = await loop.connect_write_pipe(lambda: writer, proc.stdin)
        transports.append(write_transport)
        stderr_as: Stream = "stdout" if "exec-merge-streams" in faults else "stderr"
        pipes: tuple[tuple[Stream, IO[bytes]], ...] = (("stdout", proc.stdout), (stderr_as, proc.stderr))
        for stream, pipe in pipes:
            reader = await _connect_reader(loop, pipe, transports)
            size = _OVERSIZED_CHUNK if oversized else MAX_CHUNK
            tasks.append(asyncio.create_task(_read_pipe(reader, stream, queue, size, oversized)))
        pump = asyncio.create_task(_pump(stdin, writer))
        pump.add_done_callback(pump_done)
        tasks.append(pump)

        if "exec-empty-chunk" in faults:
            yield ExecOutput("stdout", b"")
        open_pipes = 2
        while open_pipes:
            stream, data = await queue.get()
            if not data:
                open_pipes -= 1
                continue
            yield ExecOutput(stream, data)
            if "crash-mid-exec" in faults:
                os._exit(3)
        returncode = await _wait_exit(proc)
    finally:
        # Everything that must happen comes first and synchronously, so a second cancellation arriving during
        # the awaits below cannot leave a live command or an open pipe behind.
        try:
            if returncode is None and not ignore_cancel:
                kill_group(proc.pid)
            for task in tasks:
                task.cancel()
            writer.abort()
            for transport in transports:
                transport.close()
            for pipe_file in (proc.stdin, proc.stdout, proc.stderr):
                if pipe_file is not None:
                    pipe_file.close()
            try:
                await asyncio.gather(*tasks, return_exceptions=True)
                await _finish_process(proc, kill=not ignore_cancel)
            except BaseException:
                _reap_in_background(proc)
                raise
        finally:
            on_finish()
    if input_failure:
        raise input_failure[0]
    assert returncode is not None
    if "exec-missing-exit" not in faults:
        yield exit_event(returncode)
    if "exec-frame-after-exit" in faults:
        yield ExecOutput("stdout", b"frame after exit\n")
