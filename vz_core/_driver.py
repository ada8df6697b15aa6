"""The Driver contract (the Machine contract in Python).

One async method per Runtime Protocol RPC, over the plain values of ``vz_core._types``. The plugin SDK turns
any Driver into a ``RuntimeDriver`` gRPC server; the host's remote client turns a gRPC channel back into a
Driver. The CLI, Environments, the conformance suite and the benchmarks all take "a Driver".

Rules every implementation follows (the conformance suite checks them):

* Errors are raised as ``vz_core.errors.DriverError`` subclasses with an actionable message; nothing else may
  escape (anything else is reported as RUNTIME_FAILURE).
* Validation happens before any mutation: a rejected call leaves every Machine exactly as it was.
* An empty ``workspace_id`` is ``InvalidArgumentError``. Workspace ids may contain ``/``, ``..``, spaces and
  unicode: never use one raw as a path.
* Start/Stop/Delete are idempotent (Start on running, Stop on stopped, Delete of a missing Machine succeed).
* Runtime state lives in the backend, not in the driver object: a new driver instance (a relaunched plugin)
  finds every Machine a previous one left, in the same state.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import errno
import os
import socket
import stat
import sys
from collections.abc import AsyncIterator, Callable

from vz_core._types import (
    DriverInfo,
    ExecEvent,
    ExecExit,
    ExecSpec,
    Extensions,
    MachineDetails,
    RunImageRequest,
    TerminalEvent,
    TerminalInput,
    TerminalSpec,
)
from vz_core.errors import InvalidArgumentError, RuntimeFailureError, UnsupportedError

__all__ = ["Driver", "check_local_stdio", "copy_exec_local"]


class Driver(abc.ABC):
    """A backend that realizes Machines. Subclass it and implement the abstract methods."""

    @abc.abstractmethod
    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        """Who the driver is and what it can do. Cheap, side-effect free, always callable.

        ``supports_recreate_on_run`` is the host's 1.3 opt-in: a driver that can replace a Machine inside
        RunImage answers ``RecreateMode.ON_RUN`` only when it is true, otherwise DELETE or STOP.
        """

    @abc.abstractmethod
    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        """Check this host can serve Machines at all.

        Raises ``UnsupportedError`` (host/target pair impossible here) or ``UnavailableError`` (a backend
        binary or service is missing) with what to install or change.
        """

    async def provisioning_preflight(self) -> None:
        """Extra checks before creating a Machine. Only called when ``capabilities.provisioning_preflight``."""
        raise UnsupportedError("this driver does not advertise ProvisioningPreflight")

    async def reuse_preflight(self, workspace_id: str, remote_user: str) -> None:
        """Read-only check that an existing Machine may be reused by ``remote_user`` (API 1.2).

        Only called when ``capabilities.reuse_preflight``. Raises ``NotFoundError`` when the Machine is
        missing and ``FailedPreconditionError`` (mentioning ``--recreate``) when its creation-time contract
        (developer identity, mount policy) differs. Never mutates anything.
        """
        raise UnsupportedError("this driver does not advertise ReusePreflight")

    @abc.abstractmethod
    async def find(self, workspace_id: str) -> MachineDetails | None:
        """The Machine's details, or ``None`` when it does not exist (not an error)."""

    @abc.abstractmethod
    async def target_architecture(self, workspace_id: str) -> str:
        """The architecture Machines run with: exactly "amd64" or "arm64"."""

    @abc.abstractmethod
    async def run_image(self, request: RunImageRequest) -> None:
        """Create and start a Machine; return when it is running.

        Raises ``InvalidArgumentError`` for an empty id or image, ``UnsupportedError`` for an unsupported
        mount type (nothing created), ``AlreadyExistsError`` when the Machine exists and
        ``request.allow_recreate`` is false. With ``allow_recreate`` under RECREATE_MODE_ON_RUN, the whole
        new configuration is validated before the old Machine is touched; a rejected request leaves it as it
        was. Recreation discards Machine-local data and keeps volumes and the workspace.
        """

    @abc.abstractmethod
    async def start(self, workspace_id: str) -> None:
        """Start a stopped Machine (idempotent). ``NotFoundError`` when missing."""

    @abc.abstractmethod
    async def stop(self, workspace_id: str) -> None:
        """Stop a running Machine (idempotent); Machine-local data survives. ``NotFoundError`` when missing."""

    @abc.abstractmethod
    async def delete(self, workspace_id: str) -> None:
        """Remove a Machine and its Machine-local data (idempotent: a missing Machine is success)."""

    @abc.abstractmethod
    def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        """Run ``spec.argv`` (verbatim, no shell) inside a running Machine; an async generator of events.

        ``stdin`` yields the client's input chunks and ends when the client closed stdin. Yield
        ``ExecOutput`` chunks of 1..MAX_CHUNK bytes (stdout and stderr separate, undecoded) and then exactly
        one ``ExecExit``, after all output; nothing after it. A non-zero exit is an ``ExecExit``, not an
        error. The command may exit before stdin ends: report the exit anyway.

        Backpressure: produce output only as fast as the consumer pulls it. Cancellation: when the generator
        is closed or its task cancelled before the exit, kill the command and all its descendants within
        seconds; the Machine keeps running.

        Raises (before yielding) ``NotFoundError`` for a missing Machine, ``FailedPreconditionError`` for a
        stopped one, ``InvalidArgumentError`` for an empty argv, ``UnsupportedError`` for ``tty=True`` unless
        the driver's extensions advertise tty.
        """

    async def exec_local(self, machine_id: str, spec: ExecSpec, stdio: tuple[int, int, int]) -> ExecExit:
        """Run ``spec.argv`` inside the running Machine ``machine_id`` with ``stdio`` as its stdin, stdout, stderr.

        ``stdio`` are open descriptors of this process: pipes, sockets or files, never a terminal (refused with
        ``InvalidArgumentError`` before anything runs: a process in a Machine could inject input into a
        terminal). The caller keeps them: they are not closed, and their file status flags are not changed.
        ``spec.workspace_id`` is replaced by ``machine_id``; ``spec.tty`` must be false. Returns the command's
        exit; a non-zero exit is an ``ExecExit``, not an error. Cancelling the call kills the command.

        This default copies between the descriptors and ``exec()``'s stream, one chunk in flight per
        direction, so a reader that stops reading stops the command (backpressure), and memory stays bounded.
        When the reader of stdout or stderr goes away (EPIPE), the command is stopped and the exit is
        ``128 + 13, "SIGPIPE"``, as a local command writing to a closed pipe would end. Drivers that can hand
        the descriptors to the command itself (zero copies) override it with the same contract.
        """
        check_local_stdio(stdio)
        if spec.tty:
            raise InvalidArgumentError("exec_local runs commands without a terminal (tty=False); use terminal()")
        return await copy_exec_local(self.exec, dataclasses.replace(spec, workspace_id=machine_id), stdio)

    def logs(self, workspace_id: str) -> AsyncIterator[bytes]:
        """The main process's output so far, merged, as chunks of 1..MAX_CHUNK bytes; a finite stream.

        Only called when ``capabilities.logs``. ``NotFoundError`` when missing. On a stopped Machine: the
        output kept from its last run, without starting it.
        """
        raise UnsupportedError(
            "this driver does not implement Logs (Driver.logs is not overridden); a driver that advertises "
            "capabilities.logs must implement it"
        )

    def terminal(self, spec: TerminalSpec, input: AsyncIterator[TerminalInput]) -> AsyncIterator[TerminalEvent]:
        """An interactive terminal session: ``spec.argv`` on a new pseudo-terminal inside a running Machine.

        Optional: a driver that implements it says so with ``Extensions.terminal = True`` (served as
        ``vz.machine.v1.MachineExtensions/ExecPty``); the default refuses with ``UnsupportedError``.

        The command runs verbatim (no shell) as ``spec.user`` in ``spec.workdir`` with ``spec.environment``
        added and ``TERM=spec.term``, as the leader of a new session whose controlling terminal is the
        pseudo-terminal, sized ``spec.rows`` x ``spec.cols`` before it starts (so job control works and
        ``stty size`` is right from the first prompt). ``input`` yields what the client sends:
        ``TerminalData`` is written to the terminal as it is (Ctrl-C, Ctrl-Z and Ctrl-\\ are bytes the line
        discipline turns into signals for the foreground process group, never a cancellation),
        ``TerminalResize`` sets the window size (the foreground process group gets SIGWINCH), and
        ``TerminalEof`` means no more data (resizes may still follow; the command is not told). ``input``
        ends when the client is done sending; that ends nothing by itself.

        Yield ``TerminalOutput`` chunks of 1..MAX_CHUNK bytes (the terminal's one output stream, undecoded)
        and then exactly one ``ExecExit`` (``exit_code``, or 128 + n and the signal's name), after all the
        output the command produced; nothing after it. The session ends when the command exits: whatever else
        is left in its session (background jobs) is killed and the terminal released.

        Backpressure: produce output only as fast as the consumer pulls it. Cancellation: when the generator is
        closed or its task cancelled before the exit, kill the command and everything in its session within
        seconds; the Machine keeps running.

        Raises (before yielding) ``NotFoundError`` for a missing Machine, ``FailedPreconditionError`` for a
        stopped one, ``InvalidArgumentError`` for an empty argv, ``UnsupportedError`` when not served.
        """
        raise UnsupportedError("this driver does not serve terminal sessions (extensions.terminal)")

    async def extensions(self) -> Extensions | None:
        """What the driver supports beyond the Runtime Protocol (``vz.machine.v1``); ``None`` = nothing."""
        return None

    async def close(self) -> None:
        """Release connections and helpers held by this object. Machines keep running."""
        return None


