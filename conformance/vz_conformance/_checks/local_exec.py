"""exec (local): ``Driver.exec_local`` runs a command whose stdio are descriptors of the caller.

The cases hand the driver pipes, files, ``/dev/null`` or a pseudo-terminal slave and judge what arrives at the
ends the suite kept. Externally they go through ``RemoteDriver.exec_local``: the plugin's local exec socket
when it advertises one (the descriptors travel as SCM_RIGHTS), else the copying default over Exec frames;
``exec.local_frames`` forces the frames path (``RemoteDriver(local_exec=False)``, in-process over the Runtime
Protocol server every Python driver is served with), so both paths are checked in both modes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import secrets
import select
from collections.abc import Callable
from pathlib import Path

from vz_conformance._case import Case
from vz_conformance._context import CheckContext
from vz_conformance._expect import category_of, describe, ensure, expect_error, expect_ok, fail
from vz_conformance._outcome import Outcome, Passed
from vz_conformance._processes import Tree
from vz_core import Driver, ExecExit, ExecSpec
from vz_core.errors import DriverError
from vz_core.platform.files import status_flags

__all__ = [
    "CASES",
    "check_local_cancelled",
    "check_local_exit_code",
    "check_local_file_to_file",
    "check_local_frames",
    "check_local_missing_not_found",
    "check_local_pipe_to_pipe",
    "check_local_signal_exit",
    "check_local_stopped_refused",
    "check_local_terminal_refused",
]

RPC = "exec_local"
PIPE_BYTES = 4 * 1024 * 1024
FILE_BYTES = 2 * 1024 * 1024
FRAMES_BYTES = 1024 * 1024
GONE_WITHIN = 10.0
WITHIN = 60.0


def _payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Descriptors:
    """Every descriptor a case opens (the ends it hands over and the ends it keeps); all closed at the end."""

    def __init__(self) -> None:
        self.open: set[int] = set()

    def pipe(self) -> tuple[int, int]:
        read, write = os.pipe()
        self.open |= {read, write}
        return read, write

    def file(self, path: Path | str, flags: int) -> int:
        fd = os.open(path, flags, 0o600)
        self.open.add(fd)
        return fd

    def pty(self) -> tuple[int, int]:
        master, slave = os.openpty()
        self.open |= {master, slave}
        return master, slave

    def close(self, fd: int) -> None:
        if fd in self.open:
            self.open.discard(fd)
            os.close(fd)

    def close_all(self) -> None:
        for fd in sorted(self.open):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.open.clear()


async def _wait_fd(fd: int, *, write: bool) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _read_all(fd: int, on_data: Callable[[bytes], None] | None = None) -> bytes:
    """Everything readable from the kept read end ``fd`` until end of file (all write ends closed)."""
    os.set_blocking(fd, False)  # the kept end only: the end handed over is another open file description
    out = bytearray()
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            await _wait_fd(fd, write=False)
            continue
        if not data:
            return bytes(out)
        out += data
        if on_data is not None:
            on_data(bytes(out))


async def _write_all(fd: int, data: bytes, fds: _Descriptors) -> int:
    """Write ``data`` into the kept write end ``fd``, then close it (end of file for the command's stdin)."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    sent = 0
    try:
        while sent < len(view):
            try:
                sent += os.write(fd, view[sent : sent + (1 << 16)])
            except BlockingIOError:
                await _wait_fd(fd, write=True)
            except BrokenPipeError:
                break
    finally:
        fds.close(fd)
    return sent


def _flags(fds: tuple[int, int, int]) -> tuple[int, ...]:
    return tuple(status_flags(fd) for fd in fds)


async def _exec_local(
    driver: Driver, machine_id: str, argv: tuple[str, ...], stdio: tuple[int, int, int], *, within: float = WITHIN
) -> ExecExit:
    """``exec_local`` that must return an ``ExecExit`` within ``within`` s, leaving the descriptors as they were."""
    spec = ExecSpec(workspace_id=machine_id, argv=argv)
    before = _flags(stdio)

    async def call() -> ExecExit:
        async with asyncio.timeout(within):
            return await driver.exec_local(machine_id, spec, stdio)

    exit_ = await expect_ok(RPC, call, note=f"argv={list(argv)!r}")
    ensure(isinstance(exit_, ExecExit), RPC, "an ExecExit", exit_, note=f"argv={list(argv)!r}")
    try:
        after = _flags(stdio)
    except OSError as exc:
        fail(RPC, "the caller's descriptors still open after the call", f"a descriptor was closed ({exc})")
    ensure(
        before == after,
        RPC,
        "the file status flags of the caller's descriptors unchanged",
        f"{[oct(f) for f in before]} became {[oct(f) for f in after]}",
    )
    return exit_


async def _drained(task: asyncio.Task[bytes], what: str) -> bytes:
    """The kept read end's bytes; it must reach end of file once exec_local returned and the suite closed its
    copy of the write end (no copy of it may outlive the command)."""
    try:
        async with asyncio.timeout(10):
            return await task
    except TimeoutError:
        fail(RPC, f"end of file on the {what} pipe once the call returned", "still open after 10 s (a copy leaked?)")


async def _cat_pipe_to_pipe(ctx: CheckContext, driver: Driver, machine_id: str, size: int, seed: int) -> None:
    payload = _payload(size, seed)
    fds = _Descriptors()
    tasks: list[asyncio.Task[object]] = []
    try:
        in_r, in_w = fds.pipe()
        out_r, out_w = fds.pipe()
        err_r, err_w = fds.pipe()
        stdout = asyncio.create_task(_read_all(out_r))
        stderr = asyncio.create_task(_read_all(err_r))
        feeder = asyncio.create_task(_write_all(in_w, payload, fds))
        tasks += [stdout, stderr, feeder]
        exit_ = await _exec_local(driver, machine_id, ctx.adapter.cat(), (in_r, out_w, err_w))
        for fd in (in_r, out_w, err_w):
            fds.close(fd)
        got = await _drained(stdout, "stdout")
        err = await _drained(stderr, "stderr")
        ensure(exit_ == ExecExit(0, ""), RPC, "ExecExit(exit_code=0, signal='') for cat", exit_)
        ensure(
            len(got) == len(payload) and _sha(got) == _sha(payload),
            RPC,
            f"the {len(payload)} bytes written into the stdin pipe on the stdout pipe (SHA-256 {_sha(payload)[:16]})",
            f"{len(got)} bytes, SHA-256 {_sha(got)[:16]}",
        )
        ensure(err == b"", RPC, "nothing on the stderr pipe", err[:200])
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        fds.close_all()


async def _exit_with_diagnostic(ctx: CheckContext, driver: Driver, machine_id: str, code: int) -> None:
    message = f"vz-conformance diagnostic {secrets.token_hex(4)}"
    fds = _Descriptors()
    tasks: list[asyncio.Task[bytes]] = []
    try:
        null = fds.file(os.devnull, os.O_RDONLY)
        out_r, out_w = fds.pipe()
        err_r, err_w = fds.pipe()
        tasks = [asyncio.create_task(_read_all(out_r)), asyncio.create_task(_read_all(err_r))]
        exit_ = await _exec_local(driver, machine_id, ctx.adapter.fail_with(code, message), (null, out_w, err_w))
        fds.close(out_w)
        fds.close(err_w)
        await _drained(tasks[0], "stdout")
        err = await _drained(tasks[1], "stderr")
        ensure(
            exit_ == ExecExit(code, ""),
            RPC,
            f"ExecExit(exit_code={code}, signal='') (a non-zero exit is a result, not an error)",
            exit_,
        )
        ensure(message.encode() in err, RPC, f"the stderr pipe containing {message!r}", err[:300])
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        fds.close_all()


async def check_local_pipe_to_pipe(ctx: CheckContext) -> Outcome:
    """cat from a pipe into a pipe: 4 MiB arrive byte for byte (same SHA-256), exit 0, stderr empty, and the
    caller's descriptors stay open with unchanged flags."""
    req = await ctx.create("local-pipe")
    await _cat_pipe_to_pipe(ctx, ctx.driver, req.workspace_id, PIPE_BYTES, seed=11)
    return Passed()


async def check_local_file_to_file(ctx: CheckContext) -> Outcome:
    """cat from a regular file into a regular file: 2 MiB, same SHA-256, exit 0, the stderr file empty."""
    req = await ctx.create("local-file")
    payload = _payload(FILE_BYTES, 12)
    source, target, errors = ctx.scratch / "local-in.bin", ctx.scratch / "local-out.bin", ctx.scratch / "local-err"
    source.write_bytes(payload)
    fds = _Descriptors()
    try:
        stdio = (
            fds.file(source, os.O_RDONLY),
            fds.file(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            fds.file(errors, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        )
        exit_ = await _exec_local(ctx.driver, req.workspace_id, ctx.adapter.cat(), stdio)
    finally:
        fds.close_all()
    got = target.read_bytes()
    ensure(exit_ == ExecExit(0, ""), RPC, "ExecExit(exit_code=0, signal='') for cat", exit_)
    ensure(
        len(got) == len(payload) and _sha(got) == _sha(payload),
        RPC,
        f"the {len(payload)} bytes of the stdin file in the stdout file (SHA-256 {_sha(payload)[:16]})",
        f"{len(got)} bytes, SHA-256 {_sha(got)[:16]}",
    )
    ensure(errors.read_bytes() == b"", RPC, "an empty stderr file", errors.read_bytes()[:200])
    return Passed()


async def check_local_exit_code(ctx: CheckContext) -> Outcome:
    """A command exiting 7 → ExecExit(7, ''), no error; its diagnostic on the stderr pipe."""
    req = await ctx.create("local-exit")
    await _exit_with_diagnostic(ctx, ctx.driver, req.workspace_id, 7)
    return Passed()


async def check_local_signal_exit(ctx: CheckContext) -> Outcome:
    """A command killed by SIGTERM → ExecExit(128 + 15, 'SIGTERM'), no error."""
    req = await ctx.create("local-signal")
    fds = _Descriptors()
    try:
        null = fds.file(os.devnull, os.O_RDONLY)
        sink = fds.file(os.devnull, os.O_WRONLY)
        exit_ = await _exec_local(ctx.driver, req.workspace_id, ctx.adapter.terminate_self(), (null, sink, sink))
    finally:
        fds.close_all()
    ensure(exit_ == ExecExit(143, "SIGTERM"), RPC, "ExecExit(exit_code=143, signal='SIGTERM')", exit_)
    return Passed()


async def check_local_cancelled(ctx: CheckContext) -> Outcome:
    """Cancelling the exec_local task after 'ready' ends it as CANCELLED; the command, its child and grandchild
    are gone within 10 s (pid + start time + marker); the Machine still runs commands."""
    req = await ctx.create("local-cancel")
    marker = f"vzc-marker-{secrets.token_hex(8)}"
    argv, pid_lines = ctx.adapter.blocking_tree(marker)
    fds = _Descriptors()
    ready = asyncio.Event()
    pids: list[int] = []

    def scan(data: bytes) -> None:
        lines = data.decode(errors="replace").splitlines()
        pids[:] = [int(line.split()[1]) for line in lines if line.startswith("pid ") and line.split()[1].isdigit()]
        if "ready" in lines and len(pids) >= pid_lines:
            ready.set()

    spec = ExecSpec(workspace_id=req.workspace_id, argv=argv)
    what = "cancelling the exec_local task"
    tasks: list[asyncio.Task[object]] = []
    try:
        null = fds.file(os.devnull, os.O_RDONLY)
        out_r, out_w = fds.pipe()
        sink = fds.file(os.devnull, os.O_WRONLY)
        reader = asyncio.create_task(_read_all(out_r, scan))
        call = asyncio.create_task(ctx.driver.exec_local(req.workspace_id, spec, (null, out_w, sink)))
        tasks += [reader, call]
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({waiter, call}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not ready.is_set():
            if call in done:
                error = call.exception()
                got = describe(error) if error is not None else f"the call returned {call.result()!r}"
            else:
                got = "nothing after 20 s"
            fail(RPC, f"the blocking command to print 'ready' and {pid_lines} 'pid' lines on the stdout pipe", got)
        tree = Tree(ctx, req.workspace_id, list(pids), marker)
        await tree.observe()
        call.cancel()
        finished, _ = await asyncio.wait({call}, timeout=GONE_WITHIN)
        if not finished:
            got = f"STILL_RUNNING (no end {GONE_WITHIN:g} s after the task was cancelled)"
        elif call.cancelled():
            got = "CANCELLED"
        elif (exc := call.exception()) is not None:
            got = describe(exc) if category_of(exc) != "CANCELLED" else "CANCELLED"
        else:
            got = f"NORMAL_END ({call.result()!r})"
        if got != "CANCELLED":
            await tree.kill_leftovers(tree.identities)
            fail(RPC, f"the call to end as CANCELLED after {what}", got)
        await tree.require_gone(GONE_WITHIN, after=what)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        fds.close_all()
    await ctx.require_status(req.workspace_id, "running", after=what)
    await _true(ctx, req.workspace_id, after=what)
    return Passed()


async def _true(ctx: CheckContext, machine_id: str, *, after: str) -> None:
    fds = _Descriptors()
    try:
        null = fds.file(os.devnull, os.O_RDONLY)
        sink = fds.file(os.devnull, os.O_WRONLY)
        exit_ = await _exec_local(ctx.driver, machine_id, ctx.adapter.true(), (null, sink, sink), within=30)
    finally:
        fds.close_all()
    ensure(exit_ == ExecExit(0, ""), RPC, f"a follow-up command to exit 0 after {after}", exit_)


async def check_local_terminal_refused(ctx: CheckContext) -> Outcome:
    """A pseudo-terminal slave as stdout is refused with INVALID_ARGUMENT naming the stream, before anything
    runs: the command (which would print a marker) writes nothing to the terminal."""
    req = await ctx.create("local-tty")
    marker = f"vzc-tty-{secrets.token_hex(6)}"
    fds = _Descriptors()
    try:
        master, slave = fds.pty()
        null = fds.file(os.devnull, os.O_RDONLY)
        err_r, err_w = fds.pipe()
        argv = ctx.adapter.print_args([marker])
        spec = ExecSpec(workspace_id=req.workspace_id, argv=argv)

        async def call() -> object:
            async with asyncio.timeout(WITHIN):
                return await ctx.driver.exec_local(req.workspace_id, spec, (null, slave, err_w))

        exc = await expect_error(RPC, call, "INVALID_ARGUMENT", note="stdout is a pseudo-terminal slave")
        message = exc.message if isinstance(exc, DriverError) else str(exc)
        ensure("stdout" in message, RPC, "a refusal naming the stream ('stdout')", message)
        await asyncio.sleep(0.5)  # anything a command started anyway would have printed by now
        readable, _, _ = select.select([master], [], [], 0.5)
        written = b""
        if readable:
            os.set_blocking(master, False)
            with contextlib.suppress(BlockingIOError, OSError):
                written = os.read(master, 4096)
        ensure(written == b"", RPC, "nothing written to the terminal (refused before anything runs)", written[:200])
        fds.close(err_w)
        os.set_blocking(err_r, False)
        try:
            err = os.read(err_r, 4096)
        except BlockingIOError:
            fail(RPC, "no copy of the stderr pipe kept after the refusal", "its write end is still open somewhere")
        ensure(err == b"", RPC, "nothing written to the stderr pipe", err[:200])
    finally:
        fds.close_all()
    return Passed()


async def check_local_missing_not_found(ctx: CheckContext) -> Outcome:
    """exec_local on a Machine that does not exist → NOT_FOUND with a message."""
    machine_id = ctx.new_id("local-missing")
    await _refused(ctx, machine_id, "NOT_FOUND", note=f"missing Machine {machine_id!r}")
    return Passed()


async def check_local_stopped_refused(ctx: CheckContext) -> Outcome:
    """exec_local on a stopped Machine → FAILED_PRECONDITION with a message."""
    req = await ctx.create("local-stopped")
    await expect_ok("Stop", lambda: ctx.driver.stop(req.workspace_id), note=req.workspace_id)
    await _refused(ctx, req.workspace_id, "FAILED_PRECONDITION", note=f"stopped Machine {req.workspace_id!r}")
    return Passed()


async def _refused(ctx: CheckContext, machine_id: str, category: str, *, note: str) -> None:
    fds = _Descriptors()
    try:
        null = fds.file(os.devnull, os.O_RDONLY)
        sink = fds.file(os.devnull, os.O_WRONLY)
        spec = ExecSpec(workspace_id=machine_id, argv=ctx.adapter.true())

        async def call() -> object:
            async with asyncio.timeout(WITHIN):
                return await ctx.driver.exec_local(machine_id, spec, (null, sink, sink))

        await expect_error(RPC, call, category, note=note)
    finally:
        fds.close_all()


async def check_local_frames(ctx: CheckContext) -> Outcome:
    """Over Exec frames (RemoteDriver(local_exec=False)): cat pipe to pipe (1 MiB, same SHA-256, exit 0) and an
    exit 7 with its diagnostic on the stderr pipe."""
    req = await ctx.create("local-frames")
    async with ctx.provider.frames_only(ctx.driver) as driver:
        await _cat_pipe_to_pipe(ctx, driver, req.workspace_id, FRAMES_BYTES, seed=13)
        await _exit_with_diagnostic(ctx, driver, req.workspace_id, 7)
    return Passed()


CASES = (
    Case(
        "exec.local_pipe_to_pipe",
        "exec_local: cat from a pipe into a pipe, 4 MiB, same SHA-256, exit 0, descriptors kept",
        check_local_pipe_to_pipe,
    ),
    Case(
        "exec.local_file_to_file",
        "exec_local: cat from a file into a file, 2 MiB, same SHA-256, exit 0",
        check_local_file_to_file,
    ),
    Case("exec.local_exit_code", "exec_local: exit 7 is ExecExit(7, ''), diagnostic on stderr", check_local_exit_code),
    Case("exec.local_signal_exit", "exec_local: SIGTERM death is ExecExit(143, 'SIGTERM')", check_local_signal_exit),
    Case(
        "exec.local_cancelled",
        "exec_local: cancelling the task kills the command tree within 10 s, Machine running",
        check_local_cancelled,
    ),
    Case(
        "exec.local_terminal_refused",
        "exec_local: a terminal as stdout is refused INVALID_ARGUMENT before anything runs",
        check_local_terminal_refused,
    ),
    Case("exec.local_missing_not_found", "exec_local: missing Machine → NOT_FOUND", check_local_missing_not_found),
    Case(
        "exec.local_stopped_refused", "exec_local: stopped Machine → FAILED_PRECONDITION", check_local_stopped_refused
    ),
    Case(
        "exec.local_frames",
        "exec_local over Exec frames (local_exec=False): cat pipe to pipe and exit 7",
        check_local_frames,
    ),
)
