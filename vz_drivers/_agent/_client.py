"""Host side of the guest agent protocol, on asyncio streams.

One ``AgentClient`` owns one connection (a Unix socket, or the single byte stream of a virtio-serial port) to
one ``vz-agent``. A single reader task demultiplexes frames into per-stream queues; any number of execs run
concurrently on one client. Memory is bounded by credit: the client grants output credit only as the
consumer pulls chunks, so a paused consumer stops the agent reading the command's pipes and the command
blocks. All failures of the connection surface as ``vz_core.errors.UnavailableError``.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import hashlib
import hmac
import json
import os
import secrets
import socket
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Final, Literal

from vz_core import (
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecSpec,
    TerminalData,
    TerminalEvent,
    TerminalInput,
    TerminalOutput,
    TerminalResize,
    TerminalSpec,
)
from vz_core.errors import (
    CATEGORY_TABLE,
    DriverError,
    FailedPreconditionError,
    IncompatibleVersionError,
    InvalidArgumentError,
    UnavailableError,
    UnknownRuntimeError,
    UnsupportedError,
)

if sys.platform != "win32":
    from vz_core.platform.files import long_socket_path, open_directory
from vz_core.rpc import exec_output_limit
from vz_core.services import ServiceSpec, ServiceState, spec_to_wire, state_from_wire
from vz_drivers._agent import _protocol as p

__all__ = ["AgentClient", "AgentIdentityError", "AgentInfo", "AgentStatus", "identity_proof"]

_HELLO_RESEND: Final = 1.0  # seconds between HELLO retries on a single-stream transport
_KILL_CONFIRM: Final = 5.0  # how long a cancelled exec waits for the agent to confirm the kill
_ERROR_BY_CODE: Final = {cls.category.name: cls for cls in CATEGORY_TABLE}
_SUN_PATH_MAX: Final = 107
_READ_SIZE: Final = 1 << 20
_WIDE_SOCKET_BUFFER: Final = 2 << 20
_WHOLE_READ: Final = 1 << 16  # a frame at least this large still incomplete is read on its own (no re-joining)
_IDENTITY_LABEL: Final = b"vz-agent identity v1\n"


class AgentIdentityError(FailedPreconditionError):
    """The process answering on a Machine's agent channel could not prove it is the agent the host started (it
    does not hold that boot's identity key): something in the Machine replaced it. The Machine is not to be
    trusted any more; the driver stops it by the kernel's means."""


def identity_proof(key: bytes, challenge: str) -> str:
    """What an agent holding ``key`` answers to ``challenge`` (HMAC-SHA256, hex; see docs/agent-protocol.md)."""
    return hmac.new(key, _IDENTITY_LABEL + challenge.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class AgentInfo:
    """What the agent reported in its HELLO reply."""

    protocol_version: int
    agent_version: str
    pid: int
    nproc: int
    mem_total: int
    """MemTotal of the agent's kernel, in bytes."""
    arch: str
    """GOARCH of the agent binary ("amd64", "arm64")."""
    kernel: str
    hostname: str
    root: str
    """The directory execs are chrooted into by default ("" = none)."""
    init: bool
    """The agent supervises a main process (``--init``)."""
    main_pid: int
    mode: str
    """"unix" (one session per socket connection) or "stream" (single byte stream)."""
    features: tuple[str, ...] = ()
    max_data: int = p.MAX_DATA
    """The largest data frame agreed in the handshake (HELLO ``max_data``; ``MAX_DATA`` with older agents)."""
    raw: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), repr=False)


@dataclass(frozen=True)
class AgentStatus:
    """Answer to STATUS: the main process and the agent's load."""

    main_pid: int
    """0 when the agent runs no main process."""
    main_running: bool
    main_exit: ExecExit | None
    """How the main process ended; ``None`` while it runs or when there is none."""
    execs: int
    """Running execs over all connections."""
    sessions: int


def _states(payload: bytes) -> tuple[ServiceState, ...]:
    try:
        doc = json.loads(payload)
        return tuple(state_from_wire(item) for item in doc.get("services", ()))
    except (ValueError, TypeError, AttributeError) as exc:
        raise UnknownRuntimeError(f"the guest agent sent malformed service states: {exc}") from None


class _Stream:
    """Host-side state of one exec or logs stream."""

    __slots__ = (
        "credit_event",
        "finished",
        "grant_threshold",
        "id",
        "pid",
        "queue",
        "stdin_credit",
        "terminal",
        "ungranted",
    )

    def __init__(self, stream_id: int) -> None:
        self.id = stream_id
        self.queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.stdin_credit = p.DEFAULT_WINDOW
        self.credit_event = asyncio.Event()
        self.terminal = asyncio.Event()
        self.ungranted = [0, 0, 0]
        self.finished = False
        self.pid = 0
        self.grant_threshold = 0  # 0: the client's own


def _error_from_payload(payload: bytes) -> DriverError:
    try:
        doc = json.loads(payload)
        code = str(doc.get("code", "UNKNOWN"))
        message = str(doc.get("message", "")) or "the guest agent reported an error without a message"
    except (ValueError, AttributeError):
        return UnknownRuntimeError("the guest agent sent a malformed ERROR frame")
    return _ERROR_BY_CODE.get(code, UnknownRuntimeError)(message)


class _ProtocolError(Exception):
    pass