# Local exec: descriptors of this process as a command's stdio -------------------------------------------------

_TTY_MAJORS = frozenset({2, 3, 4, 5, *range(136, 144)})
"""Character-device majors of terminals on Linux: BSD pty masters/slaves (2, 3), virtual consoles and serial
ports (4), /dev/tty, /dev/console and /dev/ptmx (5), Unix98 pseudo-terminal slaves (136-143)."""
_STDIO_NAMES = ("stdin", "stdout", "stderr")


def check_local_stdio(stdio: tuple[int, int, int]) -> None:
    """Refuse stdio descriptors that may not become a command's: not three, not open, or a terminal.

    A terminal never enters a Machine (a process there could push input into it with TIOCSTI): the message
    says to copy it instead. Raises ``InvalidArgumentError`` naming the stream.
    """
    if not isinstance(stdio, tuple) or len(stdio) != 3:
        raise InvalidArgumentError("exec_local needs exactly three descriptors: (stdin, stdout, stderr)")
    for name, fd in zip(_STDIO_NAMES, stdio, strict=True):
        if not isinstance(fd, int) or isinstance(fd, bool) or fd < 0:
            raise InvalidArgumentError(f"exec_local: {name} must be an open file descriptor, got {fd!r}")
        try:
            st = os.fstat(fd)
        except OSError as exc:
            raise InvalidArgumentError(
                f"exec_local: {name} (descriptor {fd}) is not an open file descriptor ({exc.strerror})"
            ) from None
        if is_terminal(fd, st):
            raise InvalidArgumentError(
                f"exec_local: {name} (descriptor {fd}) is a terminal; a terminal is never passed into a Machine: "
                "copy its bytes instead (exec) or open a terminal session (terminal)",
                details={"stream": name},
            )


