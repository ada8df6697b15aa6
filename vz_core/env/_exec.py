"""`vz exec`: select the Machine, obtain its driver, build the ExecSpec, run it, and classify what went wrong.

The caller (the CLI) supplies stdin as an async iterator and a sink for output chunks; it owns the terminal,
the signals and the exit status. Everything else is here.

This path is performance sensitive (B7): no pydantic, the state database is opened once, no lock is taken and
nothing is negotiated.

Errors are translated exactly once, in ``_exec_errors``: a driver that reports the Machine missing
(``NotFoundError``) or not running (``FailedPreconditionError``) becomes the same error class with a message
naming the Machine, the Environment and the `vz up` that fixes it; every other error passes unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from vz_core._types import (
    TERMINAL_COLS,
    TERMINAL_ROWS,
    TERMINAL_TERM,
    ExecExit,
    ExecOutput,
    ExecSpec,
    TerminalInput,
    TerminalOutput,
    TerminalSpec,
)
from vz_core.env._context import (
    Context,
    explain_interrupted,
    learn_recorded_secrets,
    open_store,
    resolve_project,
    select_existing,
    stale_operations,
)
from vz_core.env._drivers import acquire_driver
from vz_core.env._select import ENV_VAR_MACHINE, select_machine
from vz_core.env._store import EnvironmentRecord, MachineRecord
from vz_core.errors import FailedPreconditionError, NotFoundError, RuntimeFailureError, UnsupportedError

__all__ = [
    "ExecTarget",
    "LogSink",
    "OutputSink",
    "TerminalSink",
    "execute",
    "execute_local",
    "execute_logs",
    "execute_terminal",
    "prepare_exec",
]

OutputSink = Callable[[str, bytes], "Awaitable[None] | None"]
"""Receives each output chunk: (``"stdout"`` or ``"stderr"``, data). An async sink is awaited before the next
chunk is pulled (backpressure)."""
TerminalSink = Callable[[bytes], "Awaitable[None] | None"]
"""Receives each chunk of a terminal session's one output stream (awaited when it returns an awaitable)."""
LogSink = Callable[[bytes], Awaitable[None]]
"""Receives each chunk of a Machine's log."""


