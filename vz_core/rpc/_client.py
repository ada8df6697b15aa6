"""``RemoteDriver``: a Driver served by a plugin process, over gRPC. Callers cannot tell it from in-process.

Lifecycle (``mode``):

* ``"warm"`` (default): one plugin process and connection reused by every call; it is shut down after
  ``idle_timeout`` seconds without calls, and relaunched by the next call after an idle stop or a crash.
* ``"per_operation"``: every call launches the plugin, negotiates, makes the call and shuts the plugin down,
  the way some Runtime Protocol hosts work (benchmark B9 compares both).

Before any other call on a new connection the driver's Info is fetched (offering ``supports_recreate_on_run``)
and validated (``vz_core.negotiate``). Calls gated on capabilities (ProvisioningPreflight, ReusePreflight,
Logs) are refused locally with ``UnsupportedError`` — no launch, no RPC — once the capabilities are known.

Errors: a plugin's error status becomes the matching ``DriverError`` (``vz_core.rpc._wire``); when the plugin
process dies during a call the call fails with ``UnavailableError`` whose ``runtime_message`` is the plugin's
redacted stderr tail. Texts coming from the plugin are redacted with the secrets this client has sent
(RunImage/Exec environment values).

Exec: one send pump (start, stdin chunked to ≤ 32 KiB, close_stdin, half-close) and one receive loop that
turns frames into events 1:1 without repairing anything. A vz plugin may agree on wide frames
(``vz_core.rpc.WIDE_CHUNK_KEY``, up to 1 MiB each way): stdin then goes in frames that wide, and ``exec`` cuts
each wide output frame it receives under that agreement into ``MAX_CHUNK`` pieces (the contract's chunk size);
every other frame, of any plugin, still reaches the caller exactly as sent. Backpressure both ways: stdin is
pulled only as fast as gRPC flow control lets frames out, and frames are read only when the caller asks for the
next event.
Closing the event generator (or cancelling its task) cancels the call, which makes the plugin kill the
command. Always close an exec generator you stop reading (``aclose()``); the contract's rules apply. An empty
argv is refused locally (``InvalidArgumentError``), as the protocol's frame rules require.

Terminal sessions (``terminal``, ``vz.machine.v1.MachineExtensions/ExecPty``) use the same pump and receive
loop with terminal frames: data, resizes and one close_stdin out; one output stream and one exit in.

Ending an exec: once the exit frame arrives, the call ends, or the plugin's response headers carry
``vz_core.rpc.STOP_INPUT_KEY`` (a vz plugin refusing the exec), the pump stops at the next write
boundary (a pending ``call.write()`` is never cancelled: that would cancel the call) and half-closes without
``close_stdin``. vz plugins end an Exec only after that half-close. Against servers that end it earlier (go-plugin
plugins do), grpcio's asyncio client may replace the server's status with a made-up INTERNAL when a write
fails (grpc/grpc#36066); the receive loop reads through it and reports the server's own frames and status.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import stat
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import grpc
import grpc.aio

from vz_core._driver import Driver, check_local_stdio, copy_exec_local
from vz_core._proto.devsy.runtime.v1 import runtime_pb2 as pb
from vz_core._proto.devsy.runtime.v1 import runtime_pb2_grpc as pb_grpc
from vz_core._proto.vz.machine.v1 import extensions_pb2 as ext_pb
from vz_core._proto.vz.machine.v1 import extensions_pb2_grpc as ext_grpc
from vz_core._types import (
    MAX_CHUNK,
    DriverInfo,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecSpec,
    Extensions,
    MachineDetails,
    RunImageRequest,
    TerminalData,
    TerminalEof,
    TerminalEvent,
    TerminalInput,
    TerminalResize,
    TerminalSpec,
)
from vz_core.errors import (
    DriverError,
    InvalidArgumentError,
    RuntimeFailureError,
    RuntimeTimeoutError,
    UnavailableError,
    UnsupportedError,
    UserError,
)
from vz_core.negotiate import validate_info
from vz_core.redact import Redactor
from vz_core.rpc import _convert, _convert_services
from vz_core.rpc._codec import decode_server, encode_stdin, serialize
from vz_core.rpc._frames import (
    MAX_INFO,
    MAX_MESSAGE,
    MAX_WIDE_CHUNK,
    STOP_INPUT_KEY,
    WIDE_CHUNK_KEY,
    resize_problem,
    start_problem,
    terminal_start_problem,
    wide_chunk,
)
from vz_core.rpc._heap import keep_freed_heap

if sys.platform != "win32":
    from vz_core.rpc._local import local_exec
from vz_core.rpc._wire import error_from_rpc, runtime_errors_in
from vz_core.services import ServiceSpec, ServiceState

if TYPE_CHECKING:
    from vz_core.transport import PluginConnection, PluginLauncher

__all__ = [
    "DEFAULT_OPERATION_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "ENV_OPERATION_TIMEOUT",
    "ENV_TIMEOUT",
    "Mode",
    "RemoteDriver",
    "StatusLog",
    "is_made_up",
]

DEFAULT_TIMEOUT = 60.0
"""Seconds: deadline of the quick unary RPCs (Info, Find, TargetArchitecture, ReusePreflight, Extensions)."""
DEFAULT_OPERATION_TIMEOUT = 1800.0
"""Seconds: deadline of the unary RPCs that do work (Preflight, ProvisioningPreflight, RunImage, Start, Stop,
Delete): a RunImage may pull an image or boot a virtual machine."""
ENV_TIMEOUT = "VZ_PLUGIN_RPC_TIMEOUT"
"""Environment variable overriding ``DEFAULT_TIMEOUT`` (seconds) for every RemoteDriver not given one."""
ENV_OPERATION_TIMEOUT = "VZ_PLUGIN_OPERATION_TIMEOUT"
"""Environment variable overriding ``DEFAULT_OPERATION_TIMEOUT`` (seconds)."""
_QUICK = frozenset({"Info", "Find", "TargetArchitecture", "ReusePreflight", "Extensions"})
_OPERATIONS = (
    "Preflight",
    "ProvisioningPreflight",
    "RunImage",
    "Start",
    "Stop",
    "Delete",
    "DeleteVolume",
    "SetServices",
    "ServiceStates",
    "ServiceLogs",
)


def _seconds(given: float | None, env: str, default: float) -> float:
    if given is None:
        raw = os.environ.get(env, "").strip()
        if not raw:
            return default
        try:
            given = float(raw)
        except ValueError:
            raise UserError(f"{env}={raw!r} is not a number of seconds") from None
        if not math.isfinite(given) or given <= 0:
            raise UserError(f"{env}={raw!r} must be a positive number of seconds")
    elif not math.isfinite(given) or given <= 0:
        raise ValueError(f"an RPC timeout must be a positive number of seconds, not {given!r}")
    return given


Mode = Literal["warm", "per_operation"]
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]
_TRANSPORT_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
}
_CRASH_WAIT = 1.0
_PUMP_WAIT = 2.0
_PEER_STATUS_WAIT = 2.0


class _Session:
    """One usable connection for the duration of a call: stubs plus the negotiated Info."""

    def __init__(self, channel: grpc.aio.Channel, conn: PluginConnection | None, info: DriverInfo) -> None:
        self.runtime = pb_grpc.RuntimeDriverStub(channel)  # type: ignore[no-untyped-call]
        self.exec: Any = channel.stream_stream(  # type: ignore[call-arg]  # _registered_method: not in the stubs
            "/devsy.runtime.v1.RuntimeDriver/Exec",
            request_serializer=serialize,
            response_deserializer=decode_server,
            _registered_method=True,
        )
        """``RuntimeDriver/Exec`` with data frames encoded and decoded directly (``vz_core.rpc._codec``)."""
        self.extensions = ext_grpc.MachineExtensionsStub(channel)  # type: ignore[no-untyped-call]
        self.conn = conn
        self.info = info
        self.local_exec: str | None = None
        """The plugin's local exec socket ("" = none); None until asked (once per connection)."""


