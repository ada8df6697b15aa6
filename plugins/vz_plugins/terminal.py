"""A terminal session on a pseudo-terminal of *this* host: ``Driver.terminal`` for drivers whose commands run here.

A driver whose Machines are host processes (the fake driver, the hostdir example) implements the contract
method in a few lines::

    def terminal(self, spec, input):
        ...  # validate spec.workspace_id: NotFoundError / FailedPreconditionError before anything runs
        return host_terminal(spec.argv, input, rows=spec.rows, cols=spec.cols, term=spec.term, env=..., cwd=...)

and says ``Extensions(terminal=True)``. What ``host_terminal`` does (the rules of ``Driver.terminal``):

* allocates a pseudo-terminal pair (``os.openpty``), sizes it before the command starts, and starts the
  command as the leader of a new session (``setsid``) whose controlling terminal is the pair's terminal
  side (``TIOCSCTTY``), so job control works and Ctrl-C/Ctrl-Z/Ctrl-\\ from the input reach the foreground
  process group through the line discipline;
* writes ``TerminalData`` as it is, applies ``TerminalResize`` (``TIOCSWINSZ``: the foreground process group
  gets SIGWINCH), ignores ``TerminalEof`` (no more data; the command is not told);
* yields the terminal's output only as fast as it is pulled (chunks of at most ``MAX_CHUNK`` bytes), then one
  ``ExecExit`` once the command exited and the output it left was read: whatever else is still in its
  session then (background jobs) is killed;
* on cancellation (the generator closed before the exit) kills every process of the session.

Only the bytes cross: the terminal's descriptors never leave this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence

from vz_core import MAX_CHUNK, ExecExit, TerminalData, TerminalEvent, TerminalInput, TerminalOutput, TerminalResize
from vz_core.platform.process import ExitWatch
from vz_core.platform.terminal import set_window_size as _set_window_size

__all__ = ["host_terminal", "kill_session", "set_window_size"]

_DRAIN = 2.0
"""Seconds the output left by an exited command may take to be read (and its session to be killed)."""


def set_window_size(fd: int, rows: int, cols: int) -> None:
    """Set the window size of the terminal ``fd`` refers to (either side of a pair)."""
    _set_window_size(fd, rows, cols)


def _session_members(sid: int) -> list[int]:
    """Pids of the live (not zombie) processes of session ``sid`` (Linux: from /proc; elsewhere: its leader)."""
    if not os.path.isdir("/proc/self"):
        return [sid]
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z":  # a zombie runs nothing
            members.append(int(name))
    return members


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (the process groups of its jobs included)."""
    if not os.path.isdir("/proc/self"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signal.SIGKILL)
        return
    for _ in range(3):  # a member may fork while we look: look again
        members = _session_members(sid)
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


_exit_event = ExecExit.from_returncode