def is_terminal(fd: int, st: os.stat_result | None = None) -> bool:
    """Whether ``fd`` is a terminal: ``isatty`` (a terminal's ioctl answers), or a character device whose major
    number is a terminal's (a terminal that refuses the ioctl is still one)."""
    st = os.fstat(fd) if st is None else st
    if not stat.S_ISCHR(st.st_mode):
        return False
    if sys.platform != "linux":  # the major numbers are Linux's (and Windows has none)
        return os.isatty(fd)
    else:
        return os.isatty(fd) or os.major(st.st_rdev) in _TTY_MAJORS


_READ_SIZE = 1024 * 1024  # a wide exec frame; fewer, larger reads cost the copying path less CPU per MiB
_SIGPIPE_EXIT = ExecExit(128 + 13, "SIGPIPE")


class _Endpoint:
    """One stdio descriptor of a local exec, read or written without blocking the event loop and without
    touching the caller's file status flags.

    A pipe is reopened through ``/proc/self/fd`` as a non-blocking file description of our own; a socket is
    used with ``MSG_DONTWAIT`` on a duplicate; both wait for readiness in the event loop, so a stalled peer
    stalls only this exec and cancelling it returns at once. Regular files and other devices never block.
    Where a pipe cannot be reopened (no ``/proc``) it is used blocking from a worker thread.
    """

    def __init__(self, fd: int, *, write: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = fd
        self._own = -1
        self._sock: socket.socket | None = None
        self._kind = "inline"
        mode = os.fstat(fd).st_mode
        if sys.platform == "win32":  # no /proc, no readiness for pipes on the proactor loop: a worker thread
            if stat.S_ISFIFO(mode):
                self._kind = "thread"
        elif stat.S_ISFIFO(mode):
            flags = (os.O_WRONLY if write else os.O_RDONLY) | os.O_NONBLOCK
            try:
                self._own = os.open(f"/proc/self/fd/{fd}", flags)
                self._kind = "poll"
            except OSError:
                self._kind = "thread"
        elif stat.S_ISSOCK(mode):
            self._sock = socket.socket(fileno=os.dup(fd))
            self._kind = "socket"

    def close(self) -> None:
        if self._own >= 0:
            os.close(self._own)
            self._own = -1
        if self._sock is not None:
            self._sock.close()  # our duplicate only: the caller's descriptor stays open
            self._sock = None

    async def _ready(self, fd: int, *, write: bool) -> None:
        waiter = self._loop.create_future()
        add, remove = (
            (self._loop.add_writer, self._loop.remove_writer)
            if write
            else (self._loop.add_reader, self._loop.remove_reader)
        )

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        add(fd, wake)
        try:
            await waiter
        finally:
            remove(fd)

    async def read(self) -> bytes:
        if self._kind == "poll":
            while True:
                try:
                    return os.read(self._own, _READ_SIZE)
                except BlockingIOError:
                    await self._ready(self._own, write=False)
        if sys.platform != "win32" and self._kind == "socket":  # (never a socket on Windows: see __init__)
            assert self._sock is not None
            while True:
                try:
                    return self._sock.recv(_READ_SIZE, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    await self._ready(self._sock.fileno(), write=False)
        if self._kind == "thread":
            return await asyncio.to_thread(os.read, self._fd, _READ_SIZE)
        return os.read(self._fd, _READ_SIZE)

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._kind == "poll":
                try:
                    n = os.write(self._own, view)
                except BlockingIOError:
                    await self._ready(self._own, write=True)
                    continue
            elif sys.platform != "win32" and self._kind == "socket":
                assert self._sock is not None
                try:
                    n = self._sock.send(view, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
                except BlockingIOError:
                    await self._ready(self._sock.fileno(), write=True)
                    continue
            elif self._kind == "thread":
                n = await asyncio.to_thread(os.write, self._fd, view)
            else:
                n = os.write(self._fd, view)
            view = view[n:]


async def copy_exec_local(
    exec: Callable[[ExecSpec, AsyncIterator[bytes]], AsyncIterator[ExecEvent]],
    spec: ExecSpec,
    stdio: tuple[int, int, int],
) -> ExecExit:
    """``Driver.exec_local`` by copying: ``stdio[0]`` feeds ``exec``'s stdin (a driver's ``exec``; output chunks
    of any size), its output goes to
    ``stdio[1]``/``stdio[2]``. One chunk in flight per direction (backpressure both ways); cancellation kills
    the command. The descriptors are not checked here (``check_local_stdio``) and stay open."""
    endpoints: list[_Endpoint] = []
    try:
        source = _Endpoint(stdio[0], write=False)
        endpoints.append(source)
        sinks = {"stdout": _Endpoint(stdio[1], write=True)}
        endpoints.append(sinks["stdout"])
        sinks["stderr"] = _Endpoint(stdio[2], write=True)
        endpoints.append(sinks["stderr"])
    except OSError as exc:
        for endpoint in endpoints:
            endpoint.close()
        raise InvalidArgumentError(f"exec_local: a stdio descriptor cannot be used: {exc.strerror or exc}") from None

    async def stdin() -> AsyncIterator[bytes]:
        while True:
            try:
                data = await source.read()
            except OSError as exc:
                raise RuntimeFailureError(f"exec_local: reading stdin failed: {exc.strerror or exc}") from None
            if not data:
                return
            yield data

    try:
        async with contextlib.aclosing(exec(spec, stdin())) as events:  # type: ignore[type-var]
            async for event in events:
                if isinstance(event, ExecExit):
                    return event
                try:
                    await sinks[event.stream].write(event.data)
                except OSError as exc:
                    if exc.errno == errno.EPIPE:
                        return _SIGPIPE_EXIT  # closing the stream (aclosing) stops the command
                    raise RuntimeFailureError(
                        f"exec_local: writing {event.stream} failed: {exc.strerror or exc}"
                    ) from None
        raise RuntimeFailureError("the driver's exec ended without an exit (protocol violation)")
    finally:
        for endpoint in endpoints:
            endpoint.close()
