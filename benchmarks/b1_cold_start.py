"""B1: plugin cold start, launch → handshake line → first Info reply, a fresh plugin process per sample.

Configurations (all measured in one run, interleaved round-robin so load noise hits them alike):

* plugin: the Python fake driver, launched the way vz launches a built-in driver
  (``python -m vz_plugins vz_conformance.fake:FakeDriver``), and the Go peer (tests/go, HashiCorp go-plugin);
* ``direct`` (``supervised=False``) and ``supervised`` (the default: the plugin runs under vz's supervisor);
* ``plaintext`` and ``automtls`` (go-plugin AutoMTLS; the Go peer's P-521 certificate goes through vz's TLS relay);
* for Python, the environment as it is (this one sets ``PYTHONDONTWRITEBYTECODE=1``, so modules without a cached
  ``.pyc`` are compiled at every start) and ``bytecode`` (``PYTHONDONTWRITEBYTECODE`` unset, caches written to a
  private ``PYTHONPYCACHEPREFIX`` by the first launch, which is the warm-up).

Per sample: ``ready`` = ``PluginLauncher.launch()`` returned (spawn, handshake line, channel, health SERVING),
``first_info`` = the first ``RuntimeDriver/Info`` reply (the figure B1's goal is about), ``shutdown`` = the
orderly stop that follows (not part of the figure). Sample 0 of each configuration is the first launch and is
reported apart; the warm samples give p50/p95/p99. Differences (what supervision, what AutoMTLS adds) and
ratios (ours / the Go peer) are medians over rounds of the per-round difference or ratio: each round takes one
sample of every configuration moments apart, so a load swing affects both sides of a pair.

For context the benchmark also times ``vz --help`` and the floors any Python plugin pays here: a bare
interpreter (``-I -S``), one with its site start-up, and ``import grpc``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import bytecode_env, fake_spec, go_peer_bin, uncached_modules, vz_script
from benchmarks._stats import summary

ID = "B1"
TITLE = "plugin cold start: launch → handshake → first Info"

_PLUGIN_IMPORTS = ("vz_plugins.__main__", "vz_core.rpc._server", "vz_conformance.fake", "vz_core.transport._certs")


@dataclass
class _Config:
    key: str
    plugin: str  # "python" | "go"
    supervised: bool
    plaintext: bool
    bytecode: bool
    first: dict[str, float]
    ready: list[float]
    first_info: list[float]
    shutdown: list[float]
    tls: str = ""


async def _sample(cfg: _Config, spec_for: Any) -> tuple[float, float, float]:
    from vz_core.rpc.pb import runtime_pb2 as pb
    from vz_core.rpc.pb import runtime_pb2_grpc as pb_grpc
    from vz_core.transport import PluginLauncher

    spec = spec_for(cfg)
    launcher = PluginLauncher(lambda: spec, name=spec.name, supervised=cfg.supervised)
    t0 = time.perf_counter()
    conn = await launcher.launch()
    try:
        t1 = time.perf_counter()
        reply = await pb_grpc.RuntimeDriverStub(conn.channel).Info(pb.InfoRequest(supports_recreate_on_run=True))  # type: ignore[no-untyped-call]
        t2 = time.perf_counter()
        if not reply.driver_name:
            raise RuntimeError(f"{cfg.key}: Info carried no driver name")
        cfg.tls = conn.tls
    except BaseException:
        await conn.kill()
        raise
    await conn.shutdown()
    t3 = time.perf_counter()
    return t1 - t0, t2 - t0, t3 - t2


def _configs(go: bool) -> list[_Config]:
    out = []
    for plugin, bytecode in (("python", False), ("python", True), ("go", False)):
        if plugin == "go" and not go:
            continue
        for supervised in (False, True):
            for plaintext in (True, False):
                key = "-".join(
                    [
                        plugin + ("-bytecode" if bytecode else ""),
                        "supervised" if supervised else "direct",
                        "plaintext" if plaintext else "automtls",
                    ]
                )
                out.append(_Config(key, plugin, supervised, plaintext, bytecode, {}, [], [], []))
    return out


def _p50(values: list[float]) -> float:
    return float(summary(values)["p50_ms"])


_FLOORS = {
    "python -I -S -c pass": ["-I", "-S", "-c", "pass"],
    "python -c pass": ["-c", "pass"],
    "python -c 'import grpc'": ["-c", "import grpc"],
}


async def _floors(n: int) -> dict[str, Any]:
    """What any Python plugin pays before vz code runs: interpreter start, site start-up, importing grpcio."""
    samples: dict[str, list[float]] = {key: [] for key in _FLOORS}
    for _ in range(n):
        for key, args in _FLOORS.items():
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(sys.executable, *args, stdin=asyncio.subprocess.DEVNULL)
            if await proc.wait() != 0:
                raise RuntimeError(f"{key} failed")
            samples[key].append(time.perf_counter() - t0)
    return {key: summary(values) for key, values in samples.items()}


async def _cli_help(n: int) -> dict[str, Any]:
    script = vz_script()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            script, "--help", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        if await proc.wait() != 0:
            raise RuntimeError("vz --help failed")
        samples.append(time.perf_counter() - t0)
    return summary(samples)


async def run(ctx: Any) -> dict[str, Any]:
    workdir: Path = ctx.workdir
    warm = ctx.n(50, 3)
    go_bin = await asyncio.to_thread(go_peer_bin, ctx.notes)
    pycache = workdir / "pycache"
    state = workdir / "fake-state"

    def spec_for(cfg: _Config) -> Any:
        from benchmarks._common import go_spec

        if cfg.plugin == "go":
            assert go_bin is not None
            return go_spec(go_bin, plaintext=cfg.plaintext)
        return fake_spec(state, plaintext=cfg.plaintext, env=bytecode_env(pycache) if cfg.bytecode else None)

    bytecode_state = await asyncio.to_thread(uncached_modules, _PLUGIN_IMPORTS)
    configs = _configs(go_bin is not None)
    # First launches, in order: the very first one is the coldest of the run.
    for cfg in configs:
        ready, info, down = await _sample(cfg, spec_for)
        cfg.first = {"ready_ms": round(ready * 1000, 1), "first_info_ms": round(info * 1000, 1)}
    for _ in range(warm):
        for cfg in configs:
            ready, info, down = await _sample(cfg, spec_for)
            cfg.ready.append(ready)
            cfg.first_info.append(info)
            cfg.shutdown.append(down)

    results: dict[str, Any] = {}
    for cfg in configs:
        results[cfg.key] = {
            "plugin": cfg.plugin,
            "supervised": cfg.supervised,
            "tls": cfg.tls,
            "bytecode_cached": cfg.bytecode,
            "first_launch": cfg.first,
            "first_info": summary(cfg.first_info),
            "ready_p50_ms": _p50(cfg.ready),
            "shutdown_p50_ms": _p50(cfg.shutdown),
        }
    by = {cfg.key: _p50(cfg.first_info) for cfg in configs}
    rounds = {cfg.key: cfg.first_info for cfg in configs}

    def paired(a: str, b: str) -> float | None:
        """Median over rounds of (b - a) in ms: each round's samples were taken moments apart."""
        if a not in rounds or b not in rounds:
            return None
        return round(statistics.median(y - x for x, y in zip(rounds[a], rounds[b], strict=True)) * 1000, 1)

    def ratio(a: str, b: str) -> float:
        """Median over rounds of a / b."""
        return round(statistics.median(x / y for x, y in zip(rounds[a], rounds[b], strict=True)), 1)

    derived: dict[str, Any] = {"supervision_overhead_ms": {}, "automtls_overhead_ms": {}}
    for flavour in ("python", "python-bytecode", "go"):
        for tls in ("plaintext", "automtls"):
            diff = paired(f"{flavour}-direct-{tls}", f"{flavour}-supervised-{tls}")
            if diff is not None:
                derived["supervision_overhead_ms"][f"{flavour}-{tls}"] = diff
        for mode in ("direct", "supervised"):
            diff = paired(f"{flavour}-{mode}-plaintext", f"{flavour}-{mode}-automtls")
            if diff is not None:
                derived["automtls_overhead_ms"][f"{flavour}-{mode}"] = diff
    if go_bin is not None:
        derived["ours_over_go"] = {
            f"{flavour}-{mode}-{tls}": ratio(f"{flavour}-{mode}-{tls}", f"go-{mode}-{tls}")
            for flavour in ("python", "python-bytecode")
            for mode in ("direct", "supervised")
            for tls in ("plaintext", "automtls")
        }

    ctx.notes.append(
        "this environment sets PYTHONDONTWRITEBYTECODE=1: 'python-*' rows run with the environment as it is "
        f"({bytecode_state['without_cached_bytecode']} of the plugin's {bytecode_state['modules']} modules had no "
        "valid cached bytecode at the start); 'python-bytecode-*' rows enable bytecode caching (private "
        "PYTHONPYCACHEPREFIX, written by each configuration's first launch)"
    )
    main = by["python-supervised-automtls"]
    cached = by["python-bytecode-supervised-automtls"]
    sup = derived["supervision_overhead_ms"]
    headline = (
        f"Python plugin launch→first Info p50 {main:.0f} ms supervised+AutoMTLS as-is, {cached:.0f} ms with "
        f"bytecode cached (goal <= 150); supervision adds {sup['python-automtls']:+.0f} ms "
        f"({sup['python-bytecode-automtls']:+.0f} ms cached; goal <= 15)"
    )
    if go_bin is not None:
        go = by["go-supervised-automtls"]
        peer = derived["ours_over_go"]
        headline += (
            f"; Go peer {go:.0f} ms, ours/peer {peer['python-supervised-automtls']}x "
            f"({peer['python-bytecode-supervised-automtls']}x cached)"
        )
    derived["vz_help"] = await _cli_help(ctx.n(20, 2))
    derived["python_start_floors"] = await _floors(ctx.n(20, 2))
    return {
        "headline": headline,
        "warm_samples": warm,
        "python_modules_at_start": bytecode_state,
        "configs": results,
        "derived": derived,
    }
