"""`vz exec` as a client of the vz daemon: hand over stdio, copy terminals, forward signals, return the exit status.

Selecting the Environment and the Machine, obtaining its driver and running the command all happen in the
daemon (``Machines.Exec``); this process only moves what must be moved. This path is performance sensitive
(B7, `vz exec -- true` with a warm daemon): it is one blocking, single-threaded poll loop and imports neither
asyncio nor grpc, pydantic or rich.

* **Descriptors, not bytes.** stdin when it is a pipe, a file or /dev/null, and stdout and stderr when they are a
  file or a device such as /dev/null (pipes and sockets too with ``--pass-pipes``), are handed to the daemon as
  file descriptors (SCM_RIGHTS, ``stdio[i]`` true): the command reads and writes them directly. A pipe is first
  grown to ``/proc/sys/fs/pipe-max-size`` (``enlarge_pipe``; never shrunk, a refusal ignored). An output pipe
  or socket otherwise travels as bytes, so that `vz exec` ends when the command's main process exits, as
  `docker exec` does, even while a background process of the command still holds its output open.
* **A terminal never leaves this process** (a process in the Machine could inject input into it with
  TIOCSTI): a stream that is a terminal travels as bytes (``B`` messages of stream i).
* ``-t`` / ``-it``: a terminal session in the Machine (``tty`` true): our terminal goes raw (with ``-i``) and
  is restored on every way out; the window size is sent at start and on every SIGWINCH; TERM is forwarded.

Signals: SIGINT (Ctrl-C), SIGTERM and SIGHUP cancel the exec (the daemon's driver kills the command and its
descendants) and vz exits 128+N; under ``-it`` Ctrl-C is a keystroke for the Machine's terminal and only SIGTERM
and SIGHUP cancel. The command's own death by signal N also exits 128+N.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # `typing` costs milliseconds on this path
if TYPE_CHECKING:
    import signal as _signal
    from typing import Any, Protocol

    from vz_core.platform.terminal import RawTerminal
else:  # not `signal`: it builds enums (milliseconds here); `signal` is imported where a name is needed
    import _signal

__all__ = ["NOT_A_TTY", "ExecCall", "enlarge_pipe", "exit_code_of", "exit_status", "run_exec"]

NOT_A_TTY = "the input device is not a TTY"
WINDOWS_EXEC = (
    "`vz exec` is not available on Windows hosts yet (its stdio loop waits with poll(), which Windows offers "
    "for sockets only; --detach forks)"
)
"""The error of `vz exec -it` when stdin is not a terminal (docker's words, so scripts written for it match)."""

TERMINAL_ROWS, TERMINAL_COLS = 24, 80
"""Window size sent when none of stdin, stdout, stderr is a terminal with a size (as vz_core's defaults)."""
CHUNK = 64 * 1024
CANCEL_GRACE = 20.0
"""Seconds to wait for the daemon to confirm a cancelled exec before leaving anyway."""

_STDIN, _STDOUT, _STDERR, _TERMINAL = 0, 1, 2, 3


if TYPE_CHECKING:

    class ExecCall(Protocol):
        """What the loop needs of ``vz_core.api.ExecCall`` (``Client.open_exec``: one connection to the daemon)."""

        def fileno(self) -> int: ...
        def receive(self) -> tuple[str, Any] | tuple[str, int, bytes]: ...
        def send(self, stream: int, data: bytes) -> None: ...
        def close_stdin(self) -> None: ...
        def resize(self, rows: int, cols: int) -> None: ...
        def signal(self, name: str) -> None: ...
        def cancel(self) -> None: ...
        def close(self) -> None: ...


def exit_status(exit_code: int, signal_name: str | None) -> int:
    """The shell-style exit status of an exec: the code, or 128+N for a command killed by signal N."""
    if not signal_name:
        return exit_code & 0xFF if exit_code >= 0 else 1
    name = signal_name.strip().upper()
    number: int | None = None
    if name.isdigit():
        number = int(name)
    else:
        import signal

        try:
            number = signal.Signals[name if name.startswith("SIG") else "SIG" + name].value
        except KeyError:
            number = None
    if number is not None and 0 < number < 128:
        return 128 + number
    return exit_code if 0 < exit_code < 256 else 1


def exit_code_of(event: Any) -> int:
    """``exit_status`` of an ``ExecExit``-like value (``exit_code``, ``signal``)."""
    return exit_status(int(event.exit_code), event.signal)


def _window(fds: tuple[int, ...]) -> tuple[int, int] | None:
    """(rows, cols) of the first of ``fds`` that is a terminal with a size, or None."""
    for fd in fds:
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        if size.lines > 0 and size.columns > 0:
            return size.lines, size.columns
    return None


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


_PASS, _COPY, _CLOSED = 0, 1, 2


def _disposition(fd: int, *, pipes: bool) -> int:
    """How stream ``fd`` travels: ``_PASS`` (handed to the daemon as it is; a pipe is enlarged first), ``_COPY``
    (its bytes are copied by this process: a terminal, or with ``pipes`` false a pipe or socket), ``_CLOSED``.

    An output pipe handed over would be the command's own, so a background process of the command that keeps
    it open would keep the caller's reader waiting after the command exited; copied, its end is the exit's
    (docker exec's). Files and devices such as /dev/null have no reader to keep waiting: they are handed over.
    """
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return _CLOSED
    if _isatty(fd):
        return _COPY
    kind = mode & 0o170000
    if kind in (0o010000, 0o140000):  # S_ISFIFO, S_ISSOCK
        if not pipes:
            return _COPY
        if kind == 0o010000:
            enlarge_pipe(fd)
    return _PASS


_PIPE_MAX_SIZE = "/proc/sys/fs/pipe-max-size"


def enlarge_pipe(fd: int) -> int | None:
    """Grow the pipe ``fd`` to the largest size an unprivileged process may set (``/proc/sys/fs/pipe-max-size``,
    1 MiB by default; never shrunk); its size after, or None where pipes cannot be resized.

    A passed pipe carries the command's bytes with no copy by vz; a larger pipe means fewer wake-ups of the
    processes at either end (``cat`` of 256 MiB: about twice the throughput of the default 64 KiB here). A
    refusal (EPERM once the user's pipe buffers exceed ``pipe-user-pages-soft``, EBUSY) leaves the pipe as it was.
    """
    from vz_core.platform.files import PIPE_RESIZABLE, get_pipe_size, set_pipe_size

    if not PIPE_RESIZABLE:
        return None
    current = get_pipe_size(fd)
    if current is None:
        return None
    try:
        with open(_PIPE_MAX_SIZE, "rb") as f:
            target = int(f.read().strip() or 0)
    except (OSError, ValueError):
        target = 1 << 20  # the kernel's default limit
    if target <= current:
        return current
    try:
        return set_pipe_size(fd, target)
    except OSError:
        return current


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def run_exec(
    client: Any,
    *,
    context: dict[str, Any],
    argv: list[str],
    environment: str | None,
    machine: str | None,
    workdir: str | None,
    tty: bool = False,
    interactive: bool = False,
    env: dict[str, str] | None = None,
    user: str | None = None,
    detach: bool = False,
    pass_pipes: bool = False,
) -> int:
    """Run ``argv`` in the selected Machine through the daemon, wired to this process's stdio; the exit status.

    With ``tty`` (`vz exec -t`) and ``interactive`` (`-it`) stdin must be a terminal (else
    ``UserError(NOT_A_TTY)``, before the daemon is asked anything). ``env``: variables added for the command;
    ``user``: USER[:GROUP] to run as; ``detach``: see ``run_detached``; ``pass_pipes``: stdout and stderr pipes
    are handed over too (see ``_disposition``). Errors of the daemon raise
    ``vz_core.api.ApiError``.
    """
    if sys.platform == "win32":  # the loop below waits with poll() on pipes and the socket: POSIX only
        from vz_core.errors import UserError

        raise UserError(WINDOWS_EXEC)
    else:
        if detach:
            from vz_core.cli._detach import run_detached

            return run_detached(
                client,
                context=context,
                argv=argv,
                environment=environment,
                machine=machine,
                workdir=workdir,
                env=env,
                user=user,
            )
        if tty and interactive and not _isatty(0):
            from vz_core.errors import UserError

            raise UserError(NOT_A_TTY)
        opened: list[int] = []
        stdio: list[int | None] = [None, None, None]
        if not tty:
            for fd in (0, 1, 2):
                how = _disposition(fd, pipes=fd == 0 or pass_pipes)
                if how == _PASS:
                    stdio[fd] = fd
                elif how == _CLOSED:  # the command gets /dev/null there
                    null = os.open(os.devnull, os.O_RDWR)
                    opened.append(null)
                    stdio[fd] = null
        size = _window((0, 1, 2)) or (TERMINAL_ROWS, TERMINAL_COLS)
        loop = _Loop(tty=tty, interactive=interactive, copy_stdin=not tty and stdio[0] is None)
        # Signals are caught from before the request: with the fd fast path the command may write to our stdout
        # before open_exec returns, and a signal sent then must still cancel it and exit 128+N.
        with loop:
            try:
                call: ExecCall = client.open_exec(
                    argv,
                    context=context,
                    environment=environment,
                    machine=machine,
                    workdir=workdir,
                    stdio=tuple(stdio),
                    tty=tty,
                    rows=size[0],
                    cols=size[1],
                    term=os.environ.get("TERM", "") if tty else None,
                    env=env,
                    user=user,
                )
            finally:
                for fd in opened:
                    os.close(fd)
            try:
                return loop.run(call)
            finally:
                call.close()


if sys.platform != "win32":  # (run_exec refuses first on Windows)

    class _Loop:
        """One exec call driven to its end: output to our fds, stdin copied when it is a terminal, signals."""

        call: ExecCall

        def __init__(self, *, tty: bool, interactive: bool, copy_stdin: bool) -> None:
            self.tty = tty
            self.interactive = interactive
            self.read_stdin = copy_stdin or (tty and interactive)
            self.signals: list[int] = []
            self.resized = False
            self.cancelled = False
            self._wake_r = self._wake_w = -1
            self._old_wakeup: int | None = None
            self._previous: dict[int, Any] = {}

        def __enter__(self) -> _Loop:
            """Catch SIGINT, SIGTERM and SIGHUP (only the last two for `-it`: Ctrl-C goes to the Machine) for the
            loop, and SIGWINCH with a terminal; each wakes the loop. ``__exit__`` puts the earlier handlers back."""
            cancelling = (_signal.SIGTERM, _signal.SIGHUP) if self.tty and self.interactive else _CANCELLING
            from vz_core.platform.files import nonblocking_pipe

            self._wake_r, self._wake_w = nonblocking_pipe()
            try:
                self._old_wakeup = _signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
                for sig in cancelling:
                    self._previous[sig] = _signal.signal(sig, self._on_signal)
                if self.tty:
                    self._previous[_signal.SIGWINCH] = _signal.signal(_signal.SIGWINCH, self._on_winch)
            except BaseException:
                self.__exit__()
                raise
            return self

        def __exit__(self, *exc: object) -> None:
            for signum, handler in self._previous.items():
                _signal.signal(signum, handler)
            self._previous.clear()
            if self._old_wakeup is not None:
                _signal.set_wakeup_fd(self._old_wakeup)
                self._old_wakeup = None
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1

        def run(self, call: ExecCall) -> int:
            """Drive ``call`` to its end (inside ``with self``); a signal caught before it began counts."""
            import select

            self.call = call
            wake_r = self._wake_r
            raw: RawTerminal | None = None
            try:
                if self.tty and self.interactive:
                    from vz_core.platform.terminal import RawTerminal

                    raw = RawTerminal(0)  # restored on every way out
                if self.tty and not self.interactive:
                    self.call.close_stdin()
                poller = select.poll()
                sock = self.call.fileno()
                poller.register(sock, select.POLLIN)
                poller.register(wake_r, select.POLLIN)
                if self.read_stdin:
                    poller.register(0, select.POLLIN)
                deadline: float | None = None
                while True:
                    if self.signals and not self.cancelled:
                        self.cancelled = True  # the daemon kills the command and answers 128+N
                        import signal

                        self.call.signal(signal.Signals(self.signals[0]).name)
                        import time

                        deadline = time.monotonic() + CANCEL_GRACE
                    if self.resized:
                        self.resized = False
                        now = _window((0, 1, 2))
                        if now is not None:
                            self.call.resize(*now)
                    timeout = None
                    if deadline is not None:
                        import time

                        timeout = max(0, int((deadline - time.monotonic()) * 1000))
                        if timeout == 0:
                            return 128 + self.signals[0]
                    for fd, _ in poller.poll(timeout):
                        if fd == wake_r:
                            _drain(wake_r)
                        elif fd == 0:
                            if not self._copy_stdin():
                                poller.unregister(0)
                        elif fd == sock:
                            done = self._receive()
                            if done is not None:
                                return done
            finally:
                if raw is not None:
                    raw.restore()

        def _on_signal(self, signum: int, frame: object) -> None:
            self.signals.append(signum)

        def _on_winch(self, signum: int, frame: object) -> None:
            self.resized = True

        def _copy_stdin(self) -> bool:
            """Send what our stdin (a terminal) has; False at its end."""
            try:
                data = os.read(0, CHUNK)
            except OSError:
                data = b""
            if not data:
                self.call.close_stdin()
                return False
            self.call.send(_TERMINAL if self.tty else _STDIN, data)
            return True

        def _receive(self) -> int | None:
            """Handle the next message (``receive()`` reads exactly one); the exit status once the call ended."""
            try:
                message = self.call.receive()
            except Exception:
                if self.signals:  # the daemon confirmed the cancel with an error (or hung up)
                    return 128 + self.signals[0]
                raise
            if len(message) == 3:  # ("output", stream, data)
                _, stream, data = message
                fd = 1 if stream in (_STDOUT, _TERMINAL) else 2
                try:
                    _write_all(fd, data)
                except BrokenPipeError:
                    self.call.cancel()
                    return 128 + _signal.SIGPIPE
                return None
            if self.signals:
                return 128 + self.signals[0]
            result: Any = message[1]  # ("result", {"exit_code", "signal"})
            return exit_status(int(result.get("exit_code", 1)), result.get("signal"))

    _CANCELLING = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except OSError:  # empty (non-blocking)
        pass