class RemoteDriver(Driver):
    """A Driver over a plugin: give it a ``PluginLauncher`` (it launches as needed) or a ready ``channel``.

    With a channel, the caller owns the plugin process and the channel; ``mode`` and ``idle_timeout`` then do
    not apply. ``close()`` shuts down a plugin this object launched.

    Deadlines: every unary RPC has one. ``timeout`` (seconds) applies to the quick ones (Info, Find,
    TargetArchitecture, ReusePreflight, Extensions), ``operation_timeout`` to those that do work (Preflight,
    ProvisioningPreflight, RunImage, Start, Stop, Delete). Unset, they come from ``VZ_PLUGIN_RPC_TIMEOUT`` /
    ``VZ_PLUGIN_OPERATION_TIMEOUT``, else ``DEFAULT_TIMEOUT`` / ``DEFAULT_OPERATION_TIMEOUT``. A plugin that
    misses one is hung: the call fails with ``RuntimeTimeoutError`` naming the driver and the RPC, the plugin
    this object launched is killed, and the next call starts it again. Exec and Logs streams have no deadline
    (a command may run for hours); cancel them instead.

    Exec frames: with a vz plugin, Exec uses wide frames (``wide_frames``, see ``_exec``); ``exec`` still hands
    its caller output chunks of at most 32 KiB. ``wide_frames=False`` keeps the protocol's frames as sent.
    """

    def __init__(
        self,
        launcher: PluginLauncher | None = None,
        *,
        channel: grpc.aio.Channel | None = None,
        mode: Mode = "warm",
        idle_timeout: float | None = 300.0,
        name: str = "",
        redactor: Redactor | None = None,
        timeout: float | None = None,
        operation_timeout: float | None = None,
        local_exec: bool = True,
        wide_frames: bool = True,
    ) -> None:
        if (launcher is None) == (channel is None):
            raise ValueError("give exactly one of launcher or channel")
        self.timeout = _seconds(timeout, ENV_TIMEOUT, DEFAULT_TIMEOUT)
        self.operation_timeout = _seconds(operation_timeout, ENV_OPERATION_TIMEOUT, DEFAULT_OPERATION_TIMEOUT)
        self._deadlines = {
            **dict.fromkeys(_QUICK, self.timeout),
            **dict.fromkeys(_OPERATIONS, self.operation_timeout),
        }
        self._launcher = launcher
        self._channel = channel
        self.mode: Mode = mode
        self.idle_timeout = idle_timeout
        self.name = name or (launcher.name if launcher is not None else "") or "plugin"
        if redactor is not None:
            self._redactor = redactor
        elif launcher is not None:
            self._redactor = launcher.redactor
        else:
            self._redactor = Redactor()
        self._conn: PluginConnection | None = None
        self._session_info: DriverInfo | None = None
        self._known: DriverInfo | None = None
        self._lock = asyncio.Lock()
        self._busy = 0
        self._idle: asyncio.TimerHandle | None = None
        self._idle_at = 0.0
        self._warm: _Session | None = None
        self._idle_task: asyncio.Task[None] | None = None
        self._retiring: PluginConnection | None = None
        self._closed = False
        self.local_exec = local_exec
        """Use the plugin's local exec socket for ``exec_local`` when it advertises one (else gRPC frames)."""
        self.wide_frames = wide_frames
        """Offer a vz plugin wide Exec frames (``WIDE_CHUNK_KEY``). False: every Exec keeps the protocol's 32 KiB
        frames both ways and ``exec`` hands on every output frame exactly as the plugin sent it, as a host that
        is not vz sees them (for judging a plugin's frames, as the conformance suite does)."""

    def __repr__(self) -> str:
        return f"RemoteDriver(name={self.name!r}, mode={self.mode!r})"

    # Connection management -----------------------------------------------------------------------------

    @property
    def connection(self) -> PluginConnection | None:
        """The live plugin connection in warm mode (None before the first call, after idle stop or a crash)."""
        return self._conn if self._conn is not None and self._conn.alive else None

    @property
    def retiring(self) -> PluginConnection | None:
        """The plugin connection being shut down (idle stop or ``close``) until its process has exited."""
        return self._retiring

    async def _retire(self, conn: PluginConnection) -> None:
        self._retiring = conn
        try:
            await conn.shutdown()
        finally:
            self._retiring = None

    @property
    def known_info(self) -> DriverInfo | None:
        """The last validated Info (capabilities used for local gating)."""
        return self._known

    async def _negotiate(self, channel: grpc.aio.Channel, conn: PluginConnection | None) -> DriverInfo:
        stub = pb_grpc.RuntimeDriverStub(channel)  # type: ignore[no-untyped-call]
        try:
            reply = await stub.Info(pb.InfoRequest(supports_recreate_on_run=True), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise await self._translate(exc, "Info", conn) from None
        self._check_info_size(reply)
        info = validate_info(_convert.info_from_pb(reply), offered_recreate_on_run=True)
        self._known = info
        return info

    async def _connect(self) -> tuple[grpc.aio.Channel, PluginConnection | None, DriverInfo]:
        if self._channel is not None:
            if self._session_info is None:
                self._session_info = await self._negotiate(self._channel, None)
            return self._channel, None, self._session_info
        assert self._launcher is not None
        conn = await self._launcher.launch()
        try:
            info = await self._negotiate(conn.channel, conn)
        except BaseException:
            await conn.shutdown()
            raise
        return conn.channel, conn, info

    def _fast_session(self) -> _Session | None:
        """The warm session when it is ready (no lock, no await: the common case); the caller must ``_release``."""
        session = self._warm
        if session is None or self._closed or (session.conn is not None and not session.conn.alive):
            return None
        if self.mode != "warm" and self._launcher is not None:
            return None
        self._busy += 1
        return session

    async def _acquire(self) -> _Session:
        """The warm (or given-channel) session, connecting first when needed; the caller must ``_release``."""
        session = self._fast_session()
        if session is not None:
            return session
        if self._closed:
            raise UnavailableError(f"driver {self.name!r} was closed")
        async with self._lock:
            if self._channel is None and (self._conn is None or not self._conn.alive):
                self._warm = None
                if self._conn is not None:
                    stale, self._conn = self._conn, None
                    await stale.shutdown()
                _, self._conn, self._session_info = await self._connect()
            elif self._channel is not None and self._session_info is None:
                await self._connect()
            assert self._session_info is not None
            if self._warm is None:
                channel = self._channel if self._channel is not None else self._conn.channel  # type: ignore[union-attr]
                self._warm = _Session(channel, self._conn, self._session_info)
            self._busy += 1
            return self._warm

    def _release(self) -> None:
        self._busy -= 1
        if self._busy == 0:
            self._arm_idle()

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[_Session]:
        if self._closed:
            raise UnavailableError(f"driver {self.name!r} was closed")
        if self._launcher is not None and self.mode == "per_operation":
            channel, conn, info = await self._connect()
            try:
                yield _Session(channel, conn, info)
            finally:
                if conn is not None:
                    await conn.shutdown()
            return
        session = await self._acquire()
        try:
            yield session
        finally:
            self._release()

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _arm_idle(self) -> None:
        # One timer at a time, moved forward lazily: a call does not pay for a new timer.
        if self._launcher is None or self.idle_timeout is None or self._conn is None:
            return
        loop = asyncio.get_running_loop()
        self._idle_at = loop.time() + self.idle_timeout
        if self._idle is None:
            self._idle = loop.call_at(self._idle_at, self._idle_expired)

    def _idle_expired(self) -> None:
        self._idle = None
        if self._busy or self._conn is None:
            return  # the call in progress arms the timer again when it ends
        loop = asyncio.get_running_loop()
        if loop.time() < self._idle_at:
            self._idle = loop.call_at(self._idle_at, self._idle_expired)
            return
        self._idle_task = loop.create_task(self._stop_idle())

    async def _stop_idle(self) -> None:
        async with self._lock:
            if self._busy == 0 and self._conn is not None:
                conn, self._conn = self._conn, None
                self._warm = None
                self._session_info = None
                await self._retire(conn)

    async def close(self) -> None:
        """Shut down the plugin this object launched (Machines keep running). Idempotent."""
        self._closed = True
        self._cancel_idle()
        if self._idle_task is not None:
            with contextlib.suppress(Exception):
                await self._idle_task
        async with self._lock:
            self._warm = None
            if self._conn is not None:
                conn, self._conn = self._conn, None
                await self._retire(conn)

    # Error translation -----------------------------------------------------------------------------------

    def _clean(self, err: DriverError) -> DriverError:
        r = self._redactor
        if not r:
            return err
        return type(err)(
            r.redact(err.message) or err.message,
            runtime_message=r.redact(err.runtime_message),
            details={k: r.redact(v) for k, v in err.details.items()},
            retryable=err.retryable,
        )

    async def _translate(self, exc: grpc.RpcError, rpc: str, conn: PluginConnection | None) -> DriverError:
        """The DriverError for a failed call; a dead plugin becomes UNAVAILABLE with its stderr tail."""
        code: grpc.StatusCode = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and rpc in self._deadlines and not runtime_errors_in(exc):
            return await self._hung(rpc, conn)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and not runtime_errors_in(exc):
            # grpcio's own message-size check, on our request or on the plugin's reply
            return RuntimeFailureError(
                f"driver {self.name!r}: a {rpc} message is over the size limit of {MAX_MESSAGE} bytes",
                runtime_message=self._redactor.redact(exc.details() or ""),
                details={"rpc": rpc, "limit": str(MAX_MESSAGE), "grpc_code": code.name},
            )
        if conn is not None and code in _TRANSPORT_CODES and not runtime_errors_in(exc):
            status = await conn.wait_exited(_CRASH_WAIT)
            if status is not None:
                await conn.stderr.finish(0.5)
                return UnavailableError(
                    f"driver {self.name!r}: the plugin process died during {rpc} ({status}); "
                    "the next call starts it again",
                    runtime_message=conn.stderr_tail(),
                    details={"rpc": rpc, "plugin_exit": str(status)},
                )
        return self._clean(error_from_rpc(exc, rpc=rpc))

    async def _hung(self, rpc: str, conn: PluginConnection | None) -> DriverError:
        """Our deadline passed (the plugin sent no status of its own): kill a plugin we launched."""
        seconds = self._deadlines[rpc]
        setting = ENV_TIMEOUT if rpc in _QUICK else ENV_OPERATION_TIMEOUT
        message = f"driver {self.name!r} did not answer {rpc} within {seconds:g}s (the plugin hangs; {setting})"
        tail = ""
        if conn is not None:
            await conn.kill()
            tail = conn.stderr_tail()
            message += "; the plugin was stopped and the next call starts it again"
        return RuntimeTimeoutError(message, runtime_message=tail, details={"rpc": rpc, "timeout": f"{seconds:g}"})

    def _check_info_size(self, reply: pb.InfoResponse) -> None:
        size = reply.ByteSize()
        if size > MAX_INFO:
            raise RuntimeFailureError(
                f"driver {self.name!r} answered Info with {size} bytes, over the limit of {MAX_INFO} bytes "
                "(names, versions and capabilities are short); refusing the driver",
                details={"rpc": "Info", "size": str(size), "limit": str(MAX_INFO)},
            )

    def _gate(self, rpc: str, flag: str) -> None:
        known = self._known
        if known is not None and known.capabilities is not None and not getattr(known.capabilities, flag):
            raise UnsupportedError(f"driver {self.name!r} does not advertise {rpc} (capabilities.{flag})")

    async def _unary(self, rpc: str, request: Any, flag: str = "") -> Any:
        if flag:
            self._gate(rpc, flag)
        session = self._fast_session()
        if session is None:
            async with self._session() as slow:
                return await self._call_unary(slow, rpc, request, flag)
        try:
            return await self._call_unary(session, rpc, request, flag)
        finally:
            self._release()

    async def _call_unary(self, s: _Session, rpc: str, request: Any, flag: str) -> Any:
        if flag:
            self._gate(rpc, flag)  # the capabilities may have just been negotiated
        try:
            return await getattr(s.runtime, rpc)(request, timeout=self._deadlines[rpc])
        except grpc.RpcError as exc:
            raise await self._translate(exc, rpc, s.conn) from None

    # The Driver contract ---------------------------------------------------------------------------------

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        async with self._session() as s:
            if supports_recreate_on_run:
                return s.info
            try:
                reply = await s.runtime.Info(pb.InfoRequest(supports_recreate_on_run=False), timeout=self.timeout)
            except grpc.RpcError as exc:
                raise await self._translate(exc, "Info", s.conn) from None
            self._check_info_size(reply)
            return validate_info(_convert.info_from_pb(reply), offered_recreate_on_run=False)

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        await self._unary("Preflight", pb.PreflightRequest(disable_auto_start=disable_auto_start))

    async def provisioning_preflight(self) -> None:
        await self._unary("ProvisioningPreflight", pb.ProvisioningPreflightRequest(), "provisioning_preflight")

    async def reuse_preflight(self, workspace_id: str, remote_user: str) -> None:
        request = pb.ReusePreflightRequest(workspace_id=workspace_id, remote_user=remote_user)
        await self._unary("ReusePreflight", request, "reuse_preflight")

    async def find(self, workspace_id: str) -> MachineDetails | None:
        reply = await self._unary("Find", pb.FindRequest(workspace_id=workspace_id))
        return _convert.details_from_pb(reply.container) if reply.found else None

    async def target_architecture(self, workspace_id: str) -> str:
        reply = await self._unary("TargetArchitecture", pb.TargetArchitectureRequest(workspace_id=workspace_id))
        architecture: str = reply.architecture
        return architecture

    async def run_image(self, request: RunImageRequest) -> None:
        self._redactor.add_environment(request.environment)
        await self._unary("RunImage", _convert.run_image_to_pb(request))

    async def start(self, workspace_id: str) -> None:
        await self._unary("Start", pb.StartRequest(workspace_id=workspace_id))

    async def stop(self, workspace_id: str) -> None:
        await self._unary("Stop", pb.StopRequest(workspace_id=workspace_id))

    async def delete(self, workspace_id: str) -> None:
        await self._unary("Delete", pb.DeleteRequest(workspace_id=workspace_id))

    def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        return self._exec(spec, stdin, cut=True)

    async def _exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes], *, cut: bool) -> AsyncIterator[ExecEvent]:
        """Exec, offering the plugin wide frames (``WIDE_CHUNK_KEY``) unless ``wide_frames`` is off.

        ``cut`` (``exec``, whose caller takes chunks of at most ``MAX_CHUNK``): an output frame wider than
        ``MAX_CHUNK`` that a vz plugin sent under the agreement (at most the agreed size) is handed on cut into
        ``MAX_CHUNK`` pieces, the last one shorter. Every other frame is handed on exactly as sent: all frames of
        a plugin that did not agree, an empty frame, a frame over the agreed size. So every frame a plugin may
        not send still reaches the caller as it came (the conformance suite judges frames that way). Without
        ``cut`` (``exec_local``, which writes the output out) wide frames are handed on whole."""
        if not spec.argv:
            # A frame rule of the protocol: refused here, before a launch or a call.
            raise InvalidArgumentError("exec needs a non-empty argv (the command and its arguments)")
        start = _convert.exec_spec_to_pb(spec)
        if (problem := start_problem(start)) is not None:
            raise InvalidArgumentError(problem)  # refused here, before a launch or a call
        self._redactor.add_environment(spec.environment)
        if self.wide_frames:
            keep_freed_heap()  # wide frames: their ~1 MiB buffers reused, not faulted in again each frame
        async with self._session() as s:
            call = s.exec(metadata=((WIDE_CHUNK_KEY, str(MAX_WIDE_CHUNK)),) if self.wide_frames else None)
            pump = _ExecPump(call, pb.ExecClientMessage(start=start), stdin, _ExecFrames())
            events = self._events(s, call, pump, "Exec", _exec_event)
            agreed = 0  # the frame size the plugin agreed on; asked at the first frame wider than MAX_CHUNK
            try:
                async for event in events:
                    if cut and type(event) is ExecOutput and len(data := event.data) > MAX_CHUNK:
                        if not agreed:
                            agreed = await pump.agreed()
                        if len(data) <= agreed:
                            stream = event.stream
                            for i in range(0, len(data), MAX_CHUNK):
                                yield ExecOutput(stream, data[i : i + MAX_CHUNK])
                            continue
                    yield event
            finally:
                await events.aclose()

    async def exec_local(self, machine_id: str, spec: ExecSpec, stdio: tuple[int, int, int]) -> ExecExit:
        """``Driver.exec_local``: when the plugin advertises a local exec socket
        (``ExtensionsResponse.local_exec_socket``) and ``local_exec`` is on, the descriptors go to the plugin
        (SCM_RIGHTS; its listener must be the plugin process) and no exec byte crosses gRPC; otherwise the
        copying default over Exec frames. Cancelling the call closes the connection: the plugin kills the
        command."""
        check_local_stdio(stdio)
        if not spec.argv:
            raise InvalidArgumentError("exec needs a non-empty argv (the command and its arguments)")
        if spec.tty:
            raise InvalidArgumentError("exec_local runs commands without a terminal (tty=False); use terminal()")
        spec = replace(spec, workspace_id=machine_id)
        if (problem := start_problem(_convert.exec_spec_to_pb(spec))) is not None:
            raise InvalidArgumentError(problem)
        self._redactor.add_environment(spec.environment)
        if sys.platform == "win32" or not self.local_exec:  # Windows: no descriptor passing, always the copy
            _widen_pipes(stdio)
            return await copy_exec_local(self._wide_exec, spec, stdio)
        else:
            async with self._session() as s:
                path = await self._local_exec_socket(s)
                if not path:
                    _widen_pipes(stdio)
                    return await copy_exec_local(self._wide_exec, spec, stdio)
                try:
                    return await local_exec(
                        path,
                        machine_id,
                        spec,
                        stdio,
                        expected_pid=s.conn.pid if s.conn is not None else 0,
                        what=f"driver {self.name!r}",
                    )
                except DriverError as exc:
                    if s.conn is not None and isinstance(exc, UnavailableError):
                        status = await s.conn.wait_exited(_CRASH_WAIT)
                        if status is not None:
                            await s.conn.stderr.finish(0.5)
                            raise UnavailableError(
                                f"driver {self.name!r}: the plugin process died during a local exec ({status}); "
                                "the next call starts it again",
                                runtime_message=s.conn.stderr_tail(),
                                details={"rpc": "LocalExec", "plugin_exit": str(status)},
                            ) from None
                    raise self._clean(exc) from None

    def _wide_exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        return self._exec(spec, stdin, cut=False)

    async def _local_exec_socket(self, s: _Session) -> str:
        """The plugin's advertised local exec socket ("" when it has none), asked once per connection."""
        if s.local_exec is None:
            try:
                reply = await s.extensions.Extensions(ext_pb.ExtensionsRequest(), timeout=self.timeout)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise await self._translate(exc, "Extensions", s.conn) from None
                s.local_exec = ""  # no extensions at all: Exec frames
            else:
                path = reply.local_exec_socket
                s.local_exec = path if path.startswith("/") else ""
        return s.local_exec

    async def terminal(self, spec: TerminalSpec, input: AsyncIterator[TerminalInput]) -> AsyncIterator[TerminalEvent]:
        """A terminal session through ``vz.machine.v1.MachineExtensions/ExecPty`` (see ``Driver.terminal``).

        Input is sent as it comes (data in frames of at most 32 KiB, resizes, one close_stdin); an input
        iterator that ends sends close_stdin if it was not sent and half-closes. A plugin that does not serve
        terminals answers ``UnsupportedError``.
        """
        if not spec.argv:
            raise InvalidArgumentError("a terminal session needs a non-empty argv (the command and its arguments)")
        start = _convert.terminal_spec_to_pb(spec)
        if (problem := terminal_start_problem(start)) is not None:
            raise InvalidArgumentError(problem)
        if (problem := resize_problem(spec.rows, spec.cols)) is not None:
            raise InvalidArgumentError(f"terminal start: {problem}")
        self._redactor.add_environment(spec.environment)
        async with self._session() as s:
            call = s.extensions.ExecPty()
            pump = _ExecPump(call, ext_pb.PtyClientMessage(start=start), input, _TerminalFrames())
            events = self._events(s, call, pump, "ExecPty", _convert.terminal_event_from_pb)
            try:
                async for event in events:
                    yield event
            finally:
                await events.aclose()

    async def _events(
        self, s: _Session, call: Any, pump: _ExecPump, rpc: str, decode: Callable[[Any], Any]
    ) -> AsyncGenerator[Any, None]:
        """The receive loop of an exec-shaped stream: frames to events 1:1, then the outcome."""
        statuses = _StatusLog(call)
        # The call's async iterator, not read(): read() stops at a status grpcio made up (see _StatusLog)
        # even when the server's frames are still waiting to be read.
        frames = call.__aiter__()
        finished = False
        exited = False
        try:
            while True:
                try:
                    msg = await frames.__anext__()
                except StopAsyncIteration:
                    break
                except (grpc.RpcError, asyncio.CancelledError) as exc:
                    finished = True
                    pump.stop()
                    if (failure := pump.failure()) is not None:
                        raise failure from None  # our input iterator failed: that is the error to report
                    if not isinstance(exc, grpc.RpcError):
                        raise
                    status: grpc.RpcError = exc
                    if _made_up(exc):
                        status = await statuses.peer_status(_PEER_STATUS_WAIT) or exc
                        if status is exc and exited:
                            break  # the exit frame already told the outcome
                    if status.code() == grpc.StatusCode.OK:
                        break
                    raise await self._translate(status, rpc, s.conn) from None
                event = decode(msg)
                if event is None:
                    raise RuntimeFailureError(
                        f"driver {self.name!r} sent an {rpc} frame with no payload (protocol violation)"
                    )
                if isinstance(event, ExecExit):
                    exited = True
                    pump.stop()  # the command is gone: send nothing more, half-close
                yield event
            finished = True
            pump.stop()
            if (failure := pump.failure()) is not None:
                raise failure
        finally:
            if not finished:
                call.cancel()
            await pump.close()

    async def logs(self, workspace_id: str) -> AsyncIterator[bytes]:
        self._gate("Logs", "logs")
        async with self._session() as s:
            self._gate("Logs", "logs")
            call = s.runtime.Logs(pb.LogsRequest(workspace_id=workspace_id))
            finished = False
            try:
                while True:
                    try:
                        msg = await call.read()
                    except grpc.RpcError as exc:
                        finished = True
                        raise await self._translate(exc, "Logs", s.conn) from None
                    if msg is _EOF:
                        finished = True
                        break
                    yield msg.data
                code = await call.code()
                if code != grpc.StatusCode.OK:
                    raise await self._translate(await _StatusError.of(call), "Logs", s.conn)
            finally:
                if not finished:
                    call.cancel()

    async def extensions(self) -> Extensions | None:
        async with self._session() as s:
            try:
                reply = await s.extensions.Extensions(ext_pb.ExtensionsRequest(), timeout=self.timeout)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return None
                raise await self._translate(exc, "Extensions", s.conn) from None
            return _convert.extensions_from_pb(reply)

    async def delete_volume(self, name: str) -> None:
        """Remove a named volume's data through the plugin (``MachineExtensions.DeleteVolume``; idempotent).

        ``UnsupportedError`` when the plugin's driver has no volume-removal operation (or the plugin predates
        the RPC); ``FailedPreconditionError`` while one of its Machines still mounts the volume.
        """
        async with self._session() as s:
            request = ext_pb.DeleteVolumeRequest(name=name)
            try:
                await s.extensions.DeleteVolume(request, timeout=self.operation_timeout)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED and not runtime_errors_in(exc):
                    raise UnsupportedError(
                        f"driver {self.name!r} serves no volume removal (its plugin predates DeleteVolume)"
                    ) from None
                raise await self._translate(exc, "DeleteVolume", s.conn) from None

    async def set_services(self, workspace_id: str, specs: Sequence[ServiceSpec]) -> tuple[ServiceState, ...]:
        """Make ``specs`` the Machine's service set (``MachineExtensions.SetServices``)."""
        request = ext_pb.SetServicesRequest(
            workspace_id=workspace_id, services=[_convert_services.spec_to_pb(spec) for spec in specs]
        )
        return _convert_services.states_from_pb(await self._services_rpc("SetServices", request))

    async def service_states(self, workspace_id: str) -> tuple[ServiceState, ...]:
        """The Machine's service states (``MachineExtensions.ServiceStates``)."""
        request = ext_pb.ServiceStatesRequest(workspace_id=workspace_id)
        return _convert_services.states_from_pb(await self._services_rpc("ServiceStates", request))

    async def service_logs(self, workspace_id: str, name: str, tail_bytes: int = 0) -> bytes:
        """The newest output of one service (``MachineExtensions.ServiceLogs``)."""
        request = ext_pb.ServiceLogsRequest(workspace_id=workspace_id, name=name, tail_bytes=tail_bytes)
        reply: ext_pb.ServiceLogsResponse = await self._services_rpc("ServiceLogs", request)
        return reply.data

    async def _services_rpc(self, rpc: str, request: Any) -> Any:
        async with self._session() as s:
            try:
                return await getattr(s.extensions, rpc)(request, timeout=self.operation_timeout)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED and not runtime_errors_in(exc):
                    raise UnsupportedError(
                        f"driver {self.name!r} does not supervise services (its plugin predates {rpc})"
                    ) from None
                raise await self._translate(exc, rpc, s.conn) from None


