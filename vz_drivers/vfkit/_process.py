"""One vfkit process per Machine: launched detached, found again, stopped, and explained when it dies.

* **Launch.** vfkit does not daemonize, so it is started by ``/bin/sh`` in a session of its own: a background
  subshell starts vfkit (stdin from /dev/null, stdout+stderr appended to ``vfkit.log``), reports its pid, waits
  for it and writes its exit status to ``vfkit.status``. The launching shell exits at once; vfkit outlives the
  driver process (and the plugin supervisor's clean-up of the plugin's process group), as a VM monitor must.
  ``--pidfile`` is not used: it is not part of vfkit 0.6's documented interface.
* **Identity.** A Machine's record keeps vfkit's pid and its start time (``psutil``'s create time, stable for
  the life of the process); a pid that was reused by another process never matches. A relaunched plugin finds
  its vfkit through that pair and the REST socket.
* **Waiting** for a process to end is a kernel signal (kqueue ``NOTE_EXIT`` on macOS, a pidfd on Linux), never
  a sleep loop.
* **Stop** is a bounded state machine over the REST API: ``Stop`` (the guest is asked to power off), then
  ``HardStop`` after ``grace`` seconds, then SIGKILL of the recorded process after ``hard_grace`` more.
* **Diagnostics.** When vfkit dies during a boot the error carries its exit status, the tail of its own
  output and the tail of the guest console.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from vz_core.errors import RuntimeFailureError, RuntimeTimeoutError
from vz_core.platform.process import ExitWatch
from vz_drivers.vfkit._rest import RestError, RestUnreachable, VfkitRest

__all__ = [
    "ReadyListener",
    "VfkitProcess",
    "boot_failure",
    "exit_status",
    "launch",
    "process_alive",
    "stop_vm",
    "tail",
    "wait_gone",
    "wait_ready",
]

_LAUNCHER = r"""
log=$1; status=$2; shift 2
rm -f "$status"
(
  "$@" </dev/null >>"$log" 2>&1 &
  echo "$!"
  exec 1>&- 2>&-
  wait "$!"
  echo "$?" >"$status.tmp" && mv -f "$status.tmp" "$status"
) &
"""
_START_TOLERANCE = 0.01


@dataclass(frozen=True)
class VfkitProcess:
    """A running vfkit: pid, start time and the executable it was started from."""

    pid: int
    start_time: float
    executable: str


def _start_time(pid: int) -> float | None:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(proc.create_time())
    except (psutil.Error, ValueError):
        return None


def process_alive(pid: int, start_time: float, executable: str = "") -> bool:
    """Whether the recorded process still runs (same pid, same start time, and when known the same program)."""
    if pid <= 0:
        return False
    now = _start_time(pid)
    if now is None or abs(now - start_time) > _START_TOLERANCE:
        return False
    if executable:
        try:
            argv = psutil.Process(pid).cmdline()
        except psutil.AccessDenied:
            return True
        except psutil.Error:
            return False
        # Between fork and exec the child is still the launching shell: that is "our" process too. A script
        # (a stand-in vfkit) shows its interpreter first.
        return executable in argv[:2] or argv[:1] in (["/bin/sh"], ["sh"])
    return True


async def launch(argv: Sequence[str], *, run_dir: Path, log: Path, status: Path) -> VfkitProcess:
    """Start ``argv`` (vfkit first) detached in its own session; return its identity once it is running.

    Raises ``RuntimeFailureError`` when the launcher fails or vfkit is gone at once (with its output).
    """
    env = {key: os.environ[key] for key in ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL") if key in os.environ}
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        _LAUNCHER,
        "vz-vfkit-launch",
        str(log),
        str(status),
        *argv,
        cwd=run_dir,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    out, err = await proc.communicate()
    text = out.decode(errors="replace").strip()
    if proc.returncode != 0 or not text.isdigit():
        raise RuntimeFailureError(
            f"could not start vfkit (launcher exit {proc.returncode})",
            runtime_message=(err.decode(errors="replace") + text)[-4000:],
        )
    pid = int(text)
    start = _start_time(pid)
    if start is None:
        raise boot_failure("vfkit exited immediately", log=log, status=status, console=None)
    return VfkitProcess(pid=pid, start_time=start, executable=argv[0])


async def wait_gone(pid: int, start_time: float, timeout: float | None = None) -> bool:  # noqa: ASYNC109
    """Wait until the recorded process has exited; True when it is gone, False when ``timeout`` passed first."""
    if not process_alive(pid, start_time):
        return True
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()

    def _exited() -> None:
        if not gone.done():
            gone.set_result(None)

    watch_fd, closer = _exit_watch(pid)
    if watch_fd < 0:
        return not process_alive(pid, start_time)
    loop.add_reader(watch_fd, _exited)
    try:
        if not process_alive(pid, start_time):
            return True
        try:
            await asyncio.wait_for(gone, timeout)
        except TimeoutError:
            return not process_alive(pid, start_time)
        return True
    finally:
        loop.remove_reader(watch_fd)
        closer()


def _exit_watch(pid: int) -> tuple[int, Callable[[], None]]:
    """A descriptor that becomes readable when ``pid`` exits, and its closer; (-1, ...) when it already has."""
    if sys.platform == "darwin":
        import select

        kq = select.kqueue()
        event = select.kevent(
            pid,
            filter=select.KQ_FILTER_PROC,
            flags=select.KQ_EV_ADD | select.KQ_EV_ONESHOT,
            fflags=select.KQ_NOTE_EXIT,
        )
        try:
            kq.control([event], 0, 0)
        except ProcessLookupError:
            kq.close()
            return -1, _noop
        return kq.fileno(), kq.close
    try:
        watch = ExitWatch(pid)  # a pidfd (vfkit runs on macOS; Linux for the tests of this module)
    except ProcessLookupError:
        return -1, _noop
    return watch.fd, watch.close


def _noop() -> None:
    return None


def _kill(process: VfkitProcess, sig: int) -> None:
    if process_alive(process.pid, process.start_time):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)


async def stop_vm(
    process: VfkitProcess,
    rest: VfkitRest,
    *,
    grace: float,
    hard_grace: float = 10.0,
    graceful: bool = True,
) -> str:
    """Stop the VM and make sure vfkit is gone; returns what ended it.

    "gone" (was not running), "stop" (the guest powered off after ``Stop``), "hardstop" (after ``HardStop``),
    "kill" (SIGKILL of the recorded process). Without ``graceful`` the first step is ``HardStop``.
    """
    pid, start = process.pid, process.start_time
    if not process_alive(pid, start):
        return "gone"
    reachable = True
    if graceful:
        try:
            state = await rest.state()
            if state.running and state.can_stop:
                await rest.change_state("Stop")
                if await wait_gone(pid, start, grace):
                    return "stop"
        except RestUnreachable:
            reachable = False
        except RestError:
            pass
    if reachable:
        with contextlib.suppress(RestUnreachable, RestError):
            await rest.change_state("HardStop")
            if await wait_gone(pid, start, hard_grace):
                return "hardstop"
    _kill(process, signal.SIGKILL)
    if not await wait_gone(pid, start, 15.0):
        raise RuntimeTimeoutError(f"vfkit (pid {pid}) did not exit after SIGKILL")
    return "kill"


def tail(path: Path | None, limit: int = 4000) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _exit_status(status: Path) -> str:
    try:
        code = status.read_text().strip()
    except OSError:
        return ""
    if code.isdigit() and int(code) > 128:
        number = int(code) - 128
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(number).name}"
        return f"killed by signal {number}"
    return f"exit code {code}" if code else ""


async def exit_status(status: Path, within: float = 5.0) -> str:
    """vfkit's exit status as written by the launcher ("0", "1", "137"), or "" if none appears ``within`` s.

    The waiting subshell writes it right after vfkit ends; this bounded wait covers only that moment.
    """
    for _ in range(max(1, int(within / 0.05))):
        with contextlib.suppress(OSError):
            text = await asyncio.to_thread(_read_text, status)
            if text:
                return text
        await asyncio.sleep(0.05)
    return ""


def _read_text(path: Path) -> str:
    return path.read_text().strip()


def boot_failure(what: str, *, log: Path, status: Path, console: Path | None) -> RuntimeFailureError:
    """A ``RuntimeFailureError`` for a vfkit that died: vfkit's own output and the guest console attached."""
    how = _exit_status(status)
    output = tail(log).strip()
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "")
    message = what + (f" ({how})" if how else "")
    if last:
        message += f": {last.strip()[:300]}"
    if console is not None:
        # The guest init's own reason (for example no DHCP lease from the NAT) says more than vfkit's exit.
        init = [line for line in tail(console).splitlines() if "VZ-INIT-FAILED:" in line]
        if init:
            message += f"; the guest init failed: {init[-1].split('VZ-INIT-FAILED:', 1)[1].strip()[:300]}"
    message += f"; vfkit's output is in {log}" + (f", the guest console in {console}" if console else "")
    runtime = f"vfkit output (tail):\n{output or '(empty)'}"
    if console is not None:
        runtime += f"\n\nguest console (tail):\n{tail(console).strip() or '(empty)'}"
    return RuntimeFailureError(message, runtime_message=runtime[-8000:], details={"log": str(log)})


