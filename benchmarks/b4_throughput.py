"""B4: ``cat`` of 256 MiB into a linux_native Machine and back, SHA-256 checked, on each path bytes can take.

* ``fast path``: the real ``vz exec --pass-pipes -- cat`` process with the daemon warm, its stdin and stdout
  pipes of this process (``--pass-pipes``: an output pipe is otherwise copied, docs/cli.md): the CLI passes
  both descriptors to the daemon, the daemon to the driver's plugin, the plugin to the guest agent, so ``cat``
  in the Machine reads and writes this process's pipes (no copy on the host);
* ``gRPC frames``: the linux_native plugin launched directly (``RemoteDriver(local_exec=False)``, as a host
  that is not vz talks to a plugin), ``RemoteDriver.exec`` with the input in 1 MiB stdin frames and the output
  consumed as ExecOutput events; and ``exec_local`` over the same frames (the copying default a host uses for
  descriptors when the plugin has no local exec socket);
* peers: ``docker exec -i <c> cat`` and ``podman exec -i <c> cat`` (``benchmarks/_peers.py``) with the same data.

Subprocess cases are timed from spawn to EOF on stdout and the process reaped (whole-command throughput), and also
from the first output byte to EOF (``streaming``). The output is read into a preallocated buffer and hashed after
the clock stops (SHA-256 runs at about 550 MiB/s here: hashing inline would measure the hash). Each case runs
``rounds`` times, interleaved; the median round is reported.

Memory with a paused reader: ``cat /dev/zero`` into a pipe nobody reads after its first byte; RSS of every process
on the path (the ``vz`` CLI, the daemon, the plugin, the guest agent; for frames: this process as the host, the
plugin and the agent) right after the first byte and 2 s later (growth goal ≤ 32 MiB each).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import ROOT, cli_env, linux_native_problem, vz_script
from benchmarks._peers import Peer, docker_peer, podman_peer

ID = "B4"
TITLE = "cat 256 MiB through vz exec (fds passed) and over gRPC frames, linux_native; docker/podman exec -i peers"

_MIB = 1 << 20
_BLOCK = _MIB


def _data(total: int) -> tuple[bytes, str]:
    block = os.urandom(_BLOCK)
    digest = hashlib.sha256()
    for _ in range(total // _BLOCK):
        digest.update(block)
    return block, digest.hexdigest()


def _pump(
    argv: Sequence[str], env: dict[str, str], cwd: Path, block: bytes, total: int, sink: memoryview
) -> dict[str, Any]:
    """Run ``argv`` with ``total`` bytes on stdin and its stdout read into ``sink``: times and the output size."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    errors: list[bytes] = []

    def feed() -> None:
        fd = proc.stdin.fileno()  # type: ignore[union-attr]
        try:
            for _ in range(total // len(block)):
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view) :]
        except BrokenPipeError:
            pass
        finally:
            proc.stdin.close()  # type: ignore[union-attr]

    def drain_err() -> None:
        errors.append(proc.stderr.read())  # type: ignore[union-attr]

    threads = [threading.Thread(target=feed), threading.Thread(target=drain_err)]
    for t in threads:
        t.start()
    fd = proc.stdout.fileno()
    got = 0
    first = 0.0
    while got < len(sink):
        n = os.readv(fd, [sink[got : got + 4 * _MIB]])
        if not n:
            break
        if not got:
            first = time.perf_counter()
        got += n
    extra = proc.stdout.read(1)
    code = proc.wait()
    end = time.perf_counter()
    for t in threads:
        t.join()
    proc.stdout.close()
    if code != 0 or extra:
        raise RuntimeError(f"{' '.join(argv[:4])} exited {code}: {b''.join(errors)[-600:]!r}")
    return {"seconds": end - t0, "streaming_seconds": end - first if first else end - t0, "bytes": got}