_MADE_UP_DETAILS = "Internal error from Core"


def _exec_event(frame: Any) -> ExecEvent | None:
    """The event of an Exec frame as ``decode_server`` gave it (an output chunk decoded already, or a message)."""
    if type(frame) is ExecOutput:
        return frame
    return _convert.exec_event_from_pb(frame)


def _widen_pipes(stdio: tuple[int, int, int]) -> None:
    """Before copying over wide frames: a pipe among stdin and stdout gets a buffer of ``MAX_WIDE_CHUNK`` bytes
    (best effort, Linux; the kernel caps it at fs.pipe-max-size), so each read and write moves a wide chunk
    rather than the 64 KiB a default pipe holds. Nothing else about the pipe changes."""
    from vz_core.platform.files import PIPE_RESIZABLE, get_pipe_size, set_pipe_size

    if not PIPE_RESIZABLE:
        return
    for fd in stdio[:2]:
        with contextlib.suppress(OSError):
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and (get_pipe_size(fd) or MAX_WIDE_CHUNK) < MAX_WIDE_CHUNK:
                set_pipe_size(fd, MAX_WIDE_CHUNK)


def _made_up(err: grpc.RpcError) -> bool:
    """Whether a status was made up by grpcio's client after one of its own writes failed (no server status)."""
    return (
        err.code() == grpc.StatusCode.INTERNAL
        and (err.details() or "") == _MADE_UP_DETAILS
        and not runtime_errors_in(err)
    )