async def _deliver(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


@dataclass(frozen=True)
class ExecTarget:
    """Everything `vz exec` needs to run a command: which Machine, through which driver, where."""

    environment: EnvironmentRecord
    machine: MachineRecord
    workdir: str
    user: str = ""
    """Who the command runs as: the Machine's remote_user (developer identity), else its driver's default."""


def prepare_exec(ctx: Context, *, environment: str | None = None, machine: str | None = None) -> ExecTarget:
    """Select the Environment and Machine for an exec, fast (no pydantic, no lock, no driver)."""
    project = resolve_project(ctx, environment)
    assert project is not None
    with open_store(ctx) as store:
        env = select_existing(ctx, store, project, environment)
        records = store.machines(env.env_id)
        learn_recorded_secrets(ctx, records)
        record = select_machine(
            environment=env,
            machines=records,
            explicit=machine,
            env_var=ctx.environ.get(ENV_VAR_MACHINE) or None,
        )
        if record.state in ("creating", "failed"):
            stale = stale_operations(store, env.env_id, None)
            if stale:
                raise FailedPreconditionError(
                    f"machine {record.name} of Environment {env.label()} is not ready: "
                    f"{explain_interrupted(stale[-1]).split(';')[0]}; run `vz up --environment {env.name}`"
                )
    workspace = record.spec.get("workspace") or {}
    workdir = ""
    if isinstance(workspace, dict) and workspace.get("projection", "none") != "none":
        workdir = str(workspace.get("target") or "")
    remote_user = record.spec.get("remote_user")
    return ExecTarget(env, record, workdir, remote_user if isinstance(remote_user, str) else "")


@contextmanager
def _exec_errors(target: ExecTarget) -> Iterator[None]:
    """The one translation of driver errors for an exec (see the module docstring)."""
    env = target.environment
    machine = target.machine
    try:
        yield
    except NotFoundError as exc:
        raise NotFoundError(
            f"machine {machine.name} of Environment {env.label()} does not exist in driver {machine.driver!r}; "
            f"run `vz up --environment {env.name}` to recreate it",
            details=dict(exc.details),
        ) from None
    except FailedPreconditionError as exc:
        raise FailedPreconditionError(
            f"machine {machine.name} of Environment {env.label()} is not running; "
            f"run `vz up --environment {env.name}` to start it ({exc.message})",
            details=dict(exc.details),
        ) from None


async def execute(
    ctx: Context,
    target: ExecTarget,
    argv: list[str],
    stdin: AsyncIterator[bytes],
    output: OutputSink,
    *,
    workdir: str | None = None,
    environment: dict[str, str] | None = None,
) -> ExecExit:
    """Run ``argv`` in the target Machine (from ``prepare_exec(ctx, ...)``); output chunks go to ``output``.

    Returns the command's ``ExecExit``. Cancelling the calling task cancels the exec stream (the driver kills
    the command and its descendants). An exception raised by ``output`` (e.g. ``BrokenPipeError``) ends the
    exec the same way and propagates. The driver is closed before this returns.
    """
    driver = acquire_driver(
        target.machine.driver, target.machine.driver_options, recorded=True, redactor=ctx.redactor, source=ctx.drivers
    )
    spec = _exec_spec(target, argv, workdir, environment)
    try:
        with _exec_errors(target):
            events = driver.exec(spec, stdin)
            try:
                async for event in events:
                    if isinstance(event, ExecOutput):
                        await _deliver(output(event.stream, event.data))
                    else:
                        return event
            finally:
                with suppress(Exception):
                    await events.aclose()  # type: ignore[attr-defined]
        raise RuntimeFailureError("the exec stream ended without an exit status; the command's outcome is unknown")
    finally:
        with suppress(Exception):
            await driver.close()


async def execute_terminal(
    ctx: Context,
    target: ExecTarget,
    argv: list[str],
    keys: AsyncIterator[TerminalInput],
    output: TerminalSink,
    *,
    rows: int = TERMINAL_ROWS,
    cols: int = TERMINAL_COLS,
    term: str = TERMINAL_TERM,
    workdir: str | None = None,
    environment: dict[str, str] | None = None,
) -> ExecExit:
    """Run ``argv`` on a new terminal in the target Machine (``Driver.terminal``): `vz exec -t`.

    ``keys`` is what the user types (and window changes); the terminal's output goes to ``output``. Returns
    the command's ``ExecExit``; cancellation ends the session (the driver kills everything in it). A driver
    that does not serve terminals fails with ``UnsupportedError`` saying so. The driver is closed before this
    returns.
    """
    machine = target.machine
    driver = acquire_driver(
        machine.driver, machine.driver_options, recorded=True, redactor=ctx.redactor, source=ctx.drivers
    )
    spec = TerminalSpec(
        workspace_id=machine.workspace_id,
        argv=tuple(argv),
        user=target.user,
        workdir=target.workdir if workdir is None else workdir,
        rows=rows,
        cols=cols,
        term=term or TERMINAL_TERM,
        environment=dict(environment or {}),
    )
    try:
        with _exec_errors(target):
            try:
                events = driver.terminal(spec, keys)
                try:
                    async for event in events:
                        if isinstance(event, TerminalOutput):
                            await _deliver(output(event.data))
                        else:
                            return event
                finally:
                    with suppress(Exception):
                        await events.aclose()  # type: ignore[attr-defined]
            except UnsupportedError as exc:
                raise UnsupportedError(
                    f"driver {machine.driver!r} of machine {machine.name} does not serve terminal sessions, so "
                    f"`vz exec -t` cannot run there; run the command without -t ({exc.message})",
                    details=dict(exc.details),
                ) from None
        raise RuntimeFailureError("the terminal session ended without an exit status; the command's outcome is unknown")
    finally:
        with suppress(Exception):
            await driver.close()


def _exec_spec(
    target: ExecTarget, argv: list[str], workdir: str | None, environment: dict[str, str] | None
) -> ExecSpec:
    return ExecSpec(
        workspace_id=target.machine.workspace_id,
        argv=tuple(argv),
        user=target.user,
        workdir=target.workdir if workdir is None else workdir,
        environment=dict(environment or {}),
    )


async def execute_local(
    ctx: Context,
    target: ExecTarget,
    argv: list[str],
    stdio: tuple[int, int, int],
    *,
    workdir: str | None = None,
    environment: dict[str, str] | None = None,
) -> ExecExit:
    """Run ``argv`` in the target Machine with its stdin/stdout/stderr on the descriptors ``stdio``.

    The descriptors stay the caller's (not closed here); they must not be terminals. ``Driver.exec_local``
    takes them: a plugin with a local exec path gets them passed on (where the Machine shares the host kernel
    they become the command's own), otherwise the driver's default copies between them and its exec stream.
    Errors, cancellation and closing are as for ``execute``.
    """
    driver = acquire_driver(
        target.machine.driver, target.machine.driver_options, recorded=True, redactor=ctx.redactor, source=ctx.drivers
    )
    spec = _exec_spec(target, argv, workdir, environment)
    try:
        with _exec_errors(target):
            return await driver.exec_local(spec.workspace_id, spec, stdio)
    finally:
        with suppress(Exception):
            await driver.close()


async def execute_logs(
    ctx: Context,
    target: ExecTarget,
    output: LogSink,
    *,
    follow: bool = False,
    tail: int | None = None,
    interval: float = 1.0,
) -> None:
    """The target Machine's log (its main process's output, ``Driver.logs``) to ``output``.

    ``tail``: only the last ``tail`` lines of what is there now. ``follow``: then keep sending what the
    Machine adds, asking the driver every ``interval`` seconds, until the Machine no longer runs or the calling
    task is cancelled. A driver without logs fails with ``UnsupportedError`` naming it.
    """
    import asyncio

    from vz_core._types import MAX_CHUNK

    machine = target.machine
    driver = acquire_driver(
        machine.driver, machine.driver_options, recorded=True, redactor=ctx.redactor, source=ctx.drivers
    )
    sent = 0
    first = True
    try:
        with _exec_errors(target):
            while True:
                try:
                    chunks = [chunk async for chunk in driver.logs(machine.workspace_id)]
                except UnsupportedError as exc:
                    raise UnsupportedError(
                        f"driver {machine.driver!r} of machine {machine.name} keeps no logs ({exc.message})",
                        details=dict(exc.details),
                    ) from None
                data = b"".join(chunks)
                if len(data) < sent:  # a new run of the Machine: its log started again
                    sent = 0
                fresh = data[sent:]
                if first and tail is not None:
                    fresh = _last_lines(fresh, tail)
                first = False
                for start in range(0, len(fresh), MAX_CHUNK):
                    await output(fresh[start : start + MAX_CHUNK])
                sent = len(data)
                if not follow:
                    return
                found = await driver.find(machine.workspace_id)
                if found is None or found.state.status != "running":
                    return
                await asyncio.sleep(interval)
    finally:
        with suppress(Exception):
            await driver.close()


def _last_lines(data: bytes, count: int) -> bytes:
    if count <= 0:
        return b""
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-count:])