_TRAMPOLINE = (
    "import fcntl, os, signal, sys, termios\n"
    "for n in range(1, signal.NSIG):\n"
    "    try: signal.signal(n, signal.SIG_DFL)\n"
    "    except (OSError, ValueError): pass\n"
    "os.setsid()\n"
    "if sys.argv[1] == 'ctty': fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


@functools.cache
def _tools() -> tuple[str, str] | None:
    """util-linux ``setsid`` and a GNU ``env`` that knows ``--default-signal``, when this host has both."""
    setsid, env = shutil.which("setsid"), shutil.which("env")
    if setsid is None or env is None:
        return None
    try:
        probe = subprocess.run([env, "--default-signal=INT", "true"], capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (setsid, env) if probe.returncode == 0 else None


def _session_argv(argv: Sequence[str], controlling_terminal: bool) -> list[str]:
    """``argv`` started as a new session led by itself, its standard input the controlling terminal, every
    signal at its default disposition (a plugin may ignore SIGINT or SIGQUIT, and an ignored signal stays
    ignored across exec: a shell could then not even trap it).

    No Python code runs in a forked child (a ``preexec_fn`` can deadlock or abort in a process with gRPC's
    threads): util-linux ``setsid --ctty`` does setsid + TIOCSCTTY and GNU ``env --default-signal`` resets the
    signals, each exec'ing the next in the same process; without them (or for a command whose name has a
    ``=``, which env would read as a variable) a small Python trampoline does the same.
    """
    tools = _tools()
    if tools is not None and "=" not in argv[0]:
        setsid, env = tools
        return [setsid, *(("--ctty",) if controlling_terminal else ()), "--", env, "--default-signal", "--", *argv]
    return [sys.executable, "-c", _TRAMPOLINE, "ctty" if controlling_terminal else "-", *argv]


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _wait_exit(proc: subprocess.Popen[bytes]) -> int:
    try:
        watch = ExitWatch(proc.pid)  # a pidfd, a kqueue or a process handle
    except OSError:
        return await asyncio.to_thread(proc.wait)
    try:
        await watch.wait()
    finally:
        watch.close()
    return proc.wait()


async def _wait_fd(fd: int, *, write: bool = False) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
    add(fd, _settle, ready)
    try:
        await ready
    finally:
        remove(fd)


async def _feed(master: int, input: AsyncIterator[TerminalInput]) -> None:
    async for item in input:
        if isinstance(item, TerminalData):
            view = memoryview(item.data)
            while view:
                try:
                    written = os.write(master, view)
                except BlockingIOError:
                    await _wait_fd(master, write=True)
                    continue
                view = view[written:]
        elif isinstance(item, TerminalResize):
            set_window_size(master, item.rows, item.cols)
        # TerminalEof: nothing more to write; resizes may still come.


async def host_terminal(
    argv: Sequence[str],
    input: AsyncIterator[TerminalInput],
    *,
    rows: int,
    cols: int,
    term: str,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    on_start: Callable[[int], None] | None = None,
    controlling_terminal: bool = True,
    leave_session: bool = False,
) -> AsyncGenerator[TerminalEvent, None]:
    """Run ``argv`` on a new pseudo-terminal of this host: see the module's description.

    ``env`` is the command's whole environment (default: this process's) with ``TERM=term`` set over it;
    ``cwd`` its working directory. A command that cannot be started says so on the terminal and exits
    non-zero (126/127, or 1), as a shell would. ``on_start`` is called with the command's pid (which is
    also its session id and process group id) once it runs.

    ``controlling_terminal=False`` and ``leave_session=True`` break the contract on purpose, for testing a
    conformance suite against a faulty driver: the first starts the session without a controlling terminal
    (job control and Ctrl-C do not work), the second kills only the command itself on exit or cancellation,
    leaving the rest of its session running.
    """
    environment = dict(os.environ if env is None else env)
    environment["TERM"] = term
    master, slave = os.openpty()
    try:
        set_window_size(slave, rows, cols)
        proc = subprocess.Popen(  # noqa: ASYNC220 - starting it does not block; waiting is async (pidfd)
            _session_argv(argv, controlling_terminal),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=environment,
            cwd=cwd,
            close_fds=True,
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    if on_start is not None:
        on_start(proc.pid)
    sweep = (lambda sid: None) if leave_session else kill_session
    loop = asyncio.get_running_loop()
    waiter = loop.create_task(_wait_exit(proc))
    feeder = loop.create_task(_feed(master, input))
    exited = False
    try:
        deadline: float | None = None
        while True:
            try:
                data = os.read(master, MAX_CHUNK)
            except BlockingIOError:
                data = None
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                break  # every terminal side is closed: nothing more to read
            if data == b"":
                break
            if data:
                yield TerminalOutput(data)
                continue
            if waiter.done():
                if deadline is None:
                    # The command exited; the rest of its session (background jobs) goes with it.
                    sweep(proc.pid)
                    deadline = loop.time() + _DRAIN
                left = deadline - loop.time()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_wait_fd(master), left)
                continue
            readable = loop.create_task(_wait_fd(master))
            try:
                await asyncio.wait((readable, waiter), return_when=asyncio.FIRST_COMPLETED)
            finally:
                readable.cancel()
                await asyncio.gather(readable, return_exceptions=True)
        returncode = await waiter
        exited = True
        if feeder.done() and not feeder.cancelled():
            failure = feeder.exception()
            if failure is not None and not isinstance(failure, OSError):  # EIO: the terminal closed first
                raise failure
        yield _exit_event(returncode)
    finally:
        if not exited:
            sweep(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        feeder.cancel()
        waiter.cancel()
        await asyncio.gather(feeder, waiter, return_exceptions=True)
        if proc.returncode is None:
            await asyncio.to_thread(proc.wait)
        os.close(master)
        sweep(proc.pid)


if sys.platform == "win32":  # pragma: no cover - pseudo-terminals of this kind are POSIX
    raise ImportError("vz_plugins.terminal needs a POSIX host")
