"""B2: warm unary RPCs (Info, Find) on an open connection to a launched plugin, and the in-process baseline.

One fake driver plugin per TLS mode is launched the way vz launches a built-in driver and kept warm
(``RemoteDriver(mode="warm")``, no idle stop). A Machine is created so Find returns a real record. The calls
are interleaved per iteration, so every path sees the same load:

* ``remote`` (AutoMTLS, grpcio's own TLS, the default) and ``remote-plaintext``: ``RemoteDriver.info()`` /
  ``.find()``, i.e. what vz code calls (protobuf conversion and error translation included);
* ``grpc-stub``: the bare generated stub on the same AutoMTLS channel (the transport alone);
* ``in-process``: ``FakeDriver`` methods called directly (what the driver itself costs);
* ``go-peer``: the same ``RemoteDriver`` calls served by the Go peer (tests/go, go-plugin, AutoMTLS through vz's
  relay): the client side is ours in both, so the difference is the server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks._common import fake_spec, go_peer_bin, go_spec
from benchmarks._stats import summary

ID = "B2"
TITLE = "warm unary RPC (Info, Find) on an open connection"

_WID = "b2-machine"


async def run(ctx: Any) -> dict[str, Any]:
    from vz_conformance.fake import FakeDriver

    from vz_core import RunImageRequest
    from vz_core.rpc import RemoteDriver
    from vz_core.rpc.pb import runtime_pb2 as pb
    from vz_core.rpc.pb import runtime_pb2_grpc as pb_grpc
    from vz_core.transport import PluginLauncher

    workdir: Path = ctx.workdir
    n = ctx.n(2000, 30)
    state = workdir / "fake-state"

    def remote(plaintext: bool) -> RemoteDriver:
        spec = fake_spec(state, plaintext=plaintext)
        return RemoteDriver(PluginLauncher(lambda: spec, name="fake"), mode="warm", idle_timeout=None)

    go_bin = await asyncio.to_thread(go_peer_bin, ctx.notes)
    mtls, plain = remote(False), remote(True)
    go: RemoteDriver | None = None
    if go_bin is not None:
        go_launch = go_spec(go_bin)
        go = RemoteDriver(PluginLauncher(lambda: go_launch, name="go-peer"), mode="warm", idle_timeout=None)
    local = FakeDriver(state_dir=state)
    try:
        await mtls.run_image(RunImageRequest(workspace_id=_WID, image="vz:default"))
        await plain.info()
        if go is not None:
            await go.run_image(RunImageRequest(workspace_id=_WID, image="vz:default"))
        conn = mtls.connection
        assert conn is not None
        stub = pb_grpc.RuntimeDriverStub(conn.channel)  # type: ignore[no-untyped-call]

        async def stub_info() -> None:
            await stub.Info(pb.InfoRequest())

        async def stub_find() -> None:
            reply = await stub.Find(pb.FindRequest(workspace_id=_WID))
            assert reply.found

        async def found(call: Awaitable[Any]) -> None:
            assert await call is not None

        paths: dict[str, Callable[[], Awaitable[Any]]] = {
            "remote.info": lambda: mtls.info(),
            "remote.find": lambda: found(mtls.find(_WID)),
            "remote-plaintext.info": lambda: plain.info(),
            "remote-plaintext.find": lambda: found(plain.find(_WID)),
            "grpc-stub.info": stub_info,
            "grpc-stub.find": stub_find,
            "in-process.info": lambda: local.info(),
            "in-process.find": lambda: found(local.find(_WID)),
        }
        if go is not None:
            go_driver = go
            paths["go-peer.info"] = lambda: go_driver.info()
            paths["go-peer.find"] = lambda: found(go_driver.find(_WID))
        samples: dict[str, list[float]] = {key: [] for key in paths}
        for _ in range(max(n // 10, 5)):  # warm-up: channels, caches, allocator
            for call in paths.values():
                await call()
        for _ in range(n):
            for key, call in paths.items():
                t0 = time.perf_counter()
                await call()
                samples[key].append(time.perf_counter() - t0)
        await mtls.delete(_WID)
    finally:
        await mtls.close()
        await plain.close()
        if go is not None:
            await go.close()
        await local.close()

    out: dict[str, Any] = {"calls_per_path": n, "paths": {key: summary(values) for key, values in samples.items()}}
    p = out["paths"]
    out["overhead_over_in_process_p50_ms"] = {
        rpc: round(p[f"remote.{rpc}"]["p50_ms"] - p[f"in-process.{rpc}"]["p50_ms"], 3) for rpc in ("info", "find")
    }
    out["headline"] = (
        f"RemoteDriver (AutoMTLS) Info p50 {p['remote.info']['p50_ms']:.3f} / p99 {p['remote.info']['p99_ms']:.3f} ms, "
        f"Find p50 {p['remote.find']['p50_ms']:.3f} / p99 {p['remote.find']['p99_ms']:.3f} ms (goal p50 <= 0.3, "
        f"p99 <= 1); bare stub Info p50 {p['grpc-stub.info']['p50_ms']:.3f} ms; in-process Find "
        f"{p['in-process.find']['p50_ms']:.3f} ms"
    )
    if "go-peer.info" in p:
        out["headline"] += f"; Go peer served Info p50 {p['go-peer.info']['p50_ms']:.3f} ms"
    return out
