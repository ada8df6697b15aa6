"""B7: ``vz exec -- true`` end to end, whole-process timing (spawn of the ``vz`` process → it has been reaped).

The project is examples/default (its vz.json copied into a scratch directory, so no state is bound to the
source tree), on linux_native, with ``VZ_HOME`` in a scratch directory and the guest agent prebuilt
(``VZ_AGENT_BINARY``). ``vz up`` runs first (timed, reported), then:

* ``cold``: the first ``vz exec -- true`` after ``vz up`` (the first exec in the Machine; the host's page cache
  is warm from ``vz up``, this is not a cold boot of the host);
* ``as-is``: warm samples with the environment as it is (here ``PYTHONDONTWRITEBYTECODE=1``, so vz's modules
  without a cached ``.pyc`` are compiled at every start);
* ``bytecode``: warm samples with bytecode caching enabled (private ``PYTHONPYCACHEPREFIX``, after one
  warm-up run), interleaved with ``as-is``.

The ``vz`` console script of this interpreter is run directly: a version manager's shim in front of it (pyenv
adds about 300 ms here) is not vz's cost. ``vz delete`` runs at the end, then the driver's state is removed.
Where linux_native cannot run Machines, examples/fake is used instead, with a note.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from benchmarks._common import ROOT, bytecode_env, cli_env, linux_native_problem, run_timed, vz_script
from benchmarks._stats import summary

ID = "B7"
TITLE = "`vz exec -- true` end to end from the shell"


async def prepare_cli(ctx: Any, home: Path) -> tuple[str, Path | None]:
    """The driver to use (linux_native, else fake with a note) and a prebuilt agent for it."""
    problem = await linux_native_problem(ctx.workdir / "preflight")
    if problem:
        ctx.notes.append(f"linux_native cannot run Machines here ({problem}): measured on the fake driver instead")
        return "fake", None
    from vz_drivers.agent import ensure_agent_binary

    return "linux_native", await asyncio.to_thread(ensure_agent_binary)


async def cleanup_cli(home: Path) -> None:
    """Remove every Machine, mount, cgroup and network namespace the driver state under ``home`` still holds."""
    native = home / "drivers" / "linux_native"
    if native.is_dir():
        from vz_drivers.linux_native import cleanup_state

        await cleanup_state(str(native))


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
    log = workdir / "vz.log"
    n = ctx.n(30, 3)

    def vz_run(*args: str, cached: bool = False) -> float:
        result = run_timed([vz, *args], cwd=project, env=env_cached if cached else env, log=log, timeout=120)
        if not result.ok:
            raise RuntimeError(f"vz {' '.join(args)} exited {result.returncode}:\n{result.output}")
        return result.seconds

    as_is: list[float] = []
    cached: list[float] = []
    up = cold = delete = 0.0
    try:
        up = await asyncio.to_thread(vz_run, "up")
        cold = await asyncio.to_thread(vz_run, "exec", "--", "true")
        await asyncio.to_thread(vz_run, "exec", "--", "true", cached=True)  # warm-up: writes the bytecode cache
        for _ in range(n):
            as_is.append(await asyncio.to_thread(vz_run, "exec", "--", "true"))
            cached.append(await asyncio.to_thread(vz_run, "exec", "--", "true", cached=True))
        delete = await asyncio.to_thread(vz_run, "delete")
    finally:
        await cleanup_cli(home)

    warm, warm_cached = summary(as_is), summary(cached)
    return {
        "driver": driver,
        "example": f"examples/{example}",
        "vz": vz,
        "up_ms": round(up * 1000, 1),
        "cold_first_exec_ms": round(cold * 1000, 1),
        "warm_as_is": warm,
        "warm_bytecode_cached": warm_cached,
        "delete_ms": round(delete * 1000, 1),
        "headline": (
            f"vz exec -- true ({driver}) p50 {warm['p50_ms']:.0f} ms as-is, {warm_cached['p50_ms']:.0f} ms with "
            f"bytecode cached (goal <= 250); first exec after vz up {cold * 1000:.0f} ms; vz up {up * 1000:.0f} ms"
        ),
    }
