"""The vz API: a typed Python client of the vz daemon (docs/api.md).

::

    from vz_core.api import Client

    with Client() as client:                 # the daemon of VZ_HOME, started on demand
        op = client.up()                     # Environments.Up: progress, then the result
        for progress in op:
            print(progress.message)
        print(op.result().environment.id)
        print(client.exec(["echo", "hi"]).stdout)

``Client`` has one method per vz.api.v1 rpc; ``Operation`` (long operations), ``EventStream`` (watches, with
``last_revision`` to resume from), ``ExecCall`` (a running command). Results are the daemon's JSON objects as
typed dicts (``UpResult``, ``StatusReport``, ``Environment``, ``Machine``, ``Event``, ``ExecResult``,
``DaemonStatus``, ``Volume``, ``Capability``, ``Progress``); every failure raises ``ApiError``.

Two transports: ``"local"`` (default; the daemon's local wire, standard library only, descriptors passed) and
``"grpc"`` (vz.api.v1 over gRPC on the same socket; ``vz_core.api.pb`` holds the generated stubs and the one
conversion between them and the local wire's JSON).

Names are resolved lazily (PEP 562): ``import vz_core.api`` imports nothing else until a name is used.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from vz_core.api._client import Client, EventStream, ExecCall, Operation, default_context
    from vz_core.api._errors import ApiError
    from vz_core.api._exec_result import ExecResult
    from vz_core.api._types import (
        Capability,
        DaemonStatus,
        DeleteResult,
        Environment,
        EnvironmentRef,
        Event,
        Machine,
        Progress,
        StatusReport,
        StopResult,
        UpResult,
        Volume,
    )

__all__ = [
    "ApiError",
    "Capability",
    "Client",
    "DaemonStatus",
    "DeleteResult",
    "Environment",
    "EnvironmentRef",
    "Event",
    "EventStream",
    "ExecCall",
    "ExecResult",
    "Machine",
    "Operation",
    "Progress",
    "StatusReport",
    "StopResult",
    "UpResult",
    "Volume",
    "default_context",
]

_WHERE = {
    "ApiError": "_errors",
    "Client": "_client",
    "EventStream": "_client",
    "ExecCall": "_client",
    "ExecResult": "_exec_result",
    "Operation": "_client",
    "default_context": "_client",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'vz_core.api' has no attribute {name!r}")
    # __import__, not importlib.import_module: importlib costs `vz exec` (which uses Client) a millisecond
    value = getattr(__import__(f"vz_core.api.{_WHERE.get(name, '_types')}", fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
