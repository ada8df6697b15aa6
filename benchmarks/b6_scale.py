"""B6: scale through the vz daemon. N Environments up concurrently, then ``true`` exec'd in each, then all deleted.

Each Environment is its own project (examples/default's vz.json with a unique ``project_id``, in its own
directory: one Machine on linux_native with a read-write workspace and egress allowed), all under one scratch
``VZ_HOME`` with the guest agent prebuilt. Every phase starts N ``vz`` processes at once (``vz up``, then
``vz exec -- true``, then ``vz delete``) and waits for all of them; nothing is retried. Every ``vz`` process is a
client of the one vz daemon of that ``VZ_HOME`` (started by the warm-up), which runs the driver's plugin.

Reported per N: the wall time of each phase and the cost per Environment (phase time / N), each process's
latency, failures (must be 0, with the first errors' output), the peak RSS of the ``vz`` processes, and the
memory of the running Machines (RSS and USS of each Machine's process tree, found through ``runc list``): vz runs
no per-Machine process on the host besides the Machine itself. A warm-up Environment is brought up and deleted
first (the image and the agent are then cached, as on a warm host). Everything is deleted afterwards and the
driver's state is removed. Where linux_native cannot run Machines, the fake driver is used, with a note.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks._common import ROOT, ProcResult, cli_env, gather_timed, rss_of_tree, rss_without, vz_script
from benchmarks._stats import summary
from benchmarks.b7_cli_exec import cleanup_cli, prepare_cli

ID = "B6"
TITLE = "scale: N Environments up concurrently, exec in each, delete"

_MIB = 1 << 20
SIZES = (50, 200)


def _host_rss(home: Path, machine_pids: list[int] | None = None) -> int:
    """RSS (bytes) of the daemon of ``home`` and its plugins: its process tree without the Machines'."""
    from vz_core.daemon import DaemonPaths, live_daemon

    record = live_daemon(DaemonPaths(str(home)))
    if record is None:
        return 0
    return rss_without(int(record["pid"]), machine_pids or [])


def _machines(home: Path) -> list[dict[str, Any]]:
    runc = shutil.which("runc")
    root = home / "drivers" / "linux_native" / "runc"
    if runc is None or not root.is_dir():
        return []
    result = subprocess.run([runc, "--root", str(root), "list", "-f", "json"], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"runc list failed: {result.stderr}")
    listed: list[dict[str, Any]] = json.loads(result.stdout or "null") or []
    return listed


