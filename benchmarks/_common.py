"""Helpers shared by the benchmarks: plugin launch specs, the Go peer, bytecode environments, subprocess timing."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vz_core import Driver, ExecExit
    from vz_core.transport import LaunchSpec

__all__ = [
    "FAKE_FACTORY",
    "ROOT",
    "ProcResult",
    "bytecode_env",
    "cli_env",
    "exec_true",
    "fake_spec",
    "gather_timed",
    "go_peer_bin",
    "go_spec",
    "linux_native_problem",
    "rss_of_tree",
    "rss_without",
    "run_timed",
    "uncached_modules",
    "vz_script",
]

ROOT = Path(__file__).resolve().parents[1]
FAKE_FACTORY = "vz_conformance.fake:FakeDriver"
_GO_SOURCES = ("tests/go/build.sh", "tests/go/src", "protocol")


# --- plugins ------------------------------------------------------------------------------------------------


def fake_spec(state_dir: Path, *, plaintext: bool = False, env: Mapping[str, str] | None = None) -> LaunchSpec:
    """The fake driver's plugin launched the way vz launches a built-in driver (``python -m vz_plugins``)."""
    from vz_core.transport import LaunchSpec

    options = {"VZ_DRIVER_OPTIONS": json.dumps({"state_dir": str(state_dir)})}
    return LaunchSpec(
        "fake", [sys.executable, "-m", "vz_plugins", FAKE_FACTORY], env={**options, **(env or {})}, plaintext=plaintext
    )


def go_spec(binary: Path, *, plaintext: bool = False) -> LaunchSpec:
    """The Go peer: a go-plugin plugin (tests/go) with in-memory Machines."""
    from vz_core.transport import LaunchSpec

    return LaunchSpec("go-peer", [str(binary)], plaintext=plaintext)


