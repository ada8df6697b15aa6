"""The generated stubs of vz.api.v1 and their one conversion to and from the local wire, under the API client's
name (they live in ``vz_core.pbwire``, below both the client and the daemon's gRPC front)."""

from __future__ import annotations

from vz_core.pbwire import (
    API_ERROR_TYPE_URL,
    METHODS,
    RUNTIME_ERROR_TYPE_URL,
    MethodSpec,
    api_pb2,
    api_pb2_grpc,
    error_from_status_details,
    error_to_status,
    from_wire,
    grpc_code_name,
    method,
    runtime_pb2,
    to_wire,
)

__all__ = [
    "API_ERROR_TYPE_URL",
    "METHODS",
    "RUNTIME_ERROR_TYPE_URL",
    "MethodSpec",
    "api_pb2",
    "api_pb2_grpc",
    "error_from_status_details",
    "error_to_status",
    "from_wire",
    "grpc_code_name",
    "method",
    "runtime_pb2",
    "to_wire",
]
