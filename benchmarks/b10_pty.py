"""B10: interactive terminals through `vz exec -it`: keystroke-to-echo latency and bulk output.

The real CLI runs on a pseudo-terminal of this host (as in a terminal emulator), into a Machine of the project
examples/default on linux_native (examples/fake, with a note, where linux_native cannot run Machines or its
Machines serve no terminal sessions):

* ``echo``: `vz exec -it -- cat`; one byte is typed at a time and the time until the Machine's terminal echo
  of it is back on the local terminal is measured (the path of every keystroke: local terminal → vz → driver
  → the Machine's terminal → back). Target: p50 at most 5 ms.
* ``bulk``: `vz exec -t` of a command writing 64 MiB (no newline, so the terminal changes no byte) to its
  terminal; vz's stdout is a pipe read as fast as possible; MiB/s of the whole run.
"""

from __future__ import annotations

import asyncio
import os
import pty
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks._common import ROOT, cli_env, vz_script
from benchmarks._stats import summary
from benchmarks.b7_cli_exec import cleanup_cli, prepare_cli

ID = "B10"
TITLE = "`vz exec -it`: keystroke-to-echo latency and 64 MiB through the terminal"

BULK = 64 * 1024 * 1024


def _read_until(fd: int, wanted: bytes, timeout: float) -> bytes:
    """Read ``fd`` until ``wanted`` shows up (returns everything read); TimeoutError after ``timeout`` s."""
    deadline = time.perf_counter() + timeout
    seen = b""
    while wanted not in seen:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError(f"no {wanted!r} within {timeout} s; got {seen[-200:]!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                raise EOFError(f"the terminal closed before {wanted!r}; got {seen[-200:]!r}")
            seen += chunk
    return seen


def _echo_latency(vz: str, project: Path, env: dict[str, str], samples: int) -> list[float]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [vz, "exec", "-it", "--", "sh", "-c", "echo ready; exec cat"],
        cwd=project,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    out: list[float] = []
    try:
        _read_until(master, b"ready", 60)
        keys = b"abcdefghijklmnopqrstuvwxyz"
        for i in range(samples + 3):
            key = keys[i % len(keys) : i % len(keys) + 1]
            t0 = time.perf_counter()
            os.write(master, key)
            _read_until(master, key, 10)
            if i >= 3:  # the first keystrokes warm the path up
                out.append(time.perf_counter() - t0)
        os.write(master, b"\r\x04")  # end cat's line, then end of file: the session ends, vz exits 0
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return out


def _bulk(vz: str, project: Path, env: dict[str, str]) -> tuple[float, int]:
    argv = [vz, "exec", "-t", "--", "sh", "-c", f"head -c {BULK} /dev/zero | tr '\\000' v"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=project, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    total = 0
    while chunk := proc.stdout.read(1 << 20):
        total += len(chunk)
    proc.wait()
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"vz exec -t exited {proc.returncode}")
    return seconds, total


def _vz_ok(
    vz: str, project: Path, env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run([vz, *args], cwd=project, env=env, capture_output=True, timeout=600, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(
            f"vz {' '.join(args)} exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}"
        )
    return done


async def run(ctx: Any) -> dict[str, Any]:
    workdir: Path = ctx.workdir
    home = workdir / "home"
    driver, agent = await prepare_cli(ctx, home)
    vz = vz_script()
    env = cli_env(home, agent)
    env["TERM"] = "xterm"
    project = workdir / "project"
    project.mkdir()
    example = "default" if driver == "linux_native" else "fake"
    shutil.copyfile(ROOT / "examples" / example / "vz.json", project / "vz.json")
    try:
        await asyncio.to_thread(_vz_ok, vz, project, env, "up")
        probe = await asyncio.to_thread(_vz_ok, vz, project, env, "exec", "-t", "--", "true", check=False)
        if probe.returncode != 0 and driver != "fake":
            ctx.notes.append(
                f"{driver} Machines serve no terminal sessions here ({probe.stderr.decode(errors='replace').strip()}):"
                " measured on the fake driver instead"
            )
            await asyncio.to_thread(_vz_ok, vz, project, env, "delete", check=False)
            await cleanup_cli(home)
            driver, example = "fake", "fake"
            shutil.copyfile(ROOT / "examples" / "fake" / "vz.json", project / "vz.json")
            await asyncio.to_thread(_vz_ok, vz, project, env, "up")
        latencies = await asyncio.to_thread(_echo_latency, vz, project, env, ctx.n(200, 20))
        bulk_s, total = await asyncio.to_thread(_bulk, vz, project, env)
        if total != BULK:
            raise RuntimeError(f"the terminal delivered {total} bytes of {BULK}")
        await asyncio.to_thread(_vz_ok, vz, project, env, "delete", check=False)
    finally:
        await cleanup_cli(home)
    echo = summary(latencies)
    mib_s = BULK / (1024 * 1024) / bulk_s
    return {
        "driver": driver,
        "example": f"examples/{example}",
        "echo": echo,
        "bulk_bytes": total,
        "bulk_seconds": round(bulk_s, 3),
        "bulk_mib_s": round(mib_s, 1),
        "headline": (
            f"keystroke->echo through vz exec -it ({driver}) p50 {echo['p50_ms']:.2f} ms (goal <= 5); "
            f"64 MiB through the terminal in {bulk_s:.2f} s ({mib_s:.0f} MiB/s, whole vz exec -t run)"
        ),
    }
