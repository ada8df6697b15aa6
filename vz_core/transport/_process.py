"""Starting a plugin process so that nothing of it can outlive its purpose (PROTOCOL.md §7).

Three ways, chosen by platform and ``supervised``:

* POSIX, supervised (the default): the host starts ``_supervise.py`` with ``python -I -S`` (builtin modules
  only: running about 9 ms after the spawn, against about 7 ms for a bare ``python -I -S``). The supervisor is a
  child subreaper (Linux) in a session of its own, forks the plugin into another session and kills the whole
  plugin session when the plugin exits, when the host asks, or when the host dies (EOF on the control socket,
  or SIGHUP through PR_SET_PDEATHSIG), even if the host was killed with SIGKILL, alone or with its whole
  process group (the supervisor is outside that group). The plugin runs under PR_SET_PDEATHSIG(SIGKILL) to
  the supervisor. Chosen over forking the host itself (unsafe
  with gRPC's threads) and over a pre-forked helper (a long-lived extra process and IPC to save a few
  milliseconds). Measured here: launch → first Info, p50 about 10 ms more than ``supervised=False``.
* POSIX, direct (``supervised=False``, for measurement only): the plugin starts in its own session; the host
  kills that group on shutdown but cannot clean up if it is itself killed with SIGKILL.
* Windows: the plugin is assigned to a Job Object with JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE while suspended;
  the job handle dies with the host, and the job's processes with it (``_windows``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import PluginError

__all__ = ["ExitStatus", "PluginProcess", "spawn_plugin"]

_HERE = str(Path(__file__).parent)
# Imported (not run as a script) so its compiled bytecode is cached: about 2 ms less per launch.
SUPERVISOR_BOOT = f"import sys;sys.path[0:0]=[{_HERE!r}];import _supervise;sys.exit(_supervise.main(sys.argv[1:]))"


@dataclass(frozen=True)
class ExitStatus:
    """How a plugin process ended: ``code`` (negative = killed by a signal) and the signal name."""

    code: int
    signal: str = ""

    def __str__(self) -> str:
        return f"killed by {self.signal}" if self.signal else f"exit code {self.code}"


class PluginProcess:
    """A started plugin (and, when supervised, its supervisor). Owns the stdout/stderr pipes."""

    def __init__(self, proc: asyncio.subprocess.Process, *, supervised: bool) -> None:
        self._proc = proc
        self.supervised = supervised
        assert proc.stdout is not None and proc.stderr is not None
        self.stdout: asyncio.StreamReader = proc.stdout
        self.stderr: asyncio.StreamReader = proc.stderr
        self.pid = 0 if supervised else proc.pid
        self.supervisor_pid = proc.pid if supervised else 0
        self._ctl_reader: asyncio.StreamReader | None = None
        self._ctl_writer: asyncio.StreamWriter | None = None
        self._started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._status: ExitStatus | None = None
        self._exited = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self._job: object | None = None
        if not supervised:
            self._started.set_result(proc.pid)

    @property
    def status(self) -> ExitStatus | None:
        """The exit status once the plugin (and its tree) is gone, else None."""
        return self._status if self._exited.is_set() else None

    @property
    def exited(self) -> asyncio.Event:
        return self._exited

    async def started(self) -> int:
        """The plugin's pid once it runs; ``PluginError`` when it could not be executed."""
        return await self._started

    async def _watch_ctl(self) -> None:
        try:
            await self._follow_ctl()
        except BaseException:
            # Cancelled (the event loop is closing) before the supervisor finished: the control socket is ours to
            # close all the same, or it is left to the garbage collector.
            if self._ctl_writer is not None:
                self._ctl_writer.close()
            raise

    async def _follow_ctl(self) -> None:
        assert self._ctl_reader is not None
        reported: ExitStatus | None = None
        try:
            while line := await self._ctl_reader.readline():
                kind, _, rest = line.decode(errors="replace").strip().partition(" ")
                if kind == "pid" and not self._started.done():
                    self.pid = int(rest)
                    self._started.set_result(self.pid)
                elif kind == "execfail" and not self._started.done():
                    _errno, _, message = rest.partition(" ")
                    self._started.set_exception(PluginError(f"the plugin could not be executed: {message}"))
                elif kind == "exit":
                    code_text, _, signum = rest.partition(" ")
                    number = int(signum or 0)
                    reported = ExitStatus(int(code_text), _signame(number) if number else "")
                    # The supervisor reports the exit last; do not wait for the socket's end, which a
                    # deliberately detached descendant may still hold open.
                    break
        except (ConnectionError, ValueError):
            pass
        # End of the control socket: the supervisor has finished (it reports the plugin's status first).
        # Process.wait() is not used: it also waits for our stdout/stderr pipes to close, which a deliberately
        # detached descendant may keep open indefinitely. asyncio's child watcher reaps the supervisor.
        if reported is None and self.pid:
            # The supervisor died without reporting (killed on its own): the plugin died with it
            # (PR_SET_PDEATHSIG), but what the plugin started may still run in its session.
            _kill_session(self.pid)
        rc = await self._exit_code()
        self._finish(reported or ExitStatus(rc, _signame(-rc) if rc < 0 else ""))

    async def _exit_code(self) -> int:
        """The exit code of our direct child, known as soon as it exits (not when its pipes close).

        ``Process.wait()`` is avoided where possible: until asyncio has processed the child watcher's report it
        waits for the pipes to close too, which a deliberately detached descendant may keep open indefinitely
        (and the watcher may have reaped the child just before ``pidfd_open``).
        """
        proc = self._proc
        if proc.returncode is not None:
            return proc.returncode
        from vz_core.platform.process import ExitWatch

        state = -1
        watch: ExitWatch | None = None
        try:
            watch = ExitWatch(proc.pid)  # a pidfd, a kqueue or a process handle
            state = 0
        except ProcessLookupError:
            state = -2  # already reaped by the child watcher: its report is on its way to the loop
        except OSError:
            state = -1
        if watch is not None:
            try:
                await watch.wait()
            finally:
                watch.close()
        elif state == -1:
            return await proc.wait()  # no exit watch on this system
        # The child watcher reaps it and records the code right after; poll for that briefly.
        for _ in range(200):
            if proc.returncode is not None:
                return proc.returncode
            await asyncio.sleep(0.005)
        return -1

    async def _watch_direct(self) -> None:
        rc = await self._exit_code()
        # Whatever the plugin left behind goes with it: its process group, or its Job Object on Windows.
        if self._job is not None:
            from vz_core.transport import _windows

            _windows.terminate_job(self._job)
        elif sys.platform != "win32":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        self._finish(ExitStatus(rc, _signame(-rc) if rc < 0 else ""))

    def _finish(self, status: ExitStatus) -> None:
        self._status = status
        if not self._started.done():
            self._started.set_exception(PluginError(f"the plugin ended before it started ({status})"))
        if self._ctl_writer is not None:
            self._ctl_writer.close()
        if self._job is not None:
            from vz_core.transport import _windows

            _windows.close_job(self._job)
            self._job = None
        self._exited.set()

    def close_pipes(self) -> None:
        """Close our ends of stdout/stderr (after the exit: a detached descendant may still hold them)."""
        # asyncio.subprocess.Process has no public close(); its transport owns the pipe transports.
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:
            transport.close()

    async def wait(self) -> ExitStatus:
        await self._exited.wait()
        assert self._status is not None
        return self._status

    def _send(self, line: str) -> bool:
        if self._ctl_writer is None or self._ctl_writer.is_closing():
            return False
        self._ctl_writer.write((line + "\n").encode())
        return True

    async def terminate(self, grace: float = 2.0) -> ExitStatus:
        """SIGTERM the plugin's group, SIGKILL everything after ``grace`` seconds; wait for the tree to go."""
        if self._exited.is_set():
            return await self.wait()
        if self.supervised:
            if self._send(f"term {grace:.3f}"):
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(self.wait(), grace + 5.0)
            return await self._last_resort()
        if sys.platform == "win32":
            return await self.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(self.wait(), grace)
        return await self.kill()

    async def kill(self) -> ExitStatus:
        """SIGKILL the plugin's whole tree now and wait for it to be gone."""
        if self._exited.is_set():
            return await self.wait()
        if self.supervised:
            if self._send("kill"):
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(self.wait(), 5.0)
            return await self._last_resort()
        if sys.platform == "win32":
            from vz_core.transport import _windows

            if self._job is not None:
                _windows.terminate_job(self._job)
            else:
                self._proc.kill()
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        return await self.wait()

    async def _last_resort(self) -> ExitStatus:
        # The supervisor (POSIX only) is unresponsive: kill it and the plugin's group ourselves.
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
        if sys.platform != "win32" and self.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        return await self.wait()


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (the plugin's; Linux, through /proc) and its process group."""
    if sys.platform == "win32":  # no sessions there: a plugin's tree is its Job Object (_windows)
        return
    from vz_core.transport import _supervise

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    for pid in _supervise._session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


async def spawn_plugin(
    argv: list[str],
    *,
    env: dict[str, str],
    exec_fd: int | None = None,
    cleanup_dir: str | None = None,
    supervised: bool = True,
    cwd: str | None = None,
) -> PluginProcess:
    """Start ``argv`` as a plugin process (executing ``exec_fd`` when given; ``argv[0]`` is then only a name).

    Supervised: ``cleanup_dir`` is removed by the supervisor once the plugin's tree is gone.
    """
    if sys.platform == "win32":
        return await _spawn_windows(argv, env=env, cwd=cwd)
    if not supervised:
        executable = f"/proc/self/fd/{exec_fd}" if exec_fd is not None else argv[0]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            executable=executable,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            pass_fds=(exec_fd,) if exec_fd is not None else (),
        )
        process = PluginProcess(proc, supervised=False)
        process._watch = asyncio.get_running_loop().create_task(process._watch_direct())
        return process
    host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        fds = (child_end.fileno(),) + ((exec_fd,) if exec_fd is not None else ())
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            "-c",
            SUPERVISOR_BOOT,
            str(child_end.fileno()),
            str(exec_fd if exec_fd is not None else -1),
            cleanup_dir or "-",
            "--",
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            pass_fds=fds,
            # Out of the host's process group: a group-wide SIGKILL must leave the supervisor alive to clean up.
            start_new_session=True,
        )
    except BaseException:
        host_end.close()
        raise
    finally:
        child_end.close()
    process = PluginProcess(proc, supervised=True)
    process._ctl_reader, process._ctl_writer = await asyncio.open_unix_connection(sock=host_end)
    process._watch = asyncio.get_running_loop().create_task(process._watch_ctl())
    return process


async def _spawn_windows(argv: list[str], *, env: dict[str, str], cwd: str | None) -> PluginProcess:
    from vz_core.transport import _windows

    job = _windows.create_kill_on_close_job()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            creationflags=_windows.CREATE_SUSPENDED | _windows.CREATE_NEW_PROCESS_GROUP,
        )
        _windows.assign_and_resume(job, proc.pid)
    except BaseException:
        _windows.close_job(job)
        raise
    process = PluginProcess(proc, supervised=False)
    process._job = job
    process._watch = asyncio.get_running_loop().create_task(process._watch_direct())
    return process
