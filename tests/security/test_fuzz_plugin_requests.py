"""A bounded fuzz of the plugin server's request handling (#18: the plugin server's request parser).

Random bytes, corrupted messages and messages with random field values (unknown enum values, odd strings,
huge numbers) go to every RuntimeDriver and MachineExtensions RPC of the plugin server over a real grpc.aio
connection, as raw bytes through generic calls. Every request must end in a proper status: OK, or a canonical
code other than UNKNOWN carrying exactly one RuntimeError whose code matches the status (PROTOCOL.md §5); an
exec stream that ends OK ends with exactly one exit frame. The driver behind the server never fails on its
own, so an unexpected exception logged by the server is a server bug. The seed is fixed; a longer run:
``VZ_FUZZ_EXAMPLES=5000 pytest tests/security/test_fuzz_plugin_requests.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from vz_conformance.fake import FakeDriver

from vz_core import (
    Capabilities,
    Driver,
    DriverInfo,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecSpec,
    Extensions,
    MachineDetails,
    MountType,
    RecreateMode,
    RunImageRequest,
)
from vz_core.errors import CATEGORY_TABLE, NotFoundError
from vz_core.rpc import StatusLog, is_made_up, runtime_errors_in, serve_in_process
from vz_core.rpc.pb import extensions_pb2, runtime_pb2

EXAMPLES = int(os.environ.get("VZ_FUZZ_EXAMPLES", "200"))
CALL_TIMEOUT = 15.0


class SafeDriver(Driver):
    """Answers everything without touching the host: the fuzz exercises the server, not a backend."""

    async def info(self, *, supports_recreate_on_run: bool = False) -> DriverInfo:
        return DriverInfo(
            driver_name="safe",
            driver_version="1",
            runtime_name="none",
            capabilities=Capabilities(
                mount_types=(MountType.BIND,),
                recreate_mode=RecreateMode.DELETE,
                provisioning_preflight=True,
                logs=True,
                reuse_preflight=True,
            ),
        )

    async def preflight(self, *, disable_auto_start: bool = False) -> None:
        return None

    async def provisioning_preflight(self) -> None:
        return None

    async def reuse_preflight(self, workspace_id: str, remote_user: str) -> None:
        return None

    async def find(self, workspace_id: str) -> MachineDetails | None:
        return None

    async def target_architecture(self, workspace_id: str) -> str:
        return "arm64"

    async def run_image(self, request: RunImageRequest) -> None:
        return None

    async def start(self, workspace_id: str) -> None:
        return None

    async def stop(self, workspace_id: str) -> None:
        return None

    async def delete(self, workspace_id: str) -> None:
        return None

    async def extensions(self) -> Extensions | None:
        return Extensions(target_os=("linux",))

    def exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        return self._exec(spec, stdin)

    async def _exec(self, spec: ExecSpec, stdin: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
        if spec.workspace_id.startswith("missing"):
            raise NotFoundError(f"no Machine {spec.workspace_id!r}")
        async for chunk in stdin:
            yield ExecOutput("stdout", chunk)
        yield ExecExit(0)

    async def logs(self, workspace_id: str) -> AsyncIterator[bytes]:
        yield b"log line\n"


# Strategies ------------------------------------------------------------------------------------------------

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_TEXT = st.one_of(
    st.sampled_from(["", "w", "missing", "../..", "/", "a b", "é", "\x00", "-" * 300, "root", "linux/amd64"]),
    st.text(max_size=40),
)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_STRING:
        return _TEXT
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.floats(allow_nan=True, width=32 if field.type == FieldDescriptor.TYPE_FLOAT else 64)
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(*_INT_RANGES[field.type]))
    low, high = _INT_RANGES[field.type]
    return st.one_of(st.sampled_from([0, 1, -1 if low < 0 else 2, high]), st.integers(low, high))


@st.composite
def _message(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> dict[str, Any]:
    """Field values for a message of ``descriptor`` (a subset of its fields, nested up to a small depth)."""
    values: dict[str, Any] = {}
    oneofs_done: set[str] = set()
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        if field.containing_oneof is not None:
            if field.containing_oneof.name in oneofs_done:
                continue
            oneofs_done.add(field.containing_oneof.name)
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            key, value = message.fields_by_name["key"], message.fields_by_name["value"]
            values[field.name] = draw(st.dictionaries(_scalar(key), _scalar(value), max_size=3))
        elif message is not None:
            if depth >= 3:
                continue
            sub = _message(message, depth + 1)
            if field.is_repeated:
                values[field.name] = draw(st.lists(sub, max_size=3))
            else:
                values[field.name] = draw(sub)
        elif field.is_repeated:
            values[field.name] = draw(st.lists(_scalar(field), max_size=3))
        else:
            values[field.name] = draw(_scalar(field))
    return values


def _fill(msg: Any, values: dict[str, Any]) -> Any:
    for name, value in values.items():
        field = msg.DESCRIPTOR.fields_by_name[name]
        target = getattr(msg, name) if field.message_type is not None or field.is_repeated else None
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target.update(value)
        elif field.message_type is not None and field.is_repeated:
            for item in value:
                _fill(target.add(), item)
        elif field.message_type is not None:
            _fill(target, value)
        elif field.is_repeated:
            target.extend(value)
        else:
            setattr(msg, name, value)
    return msg


@st.composite
def _payload(draw: st.DrawFn, cls: Any) -> bytes:
    """Bytes for one request: a message with random field values, a corrupted one, or plain garbage."""
    kind = draw(st.sampled_from(["fields", "fields", "corrupt", "garbage"]))
    if kind == "garbage":
        data: bytes = draw(st.binary(max_size=256))
        return data
    raw = _fill(cls(), draw(_message(cls.DESCRIPTOR))).SerializeToString()
    if kind == "corrupt" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


_UNARY = {
    "devsy.runtime.v1.RuntimeDriver": (
        runtime_pb2,
        [
            "Info",
            "Preflight",
            "ProvisioningPreflight",
            "ReusePreflight",
            "Find",
            "TargetArchitecture",
            "RunImage",
            "Start",
            "Stop",
            "Delete",
        ],
    ),
    "vz.machine.v1.MachineExtensions": (extensions_pb2, ["Extensions"]),
}
# RPCs the fake driver (a real, validating driver) gets too: none that starts processes on this host.
_FAKE_SAFE = {"Info", "Preflight", "ReusePreflight", "Find", "TargetArchitecture", "Stop", "Delete", "Start"}


def _request_class(module: Any, service: str, rpc: str) -> Any:
    method = module.DESCRIPTOR.services_by_name[service.rpartition(".")[2]].methods_by_name[rpc]
    return getattr(module, method.input_type.name)


@dataclass(frozen=True)
class Case:
    target: str  # "safe" | "fake"
    path: str
    kind: str  # "unary" | "logs" | "exec"
    frames: tuple[bytes, ...]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    kind = draw(st.sampled_from(["unary", "unary", "unary", "logs", "exec", "exec"]))
    if kind == "logs":
        return Case("safe", "/devsy.runtime.v1.RuntimeDriver/Logs", kind, (draw(_payload(runtime_pb2.LogsRequest)),))
    if kind == "exec":
        frame = st.one_of(
            _payload(runtime_pb2.ExecClientMessage),
            st.builds(
                lambda argv, ws: runtime_pb2.ExecClientMessage(
                    start=runtime_pb2.ExecStart(workspace_id=ws, argv=argv)
                ).SerializeToString(),
                st.lists(_TEXT, max_size=3),
                st.sampled_from(["w", "missing", ""]),
            ),
            st.builds(lambda d: runtime_pb2.ExecClientMessage(stdin=d).SerializeToString(), st.binary(max_size=64)),
            st.just(runtime_pb2.ExecClientMessage(close_stdin=runtime_pb2.CloseStdin()).SerializeToString()),
        )
        return Case("safe", "/devsy.runtime.v1.RuntimeDriver/Exec", kind, tuple(draw(st.lists(frame, max_size=5))))
    service = draw(st.sampled_from(sorted(_UNARY)))
    module, rpcs = _UNARY[service]
    rpc = draw(st.sampled_from(rpcs))
    target = draw(st.sampled_from(["safe", "fake"])) if rpc in _FAKE_SAFE else "safe"
    return Case(target, f"/{service}/{rpc}", kind, (draw(_payload(_request_class(module, service, rpc))),))


# The check -------------------------------------------------------------------------------------------------

_GRPC_CODE_OF = {cls.category.number: cls.category.grpc_code for cls in CATEGORY_TABLE}


def _check_status(case: Case, err: Any) -> None:
    code = err.code()
    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED), (case, code, err.details())
    details = runtime_errors_in(err)
    assert len(details) == 1, f"{case}: {code.name} {err.details()!r} carries {len(details)} RuntimeError details"
    assert _GRPC_CODE_OF.get(details[0].code) == code, (case, code, details[0])
    assert details[0].message, case


async def _run(channels: dict[str, grpc.aio.Channel], case: Case) -> None:
    channel = channels[case.target]
    if case.kind == "unary":
        call = channel.unary_unary(case.path)
        try:
            await call(case.frames[0], timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as err:
            _check_status(case, err)
        return
    if case.kind == "logs":
        stream = channel.unary_stream(case.path)(case.frames[0], timeout=CALL_TIMEOUT)
        try:
            async for _ in stream:
                pass
        except grpc.aio.AioRpcError as err:
            _check_status(case, err)
        return

    exec_call = channel.stream_stream(case.path, response_deserializer=runtime_pb2.ExecServerMessage.FromString)
    call = exec_call(timeout=CALL_TIMEOUT)
    # The server refuses a rule break at once, possibly before we finished writing: grpcio's client may then
    # report a made-up INTERNAL (grpc/grpc#36066). Read the server's own status the way RemoteDriver does.
    statuses = StatusLog(call)
    with contextlib.suppress(grpc.RpcError, grpc.aio.BaseError, asyncio.InvalidStateError):
        for frame in case.frames:
            await call.write(frame)
        await call.done_writing()
    got: list[Any] = []
    try:
        async for msg in call:
            got.append(msg)
    except grpc.aio.AioRpcError as err:
        status: Any = err
        if is_made_up(err):
            status = await statuses.peer_status(5.0) or err
        _check_status(case, status)
        return
    kinds = [m.WhichOneof("payload") for m in got]
    assert kinds.count("exit") == 1 and kinds[-1] == "exit", (case, kinds)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[asyncio.AbstractEventLoop, dict[str, grpc.aio.Channel]]]:
    """Two in-process plugin servers (the safe driver, the fake driver) on a loop in a background thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stack: Any = None

    async def start() -> dict[str, grpc.aio.Channel]:
        nonlocal stack
        stack = contextlib.AsyncExitStack()
        safe = await stack.enter_async_context(serve_in_process(SafeDriver()))
        fake = await stack.enter_async_context(serve_in_process(FakeDriver(state_dir=tmp_path / "fake")))
        return {"safe": safe, "fake": fake}

    channels = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield loop, channels
    finally:
        asyncio.run_coroutine_threadsafe(stack.aclose(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_every_request_ends_in_a_proper_status(
    servers: tuple[asyncio.AbstractEventLoop, dict[str, grpc.aio.Channel]], caplog: pytest.LogCaptureFixture
) -> None:
    loop, channels = servers
    caplog.set_level(logging.ERROR, logger="vz.plugin")

    @seed(20261201)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=cases())
    def check(case: Case) -> None:
        caplog.clear()
        asyncio.run_coroutine_threadsafe(_run(channels, case), loop).result(CALL_TIMEOUT + 15)
        unexpected = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not unexpected, f"{case}: the server logged {unexpected}"

    check()