def _settled(coro: Any) -> Any:
    """The result of a coroutine that finishes without waiting (a finished call's status accessors)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the call's status is not settled yet")


class _StatusLog:
    """Every status grpcio sets on an exec call, in order: the server's survives grpcio's made-up one.

    grpcio's asyncio client sets INTERNAL "Internal error from Core" when one of its writes fails because the
    server already ended the call (grpc/grpc#36066, still open for grpcio 1.85), replacing the status the
    server sent if that came first. Servers that end the call right after the exit frame or on an early error
    without waiting for the client's half-close (go-plugin plugins do) trigger it; vz plugins drain instead.
    Done callbacks run on every status change, so each status is recorded as it is set; when the made-up one
    came first, the server's follows once the remaining frames are read.
    """

    def __init__(self, call: Any) -> None:
        self._seen: list[_StatusError] = []
        self._changed = asyncio.Event()
        call.add_done_callback(self._record)

    def _record(self, call: Any) -> None:
        try:
            status = _StatusError(
                _settled(call.code()), _settled(call.details()) or "", _settled(call.trailing_metadata())
            )
        except Exception:  # not settled: nothing to record
            return
        self._seen.append(status)
        self._changed.set()

    async def peer_status(self, seconds: float) -> _StatusError | None:
        """The first status grpcio did not make up, waiting up to ``seconds`` for it; None if none came."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            for status in self._seen:
                if not _made_up(status):
                    return status
            left = deadline - loop.time()
            if left <= 0:
                return None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)