def _check(sink: memoryview, got: int, total: int, expected: str, what: str) -> None:
    if got != total or hashlib.sha256(sink[:got]).hexdigest() != expected:
        raise RuntimeError(f"{what}: cat returned other bytes ({got} of {total})")


def _figure(rounds: list[dict[str, Any]], total: int) -> dict[str, Any]:
    ordered = sorted(rounds, key=lambda r: r["seconds"])
    mid = ordered[len(ordered) // 2]
    out = {
        "rounds": len(rounds),
        "seconds": round(mid["seconds"], 3),
        "mib_per_s": round(total / mid["seconds"] / _MIB, 1),
        "all_mib_per_s": [round(total / r["seconds"] / _MIB, 1) for r in rounds],
    }
    if "streaming_seconds" in mid:
        out["streaming_mib_per_s"] = round(total / mid["streaming_seconds"] / _MIB, 1)
    return out


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds of each process so far (0 for one that is gone)."""
    import psutil

    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            times = psutil.Process(pid).cpu_times()
            out[name] = float(times.user + times.system)
        except psutil.Error:
            out[name] = 0.0
    return out


def _rss(pid: int) -> int:
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


async def _growth(pids: dict[str, int], seconds: float = 2.0) -> dict[str, float]:
    before = {k: _rss(p) for k, p in pids.items()}
    await asyncio.sleep(seconds)
    return {k: round((_rss(p) - before[k]) / _MIB, 2) for k, p in pids.items() if before[k]}


def _daemon_pids(home: Path, env: dict[str, str]) -> dict[str, int]:
    """The daemon's pid and its linux_native plugin's (System.Status), and the Machine's guest agent."""
    from vz_core.daemon import connect

    with connect(str(home), environ=env, autostart=False) as conn:
        status = conn.request("System.Status", {})
    (plugin,) = [p for p in status["plugins"] if p["name"] == "linux_native"]
    return {"daemon": int(status["pid"]), "plugin": int(plugin["pid"])}


def _agent_pid(state: Path) -> int:
    """The guest agent of the one running Machine under the linux_native state dir ``state``."""
    import json

    import psutil

    out = subprocess.run(
        ["runc", "--root", str(state / "runc"), "list", "-f", "json"], capture_output=True, check=True
    ).stdout
    running = [c for c in json.loads(out or b"null") or [] if c.get("status") == "running"]
    for container in running:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(int(container["pid"]))
            for proc in [root, *root.children(recursive=True)]:
                if "serve" in proc.cmdline() and proc.cmdline()[0].endswith("agent"):
                    pid: int = proc.pid
                    return pid
    return 0


async def _paused_cli(vz: str, env: dict[str, str], project: Path, home: Path, state: Path) -> dict[str, float]:
    out_r, out_w = os.pipe()
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [vz, "exec", "--pass-pipes", "--", "cat", "/dev/zero"],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out_w,
    )
    os.close(out_w)
    try:
        await asyncio.to_thread(os.read, out_r, 1)
        pids = {"cli": proc.pid, **_daemon_pids(home, env), "agent": _agent_pid(state)}
        return await _growth(pids)
    finally:
        proc.terminate()
        os.close(out_r)
        await asyncio.to_thread(proc.wait)


async def _no_input() -> AsyncIterator[bytes]:
    return
    yield b""


