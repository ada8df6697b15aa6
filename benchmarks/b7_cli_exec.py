"""B7: ``vz exec -- true`` end to end with the vz daemon warm, side by side with ``docker exec`` and ``podman exec``.

Whole-process timing (spawn of the process → it has been reaped). The project is examples/default (its vz.json
copied into a scratch directory), on linux_native, with ``VZ_HOME`` in a scratch directory and the guest agent
prebuilt (``VZ_AGENT_BINARY``). ``vz up`` runs first (timed: it starts the daemon and the driver's plugin), then
one warm-up of each variant, then ``n`` rounds, each running once, in this order:

* ``vz as-is``: ``vz exec -- true`` with the environment as it is (here ``PYTHONDONTWRITEBYTECODE=1``: any vz
  module without a cached ``.pyc`` is compiled at every start);
* ``vz bytecode``: the same with bytecode caching enabled (private ``PYTHONPYCACHEPREFIX``, filled by the
  warm-up); only the CLI process differs, the daemon is the same;
* ``docker`` / ``podman``: ``docker exec <c> true`` / ``podman exec <c> true`` into a running busybox container
  of a private dockerd / podman store (``benchmarks/_peers.py``; not measured, with a note, when not installed);
* ``python -c pass``: the floor any Python CLI pays.

Then the cold figure, reported apart: ``vz daemon stop``, then one ``vz exec -- true`` that has to start a
daemon and launch the driver's plugin (``cold_samples`` times). ``vz delete`` ends it.

The ``vz`` console script of this interpreter is run directly: a version manager's shim in front of it is not
vz's cost. Where linux_native cannot run Machines, examples/fake is used instead, with a note.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import (
    ROOT,
    bytecode_env,
    cli_env,
    linux_native_problem,
    run_timed,
    uncached_modules,
    vz_script,
)
from benchmarks._peers import Peer, docker_peer, podman_peer
from benchmarks._stats import summary

ID = "B7"
TITLE = "`vz exec -- true` end to end, daemon warm, vs docker exec and podman exec"


async def prepare_cli(ctx: Any, home: Path) -> tuple[str, Path | None]:
    """The driver to use (linux_native, else fake with a note) and a prebuilt agent for it."""
    problem = await linux_native_problem(ctx.workdir / "preflight")
    if problem:
        ctx.notes.append(f"linux_native cannot run Machines here ({problem}): measured on the fake driver instead")
        return "fake", None
    from vz_drivers.agent import ensure_agent_binary

    return "linux_native", await asyncio.to_thread(ensure_agent_binary)


async def cleanup_cli(home: Path, env: dict[str, str] | None = None) -> None:
    """Stop the daemon of ``home`` and remove every Machine, mount, cgroup and network namespace its driver
    state still holds."""
    from vz_core.daemon import stop_daemon

    with contextlib.suppress(Exception):
        await asyncio.to_thread(stop_daemon, str(home), env)
    native = home / "drivers" / "linux_native"
    if native.is_dir():
        from vz_drivers.linux_native import cleanup_state

        await cleanup_state(str(native))


def _ratio(ours: dict[str, Any], peer: dict[str, Any] | None) -> float | None:
    if not peer:
        return None
    ratio: float = round(ours["p50_ms"] / peer["p50_ms"], 3)
    return ratio


async def run(ctx: Any) -> dict[str, Any]:
    workdir: Path = ctx.workdir
    home = workdir / "home"
    driver, agent = await prepare_cli(ctx, home)
    example = "default" if driver == "linux_native" else "fake"
    project = workdir / "project"
    project.mkdir()
    shutil.copyfile(ROOT / "examples" / example / "vz.json", project / "vz.json")
    vz = vz_script()
    env = cli_env(home, agent)
    env_cached = cli_env(home, agent, bytecode_env(workdir / "pycache"))
    log = workdir / "cmd.log"
    n = ctx.n(40, 3)
    cold_n = ctx.n(5, 1)

    def timed(argv: list[str], environ: dict[str, str], cwd: Path = project) -> float:
        result = run_timed(argv, cwd=cwd, env=environ, log=log, timeout=120)
        if not result.ok:
            raise RuntimeError(f"{' '.join(argv[:4])} exited {result.returncode}:\n{result.output}")
        return result.seconds

    def vz_run(*args: str, cached: bool = False) -> float:
        return timed([vz, *args], env_cached if cached else env)

    exec_true = ("exec", "--", "true")
    samples: dict[str, list[float]] = {"vz_as_is": [], "vz_bytecode": [], "python_pass": []}
    cold: list[float] = []
    up = delete = 0.0
    peers: dict[str, Peer | None] = {}
    async with docker_peer(workdir, ctx.notes) as docker, podman_peer(workdir, ctx.notes) as podman:
        peers = {"docker": docker, "podman": podman}
        variants: dict[str, Callable[[], float]] = {
            "vz_as_is": lambda: vz_run(*exec_true),
            "vz_bytecode": lambda: vz_run(*exec_true, cached=True),
            "python_pass": lambda: timed([sys.executable, "-c", "pass"], env),
        }
        for name, peer in peers.items():
            if peer is not None:
                samples[name] = []
                variants[name] = lambda peer=peer: timed(peer.exec_argv("true"), env)  # type: ignore[misc]
        try:
            up = await asyncio.to_thread(vz_run, "up")
            for measure in variants.values():  # warm-up: fills the bytecode cache, warms each peer
                await asyncio.to_thread(measure)
            for _ in range(n):
                for name, measure in variants.items():
                    samples[name].append(await asyncio.to_thread(measure))
            for _ in range(cold_n):
                await asyncio.to_thread(vz_run, "daemon", "stop")
                cold.append(await asyncio.to_thread(vz_run, *exec_true))
            delete = await asyncio.to_thread(vz_run, "delete")
        finally:
            await cleanup_cli(home, env)

    stats = {name: summary(values) for name, values in samples.items()}
    # What "as-is" means here: how many modules of `vz exec`'s import path had no usable cached bytecode.
    cli_path = [
        "vz_core.cli._main",
        "vz_core.cli._exec",
        "vz_core.cli._remote",
        "vz_core.api._client",
        "vz_core.api._transport",
        "vz_core.wire._connect",
    ]
    try:
        as_is_bytecode: dict[str, Any] | str = await asyncio.to_thread(uncached_modules, cli_path, env)
    except Exception as exc:  # a renamed module must not cost the figures
        as_is_bytecode = f"not checked: {exc}"
    out: dict[str, Any] = {
        "driver": driver,
        "example": f"examples/{example}",
        "vz": vz,
        "rounds": n,
        "up_ms": round(up * 1000, 1),
        "delete_ms": round(delete * 1000, 1),
        "warm_as_is": stats["vz_as_is"],
        "warm_bytecode_cached": stats["vz_bytecode"],
        "python_pass": stats["python_pass"],
        "cold_daemon_start": summary(cold),
        "as_is_cli_bytecode": as_is_bytecode,
        "peers": {name: {"version": p.version, **stats[name]} if p else None for name, p in peers.items()},
        "ratios": {
            f"{ours}_over_{peer}": _ratio(stats[ours], stats.get(peer))
            for ours in ("vz_as_is", "vz_bytecode")
            for peer in ("docker", "podman", "python_pass")
        },
    }
    peer_text = ", ".join(
        f"{name} {stats[name]['p50_ms']:.0f} ms" if name in stats else f"{name} not measured" for name in peers
    )
    out["headline"] = (
        f"vz exec -- true ({driver}, daemon warm) p50 {stats['vz_as_is']['p50_ms']:.0f} ms as-is, "
        f"{stats['vz_bytecode']['p50_ms']:.0f} ms bytecode cached (goal <= 60 and below peers); {peer_text}; "
        f"python -c pass {stats['python_pass']['p50_ms']:.0f} ms; cold (daemon + plugin start) "
        f"{out['cold_daemon_start']['p50_ms']:.0f} ms"
    )
    return out
