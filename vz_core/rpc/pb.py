"""The generated protobuf and gRPC stubs of the Runtime Protocol, under public names.

The generated code itself stays in ``vz_core._proto`` (written by ``scripts/gen_protos.py``, checked by the
stub-drift test, its imports rewritten to that package): moving it would change every generated import line
and the generator's output path for no gain. Code outside ``vz_core`` reaches the stubs only through this
module, e.g. ``from vz_core.rpc.pb import runtime_pb2``. Driver authors never need them (the Driver contract
speaks plain values).
"""

from __future__ import annotations

from vz_core._proto.devsy.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from vz_core._proto.plugin import (
    grpc_broker_pb2,
    grpc_broker_pb2_grpc,
    grpc_controller_pb2,
    grpc_controller_pb2_grpc,
    grpc_stdio_pb2,
    grpc_stdio_pb2_grpc,
)
from vz_core._proto.vz.machine.v1 import extensions_pb2, extensions_pb2_grpc

__all__ = [
    "extensions_pb2",
    "extensions_pb2_grpc",
    "grpc_broker_pb2",
    "grpc_broker_pb2_grpc",
    "grpc_controller_pb2",
    "grpc_controller_pb2_grpc",
    "grpc_stdio_pb2",
    "grpc_stdio_pb2_grpc",
    "runtime_pb2",
    "runtime_pb2_grpc",
]