def _go_digest() -> str:
    """The peer's sources, and the toolchain that builds them (a Go or protoc upgrade builds it again)."""
    digest = hashlib.sha256()
    for tool in (["go", "version"], ["protoc", "--version"]):
        found = subprocess.run(tool, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
        digest.update(f"{tool[0]}={found.stdout.strip()}\0".encode())
    for rel in _GO_SOURCES:
        base = ROOT / rel
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in files:
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def go_peer_bin(notes: list[str]) -> Path | None:
    """``vz-go-plugin`` built from tests/go, cached by source digest; None (with a note) when Go is missing.

    ``VZ_BENCH_GO_BIN`` names a directory holding a prebuilt ``vz-go-plugin`` and wins. Otherwise the peer is
    built once per source digest under ``<vz cache dir>/bench-go`` (about 20-60 s on 2 cores, then reused).
    """
    override = os.environ.get("VZ_BENCH_GO_BIN")
    if override:
        binary = Path(override) / "vz-go-plugin"
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f"VZ_BENCH_GO_BIN={override}: no executable vz-go-plugin there")
        return binary
    if shutil.which("go") is None or shutil.which("protoc-gen-go-grpc") is None or shutil.which("protoc") is None:
        notes.append("Go peer not measured: go, protoc or protoc-gen-go-grpc is missing (install golang-go etc.)")
        return None
    from vz_core.paths import cache_dir

    out = cache_dir() / "bench-go"
    binary = out / "bin" / "vz-go-plugin"
    stamp = out / "bin" / "SOURCE_DIGEST"
    digest = _go_digest()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".build.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
            return binary
        t0 = time.perf_counter()
        result = subprocess.run(
            ["bash", str(ROOT / "tests" / "go" / "build.sh"), str(out)],
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise RuntimeError(f"building the Go peer failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
        stamp.write_text(digest + "\n")
        notes.append(f"built the Go peer (tests/go) in {time.perf_counter() - t0:.0f} s; cached in {out}")
    return binary


# --- bytecode -----------------------------------------------------------------------------------------------


def bytecode_env(prefix: Path) -> dict[str, str]:
    """Environment overrides that enable bytecode caching into a private ``prefix`` (nothing written in the tree).

    ``PYTHONDONTWRITEBYTECODE`` set to the empty string counts as unset.
    """
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(prefix)}


_UNCACHED_PROBE = r"""
import importlib.util, json, os, sys
for name in sys.argv[1:]:
    __import__(name)
missing = []
total = 0
for name, mod in list(sys.modules.items()):
    src = getattr(mod, "__file__", None)
    if not src or not src.endswith(".py"):
        continue
    total += 1
    try:
        cached = importlib.util.cache_from_source(src)
        with open(cached, "rb") as f:
            head = f.read(16)
        st = os.stat(src)
        flags = int.from_bytes(head[4:8], "little")
        ok = flags != 0 or (
            int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF
        )
    except OSError:
        ok = False
    if not ok:
        missing.append(name)
print(json.dumps({"modules": total, "without_cached_bytecode": sorted(missing)}))
"""


def uncached_modules(imports: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Which of the Python modules pulled in by ``imports`` would be compiled from source at start-up."""
    result = subprocess.run(
        [sys.executable, "-c", _UNCACHED_PROBE, *imports],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )
    data: dict[str, Any] = json.loads(result.stdout)
    names: list[str] = data["without_cached_bytecode"]
    return {
        "modules": data["modules"],
        "without_cached_bytecode": len(names),
        "examples": names[:12],
    }


# --- drivers ------------------------------------------------------------------------------------------------


async def _no_stdin() -> AsyncIterator[bytes]:
    return
    yield b""


async def exec_true(driver: Driver, workspace_id: str) -> ExecExit:
    """Run ``true`` in the Machine and check it succeeded."""
    from vz_core import ExecExit, ExecSpec

    exit_: ExecExit | None = None
    async for event in driver.exec(ExecSpec(workspace_id, ("true",)), _no_stdin()):
        if isinstance(event, ExecExit):
            exit_ = event
    if exit_ is None or not exit_.success:
        raise RuntimeError(f"`true` in {workspace_id} did not succeed: {exit_}")
    return exit_


async def linux_native_problem(state_dir: Path) -> str:
    """Why linux_native cannot run Machines here (its Preflight's message), or "" when it can."""
    from vz_core.errors import VzError

    try:
        from vz_drivers.linux_native import LinuxNativeDriver

        driver = LinuxNativeDriver(state_dir=state_dir)
        try:
            await driver.preflight()
        finally:
            await driver.close()
    except VzError as exc:
        return str(exc)
    return ""


# --- the CLI ------------------------------------------------------------------------------------------------


def vz_script() -> str:
    """The installed ``vz`` console script of this interpreter (not a version manager's shim)."""
    script = Path(sysconfig.get_path("scripts")) / "vz"
    if script.is_file():
        return str(script)
    found = shutil.which("vz")
    if found is None:
        raise RuntimeError("the vz console script is not installed (pip install -e .)")
    return found


def cli_env(home: Path, agent: Path | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``vz`` subprocess: its own ``VZ_HOME``, a prebuilt agent, nothing selected."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_")}
    env["VZ_HOME"] = str(home)
    if agent is not None:
        env["VZ_AGENT_BINARY"] = str(agent)
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class ProcResult:
    """One finished subprocess: exit code, wall seconds (spawn → reaped), peak RSS, and its output's tail."""

    returncode: int
    seconds: float
    max_rss_kib: int
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _reset_peak_rss() -> None:
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_timed(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: Path, timeout: float = 300.0
) -> ProcResult:
    """Run ``argv`` to completion (blocking): wall time and the child's peak RSS (``wait4``).

    A child's peak RSS starts at its parent's peak (Linux copies the high-water mark at fork and keeps it through
    exec), so the benchmark process's own peak (B4 holds 256 MiB) is reset first (``/proc/self/clear_refs``); that
    lowers it only to this process's current size, so the peak is at least that. ``gather_timed`` reports the
    command's own peak (a fresh spawner starts it).
    """
    from benchmarks._timed import wait_timed

    _reset_peak_rss()
    code, seconds, max_rss_kib = wait_timed(argv, cwd=str(cwd), env=env, log=str(log), timeout=timeout)
    text = log.read_text(errors="replace")
    return ProcResult(code, seconds, max_rss_kib, text[-2000:])


async def gather_timed(
    jobs: Sequence[tuple[Sequence[str], Path, Mapping[str, str], Path]], limit: float = 300.0
) -> list[ProcResult]:
    """Start every job at once and wait for all of them: wall time and each command's own peak RSS.

    The commands are started by a fresh spawner process (``benchmarks._spawner``), not by this one: a command
    started from here would report at least this process's resident size as its peak (``run_timed``)."""
    from benchmarks._spawner import Spawner

    def result(doc: dict[str, Any], log: Path) -> ProcResult:
        text = log.read_text(errors="replace")
        return ProcResult(int(doc["returncode"]), float(doc["seconds"]), int(doc["max_rss_kib"]), text[-2000:])

    spawner = await asyncio.to_thread(Spawner)
    try:
        docs = await asyncio.gather(
            *(spawner.run(argv, cwd=cwd, env=env, log=log, limit=limit) for argv, cwd, env, log in jobs)
        )
    finally:
        await asyncio.to_thread(spawner.close)
    return [result(doc, log) for doc, (_, _, _, log) in zip(docs, jobs, strict=True)]


def rss_of_tree(pid: int) -> tuple[int, int]:
    """(RSS, USS) in bytes of process ``pid`` and all its descendants (0, 0 if it is gone)."""
    import psutil

    rss = uss = 0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                info = proc.memory_full_info()
                rss += info.rss
                uss += info.uss
    return rss, uss


def rss_without(pid: int, excluded_roots: Sequence[int]) -> int:
    """RSS in bytes of process ``pid`` and its descendants, leaving out the trees rooted at ``excluded_roots``."""
    import psutil

    skip: set[int] = set()
    for root in excluded_roots:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(root)
            skip |= {root, *(p.pid for p in proc.children(recursive=True))}
    rss = 0
    with contextlib.suppress(psutil.Error):
        top = psutil.Process(pid)
        for proc in [top, *top.children(recursive=True)]:
            if proc.pid in skip:
                continue
            with contextlib.suppress(psutil.Error):
                rss += proc.memory_info().rss
    return rss


def importable(name: str) -> bool:
    """Whether module ``name`` can be imported (without importing it)."""
    return importlib.util.find_spec(name) is not None