class ReadyListener:
    """The host end of the readiness channel (vsock ``listen`` mode): vfkit connects to it for the guest.

    The guest agent connects to host vsock port ``READY_VSOCK_PORT`` and writes ``ready\\n`` once it serves;
    vfkit forwards that connection to this Unix socket. Created before vfkit starts (vfkit dials it).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._server: asyncio.AbstractServer | None = None
        self._ready: asyncio.Future[None] | None = None

    async def __aenter__(self) -> ReadyListener:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._ready = asyncio.get_running_loop().create_future()
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        os.chmod(self.path, 0o600)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 30)
            if line.strip() == b"ready" and self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
        except (TimeoutError, OSError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def wait(self) -> None:
        assert self._ready is not None, "use ReadyListener as an async context manager"
        await asyncio.shield(self._ready)


async def wait_ready(
    ready: ReadyListener,
    process: VfkitProcess,
    *,
    timeout: float,  # noqa: ASYNC109
    what: str,
    log: Path,
    status: Path,
    console: Path,
) -> None:
    """Return once the guest reported ready; raise when vfkit dies first (with its output) or at ``timeout``."""
    ready_task = asyncio.ensure_future(ready.wait())
    gone_task = asyncio.ensure_future(wait_gone(process.pid, process.start_time))
    try:
        done, _ = await asyncio.wait({ready_task, gone_task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (ready_task, gone_task):
            task.cancel()
        for task in (ready_task, gone_task):
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if ready_task in done and not ready_task.cancelled() and ready_task.exception() is None:
        return
    if gone_task in done:
        await exit_status(status)
        raise boot_failure(f"vfkit exited unexpectedly while booting {what}", log=log, status=status, console=console)
    error = boot_failure(f"{what} did not report ready within {timeout:g} s", log=log, status=status, console=console)
    raise RuntimeTimeoutError(error.message, runtime_message=error.runtime_message)