class _StatusError(grpc.RpcError):
    """A finished call's non-OK status, shaped like the error ``error_from_rpc`` reads."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Any) -> None:
        super().__init__(details)
        self._code = code
        self._details = details
        self._trailing = trailing

    @classmethod
    async def of(cls, call: Any) -> _StatusError:
        return cls(await call.code(), await call.details() or "", await call.trailing_metadata())

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailing


class _ExecPump:
    """The one sender of an exec call: start, stdin in ≤ MAX_CHUNK frames, close_stdin, half-close.

    ``stop()`` ends sending early (the exit arrived, the call ended, or the plugin asked for it in its response
    headers, ``STOP_INPUT_KEY``): at the next write boundary the pump half-closes without ``close_stdin``. It
    is never cancelled inside ``call.write()``: grpcio cancels the whole call when a pending write is
    cancelled. Waiting for the caller's next stdin chunk is interrupted at once.
    """

    def __init__(self, call: Any, start: Any, stdin: AsyncIterator[Any], frames: _Frames) -> None:
        self._call = call
        self._stopping = False
        self._pulling = False
        self._interrupted = False
        self._frames = frames
        loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] = loop.create_task(self._run(start, stdin))
        self._headers: asyncio.Task[Any] = loop.create_task(call.initial_metadata())
        self._headers.add_done_callback(self._on_headers)

    def _on_headers(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        headers = task.result() or ()
        for key, _ in headers:
            if key == STOP_INPUT_KEY:
                self.stop()
        self._frames.widen(wide_chunk(headers))

    async def agreed(self) -> int:
        """The frame size the plugin agreed on in its response headers (``MAX_CHUNK`` when it did not). Output
        frames follow the headers, so once a frame arrived this does not wait."""
        headers = self._headers
        if not headers.done():
            await asyncio.wait((headers,))
        if headers.cancelled() or headers.exception() is not None:
            return MAX_CHUNK
        return wide_chunk(headers.result())

    def stop(self) -> None:
        """Send nothing more; half-close at the next write boundary."""
        if self._stopping:
            return
        self._stopping = True
        if self._pulling and not self._task.done():
            self._interrupted = True
            self._task.cancel()

    def failure(self) -> BaseException | None:
        """The exception of the caller's stdin iterator, if it failed."""
        task = self._task
        if task.done() and not task.cancelled():
            return task.exception()
        return None

    async def _run(self, start: Any, stdin: AsyncIterator[Any]) -> None:
        call = self._call
        frames = self._frames
        try:
            await call.write(start)
            chunks = stdin.__aiter__()
            while not self._stopping:
                self._pulling = True
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except asyncio.CancelledError:
                    if not self._interrupted:
                        raise
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
                    break
                except BaseException:
                    # The caller's stdin failed: cancel the call (the plugin kills the command); the receive
                    # loop reports this exception.
                    call.cancel()
                    raise
                finally:
                    self._pulling = False
                try:
                    messages = frames.encode(chunk)
                except BaseException:
                    call.cancel()  # a local rule violation: the receive loop reports it
                    raise
                for message in messages:
                    if self._stopping:
                        break
                    await call.write(message)
            if not self._stopping and (close := frames.close()) is not None:
                await call.write(close)
            await call.done_writing()
        except (grpc.RpcError, grpc.aio.BaseError, asyncio.InvalidStateError):
            # The call ended (the command exited early, or it failed): the receive loop reports the outcome.
            return

    async def close(self) -> None:
        """Stop sending and wait for the pump (the call is over, or was cancelled)."""
        self.stop()
        if not self._task.done():
            done, _ = await asyncio.wait((self._task,), timeout=_PUMP_WAIT)
            if not done:
                self._task.cancel()  # a write on a finished call that does not return: nothing left to protect
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        if not self._headers.done():
            self._headers.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._headers