def _phase(results: list[ProcResult], wall: float, n: int) -> dict[str, Any]:
    failed = [r for r in results if not r.ok]
    return {
        "wall_s": round(wall, 2),
        "per_environment_ms": round(wall / n * 1000, 1),
        "process_latency": summary([r.seconds for r in results]),
        "vz_process_peak_rss_mib": {
            "p50": round(sorted(r.max_rss_kib for r in results)[len(results) // 2] / 1024, 1),
            "max": round(max(r.max_rss_kib for r in results) / 1024, 1),
        },
        "failures": len(failed),
        "first_errors": [f"exit {r.returncode}: {r.output[-600:]}" for r in failed[:3]],
    }


async def run(ctx: Any) -> dict[str, Any]:
    workdir: Path = ctx.workdir
    home = workdir / "home"
    driver, agent = await prepare_cli(ctx, home)
    source = ROOT / "examples" / ("default" if driver == "linux_native" else "fake") / "vz.json"
    example = json.loads(source.read_text())
    example.pop("$schema", None)
    vz = vz_script()
    env = cli_env(home, agent)
    logs = workdir / "logs"
    logs.mkdir()

    def project(name: str) -> Path:
        where = workdir / "projects" / name
        where.mkdir(parents=True)
        (where / "vz.json").write_text(json.dumps({**example, "project_id": f"vz-bench-{name}"}, indent=2))
        return where

    async def phase(tag: str, dirs: list[Path], *args: str) -> tuple[list[ProcResult], float]:
        jobs = [([vz, *args], d, env, logs / f"{tag}-{d.name}.log") for d in dirs]
        t0 = time.perf_counter()
        results = await gather_timed(jobs, limit=600)
        return results, time.perf_counter() - t0

    override = tuple(int(x) for x in os.environ.get("VZ_BENCH_B6_SIZES", "").split(",") if x.strip())
    sizes = override or ctx.n(SIZES, (2,))
    if override:
        ctx.notes.append(f"sizes from VZ_BENCH_B6_SIZES: {override}")
    out: dict[str, Any] = {"driver": driver, "runs": {}}
    # The least a command started by gather_timed's spawner can report as its peak (`true`: the spawner's size).
    (floor,) = await gather_timed([(["true"], workdir, {"PATH": os.defpath}, logs / "floor.log")], limit=60)
    out["vz_process_peak_rss_floor_mib"] = round(floor.max_rss_kib / 1024, 1)
    try:
        warm = [project("warmup")]
        for tag, args in (("up", ("up",)), ("exec", ("exec", "--", "true")), ("delete", ("delete",))):
            results, _ = await phase(f"warmup-{tag}", warm, *args)
            if not results[0].ok:
                raise RuntimeError(f"warm-up `vz {tag}` failed: {results[0].output}")
        for n in sizes:
            dirs = [project(f"n{n}-{i:02d}") for i in range(n)]
            host_before = _host_rss(home)
            ups, up_wall = await phase(f"n{n}-up", dirs, "up")
            machines = [m for m in _machines(home) if m.get("status") == "running"]
            mem = [rss_of_tree(int(m["pid"])) for m in machines]
            host_after = _host_rss(home, [int(m["pid"]) for m in machines])
            execs, exec_wall = await phase(f"n{n}-exec", dirs, "exec", "--", "true")
            deletes, delete_wall = await phase(f"n{n}-delete", dirs, "delete")
            left = _machines(home)
            run_data: dict[str, Any] = {
                "environments": n,
                "up": _phase(ups, up_wall, n),
                "exec": _phase(execs, exec_wall, n),
                "delete": _phase(deletes, delete_wall, n),
                "machines_running_after_up": len(machines) if driver == "linux_native" else None,
                "machines_left_after_delete": len(left),
            }
            if mem:
                run_data["machine_memory_mib"] = {
                    "rss_mean": round(sum(r for r, _ in mem) / len(mem) / _MIB, 2),
                    "uss_mean": round(sum(u for _, u in mem) / len(mem) / _MIB, 2),
                    "rss_total": round(sum(r for r, _ in mem) / _MIB, 1),
                }
            if host_after:
                run_data["daemon_and_plugins_rss_mib"] = {
                    "before_up": round(host_before / _MIB, 1),
                    "after_up": round(host_after / _MIB, 1),
                    "per_environment": round((host_after - host_before) / n / _MIB, 3),
                }
            run_data["failures"] = sum(run_data[p]["failures"] for p in ("up", "exec", "delete")) + len(left)
            out["runs"][f"n{n}"] = run_data
    finally:
        await cleanup_cli(home, env)

    last = out["runs"][f"n{max(sizes)}"]
    failures = sum(r["failures"] for r in out["runs"].values())
    out["failures"] = failures
    mem_text = ""
    if "machine_memory_mib" in last:
        mm = last["machine_memory_mib"]
        mem_text = f", Machine RSS {mm['rss_mean']} MiB (USS {mm['uss_mean']} MiB) each"
    if "daemon_and_plugins_rss_mib" in last:
        dm = last["daemon_and_plugins_rss_mib"]
        mem_text += f", daemon + plugins {dm['after_up']} MiB ({dm['per_environment'] * 1024:.0f} KiB/Environment)"
    out["headline"] = (
        f"{last['environments']} Environments ({driver}): up {last['up']['wall_s']} s "
        f"({last['up']['per_environment_ms']:.0f} ms/Environment), exec {last['exec']['wall_s']} s, delete "
        f"{last['delete']['wall_s']} s{mem_text}; failures {failures} (goal: 200, none failing)"
    )
    return out