async def _frames_events(driver: Any, wid: str, block: bytes, total: int, sink: memoryview) -> dict[str, Any]:
    from vz_core import ExecOutput, ExecSpec

    async def stdin() -> AsyncIterator[bytes]:
        for _ in range(total // len(block)):
            yield block

    got = 0
    t0 = time.perf_counter()
    async for event in driver.exec(ExecSpec(wid, ("cat",)), stdin()):
        if isinstance(event, ExecOutput):
            n = len(event.data)
            if got + n > len(sink):
                raise RuntimeError("cat returned more bytes than it was given")
            sink[got : got + n] = event.data
            got += n
    return {"seconds": time.perf_counter() - t0, "bytes": got}


async def _frames_local(driver: Any, wid: str, block: bytes, total: int, sink: memoryview) -> dict[str, Any]:
    from vz_core import ExecSpec

    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    got = [0]

    def feed() -> None:
        try:
            for _ in range(total // len(block)):
                view = memoryview(block)
                while view:
                    view = view[os.write(in_w, view) :]
        finally:
            os.close(in_w)

    def drain() -> None:
        while True:
            n = os.readv(out_r, [sink[got[0] : got[0] + 4 * _MIB]])
            if not n:
                return
            got[0] += n

    threads = [threading.Thread(target=feed), threading.Thread(target=drain)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    try:
        exit_ = await driver.exec_local(wid, ExecSpec(wid, ("cat",)), (in_r, out_w, null))
    finally:
        os.close(in_r)
        os.close(out_w)
        os.close(null)
    for t in threads:
        await asyncio.to_thread(t.join)
    seconds = time.perf_counter() - t0
    os.close(out_r)
    if not exit_.success:
        raise RuntimeError(f"cat over frames ended {exit_}")
    return {"seconds": seconds, "bytes": got[0]}


async def _paused_frames(driver: Any, wid: str, agent: int) -> dict[str, float]:
    from vz_core import ExecSpec

    out_r, out_w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    task = asyncio.create_task(driver.exec_local(wid, ExecSpec(wid, ("cat", "/dev/zero")), (null, out_w, null)))
    try:
        await asyncio.to_thread(os.read, out_r, 1)
        return await _growth({"host": os.getpid(), "plugin": driver.connection.pid, "agent": agent})
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        os.close(out_r)
        os.close(out_w)
        os.close(null)


def _frames_driver(workdir: Path, agent: str) -> Any:
    from vz_core.rpc import RemoteDriver
    from vz_core.transport import LaunchSpec, PluginLauncher

    script = workdir / "vz-driver-linux_native"
    script.write_text(f"#!{sys.executable}\nfrom vz_drivers.linux_native.registration import main\nmain()\n")
    script.chmod(0o755)
    argv = [str(script), "--state-dir", str(workdir / "frames-state"), "--image-dir", str(workdir / "frames-images")]
    argv += ["--option", f"agent_binary={agent}"]
    return RemoteDriver(PluginLauncher(lambda: LaunchSpec("linux_native", argv), name="linux_native"), local_exec=False)


async def run(ctx: Any) -> dict[str, Any]:
    workdir: Path = ctx.workdir
    problem = await linux_native_problem(workdir / "preflight")
    if problem:
        ctx.notes.append(f"not measured: linux_native cannot run Machines here: {problem}")
        return {"headline": "not measured: linux_native unavailable (see notes)", "measured": False}
    from benchmarks.b7_cli_exec import cleanup_cli
    from vz_core import RunImageRequest
    from vz_drivers.agent import ensure_agent_binary
    from vz_drivers.linux_native import cleanup_state

    agent = str(await asyncio.to_thread(ensure_agent_binary))
    total = (16 if ctx.smoke else 256) * _MIB
    rounds = ctx.n(3, 1)
    block, expected = _data(total)
    sink = memoryview(bytearray(total))
    home = workdir / "home"
    project = workdir / "project"
    project.mkdir()
    shutil.copyfile(ROOT / "examples" / "default" / "vz.json", project / "vz.json")
    vz = vz_script()
    env = cli_env(home, Path(agent))
    frames = _frames_driver(workdir, agent)
    wid = "b4-frames"
    samples: dict[str, list[dict[str, Any]]] = {}
    out: dict[str, Any] = {"measured": True, "bytes": total, "block_bytes": _BLOCK}
    try:
        async with docker_peer(workdir, ctx.notes) as docker, podman_peer(workdir, ctx.notes) as podman:
            up = await asyncio.to_thread(
                subprocess.run, [vz, "up"], cwd=project, env=env, capture_output=True, check=False
            )
            if up.returncode != 0:
                raise RuntimeError(f"vz up failed: {up.stderr.decode()[-2000:]}")
            await frames.run_image(RunImageRequest(workspace_id=wid, image="vz:default", args=("sleep", "100000000")))

            def cli_case(argv: list[str]) -> Callable[[], Awaitable[dict[str, Any]]]:
                return lambda: asyncio.to_thread(_pump, argv, env, project, block, total, sink)

            cases: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
                "fast_path_vz_exec": cli_case([vz, "exec", "--pass-pipes", "--", "cat"]),
                "grpc_frames_exec": lambda: _frames_events(frames, wid, block, total, sink),
                "grpc_frames_exec_local": lambda: _frames_local(frames, wid, block, total, sink),
            }
            peers: dict[str, Peer | None] = {"docker": docker, "podman": podman}
            for name, peer in peers.items():
                if peer is not None:
                    cases[f"peer_{name}_exec_i"] = cli_case(peer.exec_argv("cat", interactive=True))
            frame_pids = {
                "host": os.getpid(),
                "plugin": frames.connection.pid if frames.connection is not None else 0,
                "agent": _agent_pid(workdir / "frames-state"),
            }
            cpu: dict[str, dict[str, float]] = {}
            for _ in range(rounds):
                for name, case in cases.items():
                    before = _cpu(frame_pids) if name.startswith("grpc_frames") else {}
                    result = await case()
                    if before:
                        after = _cpu(frame_pids)
                        spent = cpu.setdefault(name, dict.fromkeys(frame_pids, 0.0))
                        for key in frame_pids:
                            spent[key] += after[key] - before[key]
                    _check(sink, result["bytes"], total, expected, name)
                    samples.setdefault(name, []).append(result)
            for name, values in samples.items():
                out[name] = _figure(values, total)
                if name in cpu:
                    # CPU per MiB moved, per process on the path: what the loaded machine's wall time hides.
                    moved = total * len(values) / _MIB
                    out[name]["cpu_ms_per_mib"] = {k: round(v * 1000 / moved, 2) for k, v in cpu[name].items()}
            for name, peer in peers.items():
                out.setdefault(f"peer_{name}_exec_i", None)
                if peer is not None:
                    out[f"peer_{name}_exec_i"]["version"] = peer.version
            native = home / "drivers" / "linux_native"
            out["paused_reader_rss_growth_mib"] = {
                "fast_path_vz_exec": await _paused_cli(vz, env, project, home, native),
                "grpc_frames": await _paused_frames(frames, wid, _agent_pid(workdir / "frames-state")),
            }
            await asyncio.to_thread(subprocess.run, [vz, "delete"], cwd=project, env=env, capture_output=True)
    finally:
        with contextlib.suppress(Exception):
            await frames.close()
        await cleanup_state(str(workdir / "frames-state"), image_dir=str(workdir / "frames-images"), agent_binary=agent)
        await cleanup_cli(home, env)

    growth = out["paused_reader_rss_growth_mib"]
    worst = max(v for case in growth.values() for v in case.values())
    peer_text = ", ".join(
        f"{name} {out[f'peer_{name}_exec_i']['mib_per_s']:.0f}"
        for name in ("docker", "podman")
        if out.get(f"peer_{name}_exec_i")
    )
    out["headline"] = (
        f"cat {total >> 20} MiB: vz exec fast path {out['fast_path_vz_exec']['mib_per_s']:.0f} MiB/s "
        f"(goal >= 1024), gRPC frames exec {out['grpc_frames_exec']['mib_per_s']:.0f} / exec_local "
        f"{out['grpc_frames_exec_local']['mib_per_s']:.0f} MiB/s (goal >= 150); peers exec -i: {peer_text or 'none'} "
        f"MiB/s; paused reader: max RSS growth {worst:.1f} MiB (goal <= 32)"
    )
    return out