class _Frames:
    """How a pump turns its caller's input into frames (``encode``) and the final close_stdin (``close``)."""

    def widen(self, limit: int) -> None:
        """The plugin agreed on frames of up to ``limit`` bytes (``WIDE_CHUNK_KEY``); only exec stdin uses it."""

    def encode(self, item: Any) -> list[Any]:
        raise NotImplementedError

    def close(self) -> Any | None:
        raise NotImplementedError


class _ExecFrames(_Frames):
    """Exec: stdin chunks in frames of at most MAX_CHUNK bytes (wider once the plugin agreed), then one
    close_stdin."""

    def __init__(self) -> None:
        self._limit = MAX_CHUNK

    def widen(self, limit: int) -> None:
        self._limit = limit

    def encode(self, item: bytes) -> list[Any]:
        n = self._limit
        if len(item) <= n:
            return [encode_stdin(item)]
        return [encode_stdin(item[i : i + n]) for i in range(0, len(item), n)]

    def close(self) -> Any | None:
        return pb.ExecClientMessage(close_stdin=pb.CloseStdin())


class _TerminalFrames(_Frames):
    """Terminal: data in frames of at most MAX_CHUNK bytes, resizes, one close_stdin (sent at the first eof,
    or when the input ends without one). Data after the eof and bad sizes are refused locally."""

    def __init__(self) -> None:
        self._closed = False

    def encode(self, item: TerminalInput) -> list[Any]:
        if isinstance(item, TerminalData):
            if self._closed and item.data:
                raise InvalidArgumentError("terminal input: data after the end of input (TerminalEof)")
            data = item.data
            return [ext_pb.PtyClientMessage(stdin=data[i : i + MAX_CHUNK]) for i in range(0, len(data), MAX_CHUNK)]
        if isinstance(item, TerminalResize):
            if (problem := resize_problem(item.rows, item.cols)) is not None:
                raise InvalidArgumentError(f"terminal input: {problem}")
            return [_convert.terminal_input_to_pb(item)]
        if isinstance(item, TerminalEof):
            if self._closed:
                return []
            self._closed = True
            return [ext_pb.PtyClientMessage(close_stdin=ext_pb.PtyCloseStdin())]
        raise InvalidArgumentError(f"terminal input: {type(item).__name__} is not a TerminalInput")

    def close(self) -> Any | None:
        if self._closed:
            return None
        self._closed = True
        return ext_pb.PtyClientMessage(close_stdin=ext_pb.PtyCloseStdin())


StatusLog = _StatusLog
"""Public name of ``_StatusLog``: for clients that drive an Exec call themselves (the conformance suite)."""
is_made_up = _made_up
"""Public name of ``_made_up``: whether a status was made up by grpcio's client (grpc/grpc#36066)."""
