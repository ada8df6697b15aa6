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
from collections.abc import AsyncIterator

from vz_core._types import (
    DriverInfo,
    ExecEvent,
    ExecSpec,
    Extensions,
    MachineDetails,
    RunImageRequest,
    TerminalEvent,
    TerminalInput,
    TerminalSpec,
)
from vz_core.errors import UnsupportedError

__all__ = ["Driver"]


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

    def logs(self, workspace_id: str) -> AsyncIterator[bytes]:
        """The main process's output so far, merged, as chunks of 1..MAX_CHUNK bytes; a finite stream.

        Only called when ``capabilities.logs``. ``NotFoundError`` when missing. On a stopped Machine: the
        output kept from its last run, without starting it.
        """
        raise UnsupportedError("this driver does not advertise Logs")

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
