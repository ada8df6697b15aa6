"""The error table of PROTOCOL.md §5, and its wire encoding through a real gRPC server."""

from __future__ import annotations

import inspect
import pickle
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from vz_core import errors
from vz_core._proto.devsy.runtime.v1 import runtime_pb2 as pb
from vz_core.rpc import error_from_rpc, error_to_status, runtime_errors_in

TABLE = {
    "UNKNOWN": (0, grpc.StatusCode.UNKNOWN),
    "NOT_FOUND": (1, grpc.StatusCode.NOT_FOUND),
    "ALREADY_EXISTS": (2, grpc.StatusCode.ALREADY_EXISTS),
    "INVALID_ARGUMENT": (3, grpc.StatusCode.INVALID_ARGUMENT),
    "UNSUPPORTED": (4, grpc.StatusCode.UNIMPLEMENTED),
    "UNAVAILABLE": (5, grpc.StatusCode.UNAVAILABLE),
    "FAILED_PRECONDITION": (6, grpc.StatusCode.FAILED_PRECONDITION),
    "PERMISSION_DENIED": (7, grpc.StatusCode.PERMISSION_DENIED),
    "TIMEOUT": (8, grpc.StatusCode.DEADLINE_EXCEEDED),
    "CANCELLED": (9, grpc.StatusCode.CANCELLED),
    "RUNTIME_FAILURE": (10, grpc.StatusCode.INTERNAL),
    "INCOMPATIBLE_VERSION": (11, grpc.StatusCode.FAILED_PRECONDITION),
}


def _driver_error_classes() -> list[type[errors.DriverError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.DriverError) and cls is not errors.DriverError
    ]


def test_every_wire_code_has_exactly_one_class() -> None:
    wire = {v.name.removeprefix("RUNTIME_ERROR_CODE_"): v.number for v in pb.RuntimeErrorCode.DESCRIPTOR.values}
    assert {c.category.name: c.category.number for c in errors.CATEGORY_TABLE} == wire
    assert len(errors.CATEGORY_TABLE) == len(wire)


def test_every_error_class_has_a_mapping() -> None:
    classes = _driver_error_classes()
    assert set(classes) == set(errors.CATEGORY_TABLE), "a DriverError subclass is missing from CATEGORY_TABLE"
    for cls in classes:
        number, code = TABLE[cls.category.name]
        assert (cls.category.number, cls.category.grpc_code) == (number, code), cls.__name__
        assert errors.error_class_for_code(number) is cls


def test_only_unavailable_is_retryable_by_default() -> None:
    assert [c.category.name for c in errors.CATEGORY_TABLE if c.category.retryable] == ["UNAVAILABLE"]


def test_every_grpc_code_classifies() -> None:
    for code in grpc.StatusCode:
        if code is grpc.StatusCode.OK:
            continue
        assert issubclass(errors.error_class_for_grpc(code), errors.DriverError)


def test_empty_message_is_refused() -> None:
    with pytest.raises(ValueError):
        errors.NotFoundError("")


def test_errors_pickle() -> None:
    err = errors.NotFoundError("machine x is missing", details={"workspace_id": "x"})
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.NotFoundError and back.details == {"workspace_id": "x"}


class _Failing(grpc.GenericRpcHandler):
    def __init__(self, err: errors.DriverError) -> None:
        self.err = err

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            await context.abort_with_status(error_to_status(self.err))
            raise AssertionError("unreachable")

        return grpc.unary_unary_rpc_method_handler(unary)


@pytest.fixture
async def failing_server(tmp_path: Path) -> AsyncIterator[tuple[str, _Failing]]:
    handler = _Failing(errors.NotFoundError("x"))
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([handler])
    address = f"unix:{tmp_path}/s.sock"
    server.add_insecure_port(address)
    await server.start()
    yield address, handler
    await server.stop(None)


@pytest.mark.parametrize("cls", errors.CATEGORY_TABLE, ids=lambda c: c.category.name)
async def test_round_trip_through_a_real_server(cls: type[errors.DriverError], failing_server) -> None:  # type: ignore[no-untyped-def]
    address, handler = failing_server
    handler.err = cls("machine 'a b' is missing: run vz up", runtime_message="backend said no", details={"k": "v"})
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary("/devsy.runtime.v1.RuntimeDriver/Find")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"")
    rpc_error = info.value
    assert rpc_error.code() == TABLE[cls.category.name][1]
    found = runtime_errors_in(rpc_error)
    assert len(found) == 1, "exactly one RuntimeError detail"
    assert found[0].code == cls.category.number
    back = error_from_rpc(rpc_error, rpc="Find")
    assert type(back) is cls
    assert back.message == "machine 'a b' is missing: run vz up"
    assert back.runtime_message == "backend said no"
    assert back.details["k"] == "v" and back.details["rpc"] == "Find"


def test_status_without_detail_classifies_by_code() -> None:
    class Fake(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return "connection refused"

        def trailing_metadata(self) -> tuple[()]:
            return ()

    err = error_from_rpc(Fake(), rpc="Info")
    assert isinstance(err, errors.UnavailableError) and err.retryable
    assert "connection refused" in err.message