def _check_identity(doc: dict[str, Any], key: bytes, challenge: str) -> None:
    proof = doc.get("proof")
    if not isinstance(proof, str) or not proof:
        reason = "it answered the challenge with no proof (it does not hold this boot's identity key)"
    elif not hmac.compare_digest(proof.encode(), identity_proof(key, challenge).encode()):
        reason = "its proof does not match this boot's identity key"
    else:
        return
    raise AgentIdentityError(
        f"the Machine's agent failed its identity check: {reason}; something in the Machine replaced its agent, "
        "recreate the Machine",
        details={"agent_identity": "failed"},
    )


if sys.platform == "win32":

    async def _open_unix(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        raise OSError(
            errno.EAFNOSUPPORT, "Windows hosts have no Unix sockets (hyperv's agent is reached over AF_HYPERV)"
        )

else:

    async def _open_unix(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if len(os.fsencode(path)) <= _SUN_PATH_MAX:
            return await asyncio.open_unix_connection(path)
        # sun_path holds 108 bytes: reach a deeper socket through a descriptor of its directory.
        directory, name = os.path.split(path)
        dirfd = open_directory(directory or ".")
        try:
            return await asyncio.open_unix_connection(long_socket_path(dirfd, name))
        finally:
            os.close(dirfd)


def _close_streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()
    # Separate read and write pipes (a character device opened twice) have a transport each.
    read_transport = getattr(reader, "_transport", None)
    if isinstance(read_transport, asyncio.BaseTransport) and read_transport is not writer.transport:
        read_transport.close()


class _FrameReader(asyncio.BufferedProtocol):
    """The read side of a socket connection once the handshake is done: frames cut out where the kernel put the
    bytes, with no reader task and no StreamReader buffer in between.

    ``recv_into`` fills a scratch buffer, from which every complete frame is dispatched at once (headers and
    small frames, many per read); the payload of a large frame (``_WHOLE_READ`` or more) is received straight
    into a buffer of its own size. Each payload is copied once, into the bytes handed on. Flow control is the
    protocol's credit: the agent sends no more than was granted, so reading never pauses. The transport's
    other events go on to the stream protocol it had (the writer's drain and close still work).
    """

    _SCRATCH = 1 << 18

    def __init__(
        self, client: AgentClient, transport: asyncio.Transport, previous: asyncio.BaseProtocol, leftover: bytes
    ) -> None:
        self._client = client
        self._transport = transport
        self._previous = previous
        self._scratch = bytearray(max(self._SCRATCH, len(leftover) + p.HEADER_SIZE))
        self._view = memoryview(self._scratch)
        self._have = len(leftover)
        self._scratch[: self._have] = leftover
        self._frame: bytearray | None = None
        self._frame_head = (0, 0)
        self._filled = 0
        self._broken = False

    @classmethod
    def attach(cls, client: AgentClient, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Take over reading ``writer``'s socket transport from ``reader`` (what it has buffered included);
        False when the transport is not a plain socket one (pipes, character devices keep the reader task)."""
        transport = writer.transport
        buffered = getattr(reader, "_buffer", None)
        if (
            getattr(reader, "_transport", None) is not transport
            or not isinstance(transport, asyncio.Transport)
            or transport.get_extra_info("socket") is None
            or not isinstance(buffered, bytearray)
            or reader.at_eof()
            or reader.exception() is not None
        ):
            return False
        leftover = bytes(buffered)
        buffered.clear()
        protocol = cls(client, transport, transport.get_protocol(), leftover)
        transport.set_protocol(protocol)
        transport.resume_reading()  # the StreamReader may have paused it; credit bounds what comes
        if leftover:
            protocol._parse()
        return True

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._filled :]
        return self._view[self._have :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._broken:
            return
        if self._frame is not None:
            self._filled += nbytes
            if self._filled < len(self._frame):
                return
            frame, self._frame = self._frame, None
            type_, stream = self._frame_head
            self._dispatch(type_, stream, bytes(frame))
            return
        self._have += nbytes
        self._parse()

    def _parse(self) -> None:
        scratch, view, have = self._scratch, self._view, self._have
        unpack = p.HEADER.unpack_from
        size = p.HEADER_SIZE
        offset = 0
        while have - offset >= size and not self._broken:
            magic, type_, _flags, stream, length = unpack(scratch, offset)
            start = offset + size
            if magic != p.MAGIC or length > p.MAX_CONTROL:
                self._fail(f"the guest agent broke the protocol: bad frame header {scratch[offset:start].hex()}")
                return
            if have - start >= length:
                offset = start + length
                self._dispatch(type_, stream, bytes(view[start:offset]) if length else b"")
                continue
            if length >= _WHOLE_READ or length > len(scratch) - size:
                # A large frame: its payload goes straight into a buffer of its own.
                frame = bytearray(length)
                part = have - start
                frame[:part] = view[start:have]
                self._frame, self._frame_head, self._filled = frame, (type_, stream), part
                offset = have
            break
        rest = have - offset
        if rest and offset:
            scratch[:rest] = bytes(view[offset:have])  # an incomplete small frame: to the front
        self._have = rest

    def _dispatch(self, type_: int, stream: int, payload: bytes) -> None:
        try:
            self._client._dispatch(type_, stream, payload)
        except _ProtocolError as exc:
            self._fail(f"the guest agent broke the protocol: {exc}")

    def _fail(self, reason: str) -> None:
        self._broken = True
        self._client._lose(reason)
        self._transport.pause_reading()

    def eof_received(self) -> bool | None:
        if not self._broken:
            reason = "the guest agent closed the connection"
            if self._have or self._frame is not None:
                reason += " in the middle of a frame"
            self._client._lose(reason)
        return self._previous.eof_received()  # type: ignore[attr-defined, no-any-return]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._broken:
            failed = f"the guest agent connection failed: {exc}"
            self._client._lose(failed if exc is not None else "the guest agent closed the connection")
        self._previous.connection_lost(exc)

    def pause_writing(self) -> None:
        self._previous.pause_writing()

    def resume_writing(self) -> None:
        self._previous.resume_writing()


class AgentClient:
    """A connection to one guest agent. Create it with ``connect_unix`` or ``from_streams``.

    The client owns the streams it was given and closes them in ``close()`` (also on ``async with`` exit).
    Every method raises ``UnavailableError`` once the connection is lost; execs in flight end with it too.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        stream_mode: bool,
        window: int = p.OUTPUT_WINDOW,
    ) -> None:
        """Wrap a stream pair without talking to the agent; use the factories instead."""
        if not p.MAX_DATA <= window < 1 << 31:
            raise ValueError(f"window must be between {p.MAX_DATA} and 2**31-1 bytes, got {window}")
        self._reader = reader
        self._writer = writer
        self._stream_mode = stream_mode
        self._window = window
        self._grant_threshold = max(window // 4, 1)
        self._streams: dict[int, _Stream] = {}
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._next_id = 0
        self._lost: str | None = None
        self._info: AgentInfo | None = None
        self._max_data = p.MAX_DATA
        self._reader_task: asyncio.Task[None] | None = None
        self._closing = False

    # ------------------------------------------------------------------ construction

    @classmethod
    async def connect_unix(
        cls,
        path: str | os.PathLike[str],
        timeout: float | None = 10.0,  # noqa: ASYNC109 - bounds connect + handshake, which run as one step
        *,
        window: int = p.OUTPUT_WINDOW,
        identity_key: bytes | None = None,
    ) -> AgentClient:
        """Connect to ``vz-agent serve --listen unix:PATH`` and complete the handshake within ``timeout``.

        Raises ``UnavailableError`` when nothing listens there or the agent does not answer in time, and
        ``IncompatibleVersionError`` when it speaks no protocol version this client knows.
        """
        spath = os.fspath(path)
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await _open_unix(spath)
        except TimeoutError:
            raise UnavailableError(f"connecting to the guest agent at {spath} timed out after {timeout} s") from None
        except OSError as exc:
            raise UnavailableError(
                f"cannot connect to the guest agent at {spath}: {exc.strerror or exc}; is the Machine running?"
            ) from None
        return await cls.from_streams(
            reader, writer, wait_ready=False, timeout=timeout, window=window, identity_key=identity_key
        )

    @classmethod
    async def from_streams(
        cls,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        wait_ready: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - bounds the handshake only, not the client's life
        window: int = p.OUTPUT_WINDOW,
        identity_key: bytes | None = None,
        hand_over_key: bool = False,
    ) -> AgentClient:
        """Run the handshake over an already open stream pair and return a ready client.

        ``wait_ready=True`` is for single-stream transports (virtio-serial, ``--fd``): the agent may still be
        booting and stale bytes of an earlier session may precede its answer. The client then re-sends its
        HELLO every second, skips READY frames and garbage, and accepts only the reply carrying its own nonce.
        Without it, the first frame must be the HELLO reply. ``timeout`` bounds the whole handshake
        (``None`` = wait as long as the caller does). On failure the streams are closed.

        ``identity_key`` is the key the host gave this boot of the agent: the HELLO then carries a fresh challenge
        and the agent must answer it with the key's proof, else ``AgentIdentityError`` (the process on the
        channel is not the agent the host started). ``hand_over_key`` also sends the key in that HELLO, for an agent
        started with ``--key-from-host`` on a channel only the host writes to (a VM's virtio-serial port, at boot):
        the agent keeps the first key it is given.
        """
        client = cls(reader, writer, stream_mode=wait_ready, window=window)
        try:
            await client._handshake(timeout, identity_key, hand_over_key)
        except BaseException:
            _close_streams(reader, writer)
            raise
        if client.info.max_data > p.MAX_DATA:
            sock = writer.get_extra_info("socket")
            if sys.platform != "win32" and sock is not None and sock.family == socket.AF_UNIX:
                with contextlib.suppress(OSError):  # best effort: a few wide frames in flight per send
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _WIDE_SOCKET_BUFFER)
        if not _FrameReader.attach(client, reader, writer):
            client._reader_task = asyncio.get_running_loop().create_task(client._read_loop(), name="vz-agent-reader")
        return client

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ public API

    @property
    def info(self) -> AgentInfo:
        """The facts of the HELLO reply."""
        assert self._info is not None
        return self._info

    @property
    def closed(self) -> bool:
        """True once the connection is lost or closed."""
        return self._lost is not None

    async def hello(self) -> AgentInfo:
        """The agent's facts (from the handshake; the connection is checked to be alive)."""
        self._check_open()
        return self.info

    async def ping(self) -> float:
        """Round trip to the agent; returns the time it took in seconds. Bound it with ``asyncio.timeout``."""
        started = time.perf_counter()
        await self._request(p.T_PING, b"")
        return time.perf_counter() - started

    async def status(self) -> AgentStatus:
        """The main process's state and how many execs run."""
        doc = json.loads(await self._request(p.T_STATUS, b""))
        main_exit = None
        if doc.get("main_exited"):
            main_exit = ExecExit(int(doc.get("main_exit_code", 0)), str(doc.get("main_signal", "")))
        return AgentStatus(
            main_pid=int(doc.get("main_pid", 0)),
            main_running=bool(doc.get("main_running", False)),
            main_exit=main_exit,
            execs=int(doc.get("execs", 0)),
            sessions=int(doc.get("sessions", 0)),
        )

    async def set_services(self, specs: Sequence[ServiceSpec]) -> tuple[ServiceState, ...]:
        """Make ``specs`` the Machine's whole service set (SERVICES) and return the states right after.

        Unchanged services keep running; changed ones are restarted; ones not in ``specs`` are stopped (SIGTERM,
        SIGKILL after their stop timeout). A bad set (a cycle, an unknown dependency, a user or working directory
        the Machine does not have) is ``InvalidArgumentError`` and changes nothing.
        """
        self._check_services()
        payload = json.dumps({"services": [spec_to_wire(s) for s in specs]}).encode()
        return _states(await self._request(p.T_SERVICES, payload))

    async def service_states(self) -> tuple[ServiceState, ...]:
        """The state of every service of the set, in start order."""
        self._check_services()
        return _states(await self._request(p.T_SERVICE_STATES, b""))

    async def service_logs(self, name: str, *, tail_bytes: int = 0) -> bytes:
        """The newest output (stdout and stderr, interleaved) of service ``name``; at most ``tail_bytes``
        (0: as much as one reply carries, about 1 MiB). An unknown name is ``InvalidArgumentError``."""
        self._check_services()
        payload = json.dumps({"name": name, "tail_bytes": tail_bytes}).encode()
        return await self._request(p.T_SERVICE_LOGS, payload)

    def _check_services(self) -> None:
        self._check_open()
        if "services" not in self.info.features:
            raise UnsupportedError(
                f"this guest agent ({self.info.agent_version}) does not supervise services; "
                "recreate the Machine so it runs the current agent"
            )

    async def shutdown(self, *, grace: float = 10.0) -> None:
        """Stop everything in the Machine and end the agent; then close this client.

        The agent sends SIGTERM to the main process, waits up to ``grace`` seconds, kills every remaining
        process, syncs, and exits. When it runs as PID 1 (a VM's init) it also unmounts the filesystems and
        powers the machine off. Returns once the agent acknowledged (or the connection ended because it did);
        bound the wait with ``asyncio.timeout``.
        """
        payload = json.dumps({"grace_ms": int(grace * 1000)}).encode()
        try:
            await self._request(p.T_SHUTDOWN, payload, lost_ok=True)
        finally:
            await self.close()

    async def exec(
        self,
        spec: ExecSpec,
        stdin: AsyncIterator[bytes],
        *,
        root_override: str | None = None,
        chunk: int | None = None,
    ) -> AsyncGenerator[ExecEvent, None]:
        """Run ``spec.argv`` through the agent; ``vz_core.Driver.exec`` semantics exactly.

        Yields ``ExecOutput`` chunks of 1..``chunk`` bytes (stdout and stderr separate) and then exactly one
        ``ExecExit``. ``chunk`` defaults to ``vz_core.rpc.exec_output_limit`` (32768 unless the consumer of this
        exec, a vz plugin talking to a vz host, takes wider chunks); above 32768 and with an agent that agreed on
        wide frames, the agent sends output frames of up to that size and gets a larger stdin credit.
        ``stdin`` is consumed by a task of its own; the command may exit before it ends.
        ``spec.workspace_id`` is not used here. ``root_override`` chroots this exec into another directory of
        the agent's filesystem ("/" = no chroot) instead of the agent's ``--root``.

        Raises ``InvalidArgumentError`` (empty argv, unknown user, missing workdir), ``UnsupportedError``
        (tty), ``UnavailableError`` (connection lost), or the error the agent reported for the setup.
        Closing the generator (or cancelling its task) before the exit kills the command and all its
        descendants and waits briefly for the agent to confirm.
        """
        if not spec.argv:
            raise InvalidArgumentError("exec needs a non-empty argv")
        if spec.tty:
            raise UnsupportedError("the guest agent does not run tty execs")
        request: dict[str, Any] = {
            "argv": list(spec.argv),
            "env": dict(spec.environment),
            "user": spec.user,
            "workdir": spec.workdir,
            "window": self._window,
        }
        if root_override is not None:
            request["root"] = root_override
        # Events of at most ``limit`` bytes; the agent's frames as wide as agreed (cut here when wider: one frame
        # and one wakeup per MiB rather than 32, whatever the consumer takes).
        limit = max(p.MAX_DATA, min(exec_output_limit.get() if chunk is None else chunk, self.info.max_data))
        wide = self.info.max_data > p.MAX_DATA
        if wide:
            request["max_data"] = self.info.max_data
            request["stdin_window"] = p.WIDE_STDIN_WINDOW
            if limit > p.MAX_DATA:  # a consumer of wide chunks: a larger output credit too
                request["window"] = max(self._window, p.WIDE_OUTPUT_WINDOW)
        payload = json.dumps(request).encode()
        st = self._open_stream()
        if wide:
            st.stdin_credit = p.WIDE_STDIN_WINDOW
            if limit > p.MAX_DATA:
                st.grant_threshold = max(self._grant_threshold, p.WIDE_OUTPUT_WINDOW // 4)
        try:
            self._write(p.frame(p.T_EXEC_START, st.id, payload))
        except BaseException:
            self._streams.pop(st.id, None)
            raise
        pump = asyncio.get_running_loop().create_task(self._pump_stdin(st, stdin), name=f"vz-agent-stdin-{st.id}")
        try:
            while True:
                item = await st.queue.get()
                kind = item[0]
                if kind == "out":
                    channel: int = item[1]
                    data: bytes = item[2]
                    name: Literal["stdout", "stderr"] = "stdout" if channel == p.CH_STDOUT else "stderr"
                    if len(data) <= limit:
                        self._consumed(st, channel, len(data))
                        yield ExecOutput(name, data)
                        continue
                    view = memoryview(data)
                    for start in range(0, len(view), limit):
                        piece = bytes(view[start : start + limit])
                        self._consumed(st, channel, len(piece))  # credit as the consumer takes each piece
                        yield ExecOutput(name, piece)
                elif kind == "exit":
                    await self._stop_task(pump)
                    self._streams.pop(st.id, None)
                    yield ExecExit(item[1], item[2])
                    return
                else:  # "error", "lost" or "stdin_failed"
                    raise item[1]
        finally:
            await self._stop_task(pump)
            await self._end_stream(st)

    async def exec_fds(
        self, spec: ExecSpec, stdio: tuple[int, int, int], *, root_override: str | None = None
    ) -> ExecExit:
        """Run ``spec.argv`` through the agent with the three descriptors ``stdio`` as its stdin, stdout, stderr.

        The descriptors are passed to the agent (SCM_RIGHTS on this Unix socket connection) and become the
        command's own: the agent copies nothing and neither does this client. They stay open here (the
        caller's). Returns the command's exit. Raises ``UnsupportedError`` when the agent predates EXEC_FDS or
        the connection is not a Unix socket, ``InvalidArgumentError`` for a terminal descriptor (refused here
        and by the agent) and the errors of ``exec``. Cancelling the call kills the command and all its
        descendants (KILL) and waits briefly for the agent to confirm.
        """
        if not spec.argv:
            raise InvalidArgumentError("exec needs a non-empty argv")
        if spec.tty:
            raise UnsupportedError("the guest agent does not run tty execs")
        if "exec_fds" not in self.info.features:
            raise UnsupportedError(
                "this Machine's guest agent cannot take descriptors (it predates EXEC_FDS); recreate the Machine "
                "(`vz up --recreate`) to update its agent"
            )
        raw = self._writer.get_extra_info("socket")
        if sys.platform == "win32" or raw is None or raw.family != socket.AF_UNIX or self._stream_mode:
            raise UnsupportedError("descriptors can only be passed to the guest agent over a Unix socket")
        for name, fd in zip(("stdin", "stdout", "stderr"), stdio, strict=True):
            if os.isatty(fd):
                raise InvalidArgumentError(
                    f"the {name} descriptor is a terminal; a terminal is never passed into a Machine"
                )
        request: dict[str, Any] = {
            "argv": list(spec.argv),
            "env": dict(spec.environment),
            "user": spec.user,
            "workdir": spec.workdir,
            "fds": 3,
        }
        if root_override is not None:
            request["root"] = root_override
        st = self._open_stream()
        try:
            data = p.frame(p.T_EXEC_FDS, st.id, json.dumps(request).encode())
            await self._send_with_fds(raw.fileno(), data, stdio)
        except BaseException:
            self._streams.pop(st.id, None)
            raise
        try:
            item = await st.queue.get()
            if item[0] == "exit":
                self._streams.pop(st.id, None)
                return ExecExit(item[1], item[2])
            raise item[1]
        finally:
            await self._end_stream(st)

    if sys.platform != "win32":  # SCM_RIGHTS over the Unix socket

        async def _send_with_fds(self, fileno: int, data: bytes, fds: tuple[int, int, int]) -> None:
            """Send ``data`` with ``fds`` riding on its first byte, in order with every other frame of the stream."""
            transport = self._writer.transport
            while transport.get_write_buffer_size() > 0:
                # Earlier frames still queued in the transport must go first; wait until it is empty.
                self._check_open()
                await asyncio.sleep(0.001)
            self._check_open()
            sock = socket.socket(fileno=os.dup(fileno))
            try:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
                while True:
                    try:
                        sent = sock.sendmsg([data], rights, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
                        break
                    except BlockingIOError:
                        await asyncio.sleep(0.001)
                    except OSError as exc:
                        raise UnavailableError(f"the guest agent connection failed: {exc.strerror or exc}") from None
            finally:
                sock.close()
            if sent < len(data):
                self._writer.write(data[sent:])  # the descriptors went with the first part; the rest is ordinary data

    async def terminal(
        self, spec: TerminalSpec, input: AsyncIterator[TerminalInput], *, root_override: str | None = None
    ) -> AsyncGenerator[TerminalEvent, None]:
        """Run ``spec.argv`` on a new pseudo-terminal through the agent; ``vz_core.Driver.terminal`` semantics.

        The agent allocates the terminal inside the Machine, sized ``spec.rows`` x ``spec.cols``, with
        ``TERM=spec.term``, and starts the command as the leader of a new session it controls. ``input``'s
        ``TerminalData`` goes out as STDIN frames (within the stream's credit), ``TerminalResize`` as RESIZE,
        ``TerminalEof`` as STDIN_CLOSE (the terminal stays open). Yields ``TerminalOutput`` chunks then exactly
        one ``ExecExit``. ``UnsupportedError`` when the agent predates terminal sessions (no "pty" feature).
        Closing the generator before the exit kills everything in the session.
        """
        if not spec.argv:
            raise InvalidArgumentError("a terminal session needs a non-empty argv")
        if "pty" not in self.info.features:
            raise UnsupportedError(
                "this Machine's guest agent has no terminal sessions (it predates them); recreate the Machine "
                "(vz up --recreate) to get an agent that has"
            )
        request: dict[str, Any] = {
            "argv": list(spec.argv),
            "env": {**spec.environment, "TERM": spec.term},
            "user": spec.user,
            "workdir": spec.workdir,
            "window": self._window,
            "pty": {"rows": spec.rows, "cols": spec.cols},
        }
        if root_override is not None:
            request["root"] = root_override
        st = self._open_stream()
        try:
            self._write(p.frame(p.T_EXEC_START, st.id, json.dumps(request).encode()))
        except BaseException:
            self._streams.pop(st.id, None)
            raise
        pump = asyncio.get_running_loop().create_task(self._pump_terminal(st, input), name=f"vz-agent-pty-{st.id}")
        try:
            while True:
                item = await st.queue.get()
                kind = item[0]
                if kind == "out":
                    self._consumed(st, item[1], len(item[2]))
                    yield TerminalOutput(item[2])
                elif kind == "exit":
                    await self._stop_task(pump)
                    self._streams.pop(st.id, None)
                    yield ExecExit(item[1], item[2])
                    return
                else:  # "error", "lost" or "stdin_failed"
                    raise item[1]
        finally:
            await self._stop_task(pump)
            await self._end_stream(st)

    async def logs(self) -> AsyncGenerator[bytes, None]:
        """The main process's log (``--log``) as it is now: chunks of 1..32768 bytes, then the end.

        Raises ``UnsupportedError`` when the agent keeps no log.
        """
        st = self._open_stream()
        try:
            self._write(p.frame(p.T_LOGS, st.id, json.dumps({"window": self._window}).encode()))
            while True:
                item = await st.queue.get()
                if item[0] == "out":
                    self._consumed(st, item[1], len(item[2]))
                    yield item[2]
                elif item[0] == "exit":
                    self._streams.pop(st.id, None)
                    return
                else:
                    raise item[1]
        finally:
            await self._end_stream(st)

    async def close(self) -> None:
        """Close the connection (idempotent). Execs still running are killed by the agent."""
        if self._closing:
            return
        self._closing = True
        self._lose("the guest agent client was closed")
        task = self._reader_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        _close_streams(self._reader, self._writer)
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._lost is not None:
            raise UnavailableError(self._lost)

    def _write(self, data: bytes) -> None:
        self._check_open()
        self._writer.write(data)

    def _new_id(self) -> int:
        while True:
            self._next_id = self._next_id % 0xFFFFFFFF + 1
            if self._next_id not in self._streams and self._next_id not in self._pending:
                return self._next_id

    def _open_stream(self) -> _Stream:
        self._check_open()
        st = _Stream(self._new_id())
        self._streams[st.id] = st
        return st

    def _consumed(self, st: _Stream, channel: int, n: int) -> None:
        st.ungranted[channel] += n
        if (
            st.ungranted[channel] >= (st.grant_threshold or self._grant_threshold)
            and not st.finished
            and self._lost is None
        ):
            self._writer.write(p.frame(p.T_WINDOW, st.id, p.encode_window(channel, st.ungranted[channel])))
            st.ungranted[channel] = 0

    async def _request(self, type_: int, payload: bytes, *, lost_ok: bool = False) -> bytes:
        self._check_open()
        rid = self._new_id()
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._write(p.frame(type_, rid, payload))
            return await fut
        except UnavailableError:
            if lost_ok:
                return b""
            raise
        finally:
            self._pending.pop(rid, None)

    async def _stop_task(self, task: asyncio.Task[None]) -> None:
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved; the pump reports its failures through the stream queue

    async def _end_stream(self, st: _Stream) -> None:
        """Kill a stream that ended without EXIT/ERROR on our side, then forget it."""
        try:
            if not st.finished and self._lost is None:
                self._writer.write(p.frame(p.T_KILL, st.id))
                waiter = asyncio.ensure_future(st.terminal.wait())
                try:
                    await asyncio.wait([waiter], timeout=_KILL_CONFIRM)
                finally:
                    waiter.cancel()
        finally:
            self._streams.pop(st.id, None)

    async def _pump_stdin(self, st: _Stream, stdin: AsyncIterator[bytes]) -> None:
        try:
            async for chunk in stdin:
                if not await self._send_stdin(st, chunk):
                    return
            if not st.finished:
                self._write(p.frame(p.T_STDIN_CLOSE, st.id))
        except (UnavailableError, ConnectionError):
            return  # the reader task reports the lost connection to the stream
        except Exception as exc:
            if not st.finished:
                st.queue.put_nowait(("stdin_failed", exc))

    async def _send_stdin(self, st: _Stream, chunk: bytes) -> bool:
        """Send ``chunk`` as STDIN frames within the stream's credit; False once the stream is over."""
        view = memoryview(chunk)
        offset = 0
        while offset < len(view):
            while st.stdin_credit <= 0:
                if st.finished or self._lost is not None:
                    return False
                st.credit_event.clear()
                await st.credit_event.wait()
            if st.finished:
                return False
            n = min(len(view) - offset, self._max_data, st.stdin_credit)
            st.stdin_credit -= n
            header = p.HEADER.pack(p.MAGIC, p.T_STDIN, 0, st.id, n)
            if n > p.MAX_DATA:
                self._write(header)  # a wide frame: two writes rather than a copy of the data
                self._writer.write(view[offset : offset + n])
            else:
                self._write(b"".join((header, view[offset : offset + n])))
            offset += n
            await self._writer.drain()
        return not st.finished

    async def _pump_terminal(self, st: _Stream, keys: AsyncIterator[TerminalInput]) -> None:
        closed = False
        try:
            async for item in keys:
                if st.finished:
                    return
                if isinstance(item, TerminalData):
                    if not closed and not await self._send_stdin(st, item.data):
                        return
                elif isinstance(item, TerminalResize):
                    self._write(p.frame(p.T_RESIZE, st.id, p.encode_resize(item.rows, item.cols)))
                elif not closed:
                    closed = True
                    self._write(p.frame(p.T_STDIN_CLOSE, st.id))
        except (UnavailableError, ConnectionError):
            return  # the reader task reports the lost connection to the stream
        except Exception as exc:
            if not st.finished:
                st.queue.put_nowait(("stdin_failed", exc))

    async def _handshake(self, limit: float | None, identity_key: bytes | None = None, hand_over: bool = False) -> None:
        nonce = secrets.token_hex(8)
        offer: dict[str, Any] = {"versions": list(p.SUPPORTED_VERSIONS), "nonce": nonce, "max_data": p.MAX_WIDE_DATA}
        challenge = ""
        if identity_key is not None:
            challenge = offer["challenge"] = secrets.token_hex(32)
            if hand_over:
                offer["key"] = identity_key.hex()
        hello = p.frame(p.T_HELLO, 0, json.dumps(offer).encode())
        resend: asyncio.Task[None] | None = None
        try:
            self._writer.write(hello)
            if self._stream_mode:
                resend = asyncio.get_running_loop().create_task(self._resend_hello(hello))
            async with asyncio.timeout(limit):
                doc = await self._await_hello_reply(nonce)
        except TimeoutError:
            raise UnavailableError(f"the guest agent did not answer the handshake within {limit} s") from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise UnavailableError(f"the guest agent closed the connection during the handshake ({exc})") from None
        except _ProtocolError as exc:
            raise UnavailableError(f"the guest agent answered the handshake with garbage: {exc}") from None
        finally:
            if resend is not None:
                await self._stop_task(resend)
        version = int(doc.get("version", 0))
        if version not in p.SUPPORTED_VERSIONS:
            raise IncompatibleVersionError(
                f"the guest agent speaks protocol version {version}, this host speaks {list(p.SUPPORTED_VERSIONS)};"
                " rebuild or update the agent"
            )
        if identity_key is not None:
            _check_identity(doc, identity_key, challenge)
        try:
            agreed = int(doc.get("max_data", p.MAX_DATA))
        except (TypeError, ValueError):
            agreed = p.MAX_DATA
        # An agent that predates the field answers nothing: the protocol's 32 KiB frames.
        max_data = agreed if p.MAX_DATA <= agreed <= p.MAX_WIDE_DATA else p.MAX_DATA
        self._info = AgentInfo(
            protocol_version=version,
            agent_version=str(doc.get("agent_version", "")),
            pid=int(doc.get("pid", 0)),
            nproc=int(doc.get("nproc", 0)),
            mem_total=int(doc.get("mem_total", 0)),
            arch=str(doc.get("arch", "")),
            kernel=str(doc.get("kernel", "")),
            hostname=str(doc.get("hostname", "")),
            root=str(doc.get("root", "")),
            init=bool(doc.get("init", False)),
            main_pid=int(doc.get("main_pid", 0)),
            mode=str(doc.get("mode", "")),
            features=tuple(str(f) for f in doc.get("features", ())),
            max_data=max_data,
            raw=MappingProxyType(dict(doc)),
        )
        self._max_data = max_data

    async def _resend_hello(self, hello: bytes) -> None:
        while True:
            await asyncio.sleep(_HELLO_RESEND)
            self._writer.write(hello)

    async def _await_hello_reply(self, nonce: str) -> dict[str, Any]:
        reader = self._reader
        header = await reader.readexactly(p.HEADER_SIZE)
        while True:
            magic, type_, flags, stream, length = p.HEADER.unpack(header)
            if magic != p.MAGIC or flags != 0 or length > p.MAX_CONTROL:
                if not self._stream_mode:
                    raise _ProtocolError(f"bad frame header {header.hex()}")
                header = header[1:] + await reader.readexactly(1)  # resynchronise byte by byte
                continue
            payload = await reader.readexactly(length) if length else b""
            header = b""
            if type_ == p.T_HELLO_REPLY and stream == 0:
                try:
                    doc = json.loads(payload)
                except ValueError:
                    if not self._stream_mode:
                        raise _ProtocolError("the HELLO reply is not JSON") from None
                    doc = None
                if isinstance(doc, dict) and doc.get("nonce") == nonce:
                    return doc
            elif type_ == p.T_ERROR and stream == 0:
                raise _error_from_payload(payload)
            elif type_ != p.T_READY and not self._stream_mode:
                raise _ProtocolError(f"expected a HELLO reply, got {p.TYPE_NAMES.get(type_, type_)}")
            header = await reader.readexactly(p.HEADER_SIZE)

    async def _read_loop(self) -> None:
        reader = self._reader
        reason = "the guest agent connection was lost"
        unpack = p.HEADER.unpack_from
        size = p.HEADER_SIZE
        buf = b""
        try:
            # Read whatever arrived and cut all complete frames out of it: far fewer awaits than one
            # readexactly per header and payload.
            while True:
                chunk = await reader.read(_READ_SIZE)
                if not chunk:
                    reason = "the guest agent closed the connection"
                    return
                buf = buf + chunk if buf else chunk
                view = memoryview(buf)
                offset = 0
                end = len(buf)
                while end - offset >= size:
                    magic, type_, _flags, stream, length = unpack(view, offset)
                    if magic != p.MAGIC or length > p.MAX_CONTROL:
                        raise _ProtocolError(f"bad frame header {bytes(view[offset : offset + size]).hex()}")
                    if end - offset - size < length:
                        if length >= _WHOLE_READ:
                            # A wide frame not complete yet: read exactly its rest, join once.
                            head = bytes(view[offset + size : end])
                            view.release()
                            rest = await reader.readexactly(length - len(head))
                            self._dispatch(type_, stream, b"".join((head, rest)))
                            offset = end = 0
                            buf = b""
                        break
                    start = offset + size
                    offset = start + length
                    self._dispatch(type_, stream, bytes(view[start:offset]) if length else b"")
                view.release()
                buf = buf[offset:] if offset < end else b""
        except asyncio.IncompleteReadError:
            reason = "the guest agent closed the connection in the middle of a frame"
        except (ConnectionError, OSError) as exc:
            reason = f"the guest agent connection failed: {exc}"
        except _ProtocolError as exc:
            reason = f"the guest agent broke the protocol: {exc}"
        finally:
            self._lose(reason)

    def _dispatch(self, type_: int, stream: int, payload: bytes) -> None:
        if type_ == p.T_STDOUT or type_ == p.T_STDERR:
            st = self._streams.get(stream)
            if st is not None and payload:
                st.queue.put_nowait(("out", p.CH_STDOUT if type_ == p.T_STDOUT else p.CH_STDERR, payload))
        elif type_ == p.T_WINDOW:
            st = self._streams.get(stream)
            if st is not None:
                try:
                    channel, increment = p.decode_window(payload)
                except ValueError as exc:
                    raise _ProtocolError(str(exc)) from None
                if channel == p.CH_STDIN:
                    st.stdin_credit += increment
                    st.credit_event.set()
        elif type_ == p.T_EXIT:
            st = self._streams.get(stream)
            if st is not None and not st.finished:
                try:
                    code, signal = p.decode_exit(payload)
                except ValueError as exc:
                    raise _ProtocolError(str(exc)) from None
                self._finish(st, ("exit", code, signal))
        elif type_ == p.T_ERROR:
            if stream == 0:
                raise _ProtocolError(f"connection error: {_error_from_payload(payload)}")
            st = self._streams.get(stream)
            if st is not None and not st.finished:
                self._finish(st, ("error", _error_from_payload(payload)))
            fut = self._pending.get(stream)
            if fut is not None and not fut.done():
                fut.set_exception(_error_from_payload(payload))
        elif type_ == p.T_EXEC_STARTED:
            st = self._streams.get(stream)
            if st is not None and len(payload) == 4:
                st.pid = int.from_bytes(payload, "big")
        elif type_ in (
            p.T_PONG,
            p.T_STATUS_REPLY,
            p.T_SHUTDOWN_ACK,
            p.T_SERVICES_REPLY,
            p.T_SERVICE_STATES_REPLY,
            p.T_SERVICE_LOGS_REPLY,
        ):
            fut = self._pending.get(stream)
            if fut is not None and not fut.done():
                fut.set_result(payload)
        # HELLO_REPLY duplicates (answers to re-sent HELLOs) and READY are ignored once connected.

    def _finish(self, st: _Stream, item: tuple[Any, ...]) -> None:
        st.finished = True
        st.queue.put_nowait(item)
        st.terminal.set()
        st.credit_event.set()

    def _lose(self, reason: str) -> None:
        if self._lost is not None:
            return
        self._lost = reason
        for st in list(self._streams.values()):
            if not st.finished:
                self._finish(st, ("lost", UnavailableError(reason)))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(UnavailableError(reason))
