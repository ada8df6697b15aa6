"""Errors across the API's boundary: the local wire's error object ↔ gRPC status (code table, both details),
statuses without vz's detail, and no daemon at all."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import status_pb2

from vz_core.api import ApiError, Client, pb


@pytest.mark.parametrize(
    ("code", "grpc_code"),
    [
        ("NOT_FOUND", "NOT_FOUND"),
        ("UNSUPPORTED", "UNIMPLEMENTED"),
        ("RUNTIME_FAILURE", "INTERNAL"),
        ("TIMEOUT", "DEADLINE_EXCEEDED"),
        ("CANCELLED", "CANCELLED"),
        ("INVALID_ARGUMENT", "INVALID_ARGUMENT"),
        ("TrustError", "UNKNOWN"),
    ],
)
def test_error_object_to_status_and_back(code: str, grpc_code: str) -> None:
    error = {"code": code, "message": f"it failed ({code})", "kind": "user_error", "exit_code": 2, "details": None}
    number, message, raw = pb.error_to_status(error)
    assert number == getattr(grpc.StatusCode, grpc_code).value[0] and message == error["message"]
    status = status_pb2.Status.FromString(raw)
    assert [d.type_url for d in status.details] == [pb.RUNTIME_ERROR_TYPE_URL, pb.API_ERROR_TYPE_URL]
    runtime = pb.runtime_pb2.RuntimeError()
    status.details[0].Unpack(runtime)
    expected = f"RUNTIME_ERROR_CODE_{code}" if code != "TrustError" else "RUNTIME_ERROR_CODE_UNKNOWN"
    assert pb.runtime_pb2.RuntimeErrorCode.Name(runtime.code) == expected and runtime.message == error["message"]
    assert pb.error_from_status_details(raw, grpc_code, "ignored") == error


def test_a_status_with_only_a_runtime_error_or_nothing() -> None:
    runtime = pb.runtime_pb2.RuntimeError(
        code=pb.runtime_pb2.RUNTIME_ERROR_CODE_UNSUPPORTED, message="no terminals here", runtime_message="r"
    )
    detail = any_pb2.Any()
    detail.Pack(runtime)
    raw = status_pb2.Status(code=12, message="x", details=[detail]).SerializeToString()
    error = pb.error_from_status_details(raw, "UNIMPLEMENTED", "x")
    assert (error["code"], error["kind"], error["exit_code"]) == ("UNSUPPORTED", "user_error", 2)
    assert error["message"] == "no terminals here" and error["details"]["runtime_message"] == "r"
    bare = pb.error_from_status_details(None, "NOT_FOUND", "no such method")
    assert (bare["code"], bare["exit_code"], bare["message"], bare["details"]) == (
        "NOT_FOUND",
        3,
        "no such method",
        None,
    )


def test_a_malformed_error_object_is_refused() -> None:
    with pytest.raises(Exception, match="surprise"):
        pb.error_to_status({"code": "X", "message": "m", "kind": "k", "exit_code": 1, "details": None, "surprise": 1})


@pytest.mark.parametrize("transport", ["local", "grpc"])
def test_no_daemon_and_no_autostart_is_an_api_error(transport: str, tmp_path: Path) -> None:
    with Client(tmp_path / "home", autostart=False, transport=transport) as client, pytest.raises(ApiError) as info:
        client.daemon_status()
    error = info.value
    assert (error.code, error.kind, error.exit_code) == ("UNAVAILABLE", "unavailable", 69)
    assert "vz daemon start" in error.message
