"""Build (once) and locate the ``vz-agent`` binary.

The agent is a static Go program shipped as source under ``go/``. It is built at first use into
``cache_dir()/agent/<digest>/vz-agent``, where ``<digest>`` is the SHA-256 of the Go sources and the target
platform, so a changed source tree gets a new binary and an unchanged one is never rebuilt. Builds happen in a
temporary directory and are renamed into place; a file lock makes concurrent callers (several processes)
wait for one build. Go's build cache is ``$GOCACHE`` when that is an absolute path (Go's own variable: state
homes then share compiled packages, and a build for a new home only links), else ``cache_dir()/agent/gocache``.
``VZ_AGENT_BINARY`` points at a prebuilt agent and skips all of this.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

from vz_core import paths
from vz_core.errors import UnavailableError
from vz_core.platform.locks import lock_file

__all__ = ["agent_source_digest", "agent_source_dir", "ensure_agent_binary"]

ENV_BINARY: Final = "VZ_AGENT_BINARY"
ENV_GOCACHE: Final = "GOCACHE"
_GOARCH: Final = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_BUILD_TIMEOUT: Final = 600.0


def agent_source_dir() -> Path:
    """The directory holding the agent's Go sources (package main)."""
    return Path(__file__).resolve().parent / "go"


def _host_goarch() -> str:
    machine = platform.machine().lower()
    try:
        return _GOARCH[machine]
    except KeyError:
        raise UnavailableError(f"the guest agent cannot be built for this machine architecture ({machine})") from None


def _sources() -> list[Path]:
    return sorted(path for path in agent_source_dir().glob("*.go") if not path.name.endswith("_test.go"))


def agent_source_digest(goarch: str | None = None, *, goos: str = "linux") -> str:
    """SHA-256 (hex) over the Go sources (names and contents) and the target ``<goos>/<goarch>``."""
    digest = hashlib.sha256()
    digest.update(f"{goos}/{goarch or _host_goarch()}\0".encode())
    for path in _sources():
        data = path.read_bytes()
        digest.update(f"{path.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def ensure_agent_binary(goarch: str | None = None, *, goos: str = "linux", cache_dir: Path | None = None) -> Path:
    """The path of a ``vz-agent`` binary for ``<goos>/<goarch>`` (default: ``linux`` and this machine's
    architecture), building it if needed. ``goos`` is ``linux`` (VM guests, linux_native) or ``darwin`` (macOS
    guests).

    Binaries live under ``cache_dir`` (default ``vz_core.paths.cache_dir() / "agent"``); Go's build cache is
    ``$GOCACHE`` when it is an absolute path, else ``<cache_dir>/gocache``.

    ``VZ_AGENT_BINARY`` (an executable file) wins when set. Otherwise the binary is built with ``go`` from
    PATH (Go >= 1.19, standard library only) at most once per source digest; concurrent callers wait for the
    build. Blocks for the duration of a build (seconds); call it through ``asyncio.to_thread`` from async code.

    Raises ``UnavailableError`` when ``VZ_AGENT_BINARY`` is not an executable file, when ``go`` is missing,
    or when the build fails (with the compiler output).
    """
    override = os.environ.get(ENV_BINARY)
    if override:
        candidate = Path(override)
        if not candidate.is_file() or not os.access(candidate, os.X_OK):
            raise UnavailableError(f"{ENV_BINARY}={override} is not an executable file; point it at a built vz-agent")
        return candidate.resolve()
    arch = goarch or _host_goarch()
    if arch not in ("amd64", "arm64"):
        raise UnavailableError(f"the guest agent is built for amd64 or arm64, not {arch!r}")
    if goos not in ("linux", "darwin"):
        raise UnavailableError(f"the guest agent is built for linux or darwin, not {goos!r}")
    base = cache_dir if cache_dir is not None else paths.cache_dir() / "agent"
    target = base / agent_source_digest(arch, goos=goos) / "vz-agent"
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise UnavailableError(
            "building the guest agent needs the Go toolchain (>= 1.19) on PATH: install golang-go (Debian) "
            f"or set {ENV_BINARY}=/path/to/vz-agent to a prebuilt agent"
        )
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".build.lock", "a+b") as lock:
        lock_file(lock.fileno())
        if target.is_file():  # another process built it while we waited
            return target
        _build(go, goos, arch, base, target)
    return target


def _go_cache(base: Path) -> Path:
    """Go's build cache: ``$GOCACHE`` when it is an absolute path (as ``go`` itself requires), else under ``base``."""
    configured = os.environ.get(ENV_GOCACHE, "")
    return Path(configured) if os.path.isabs(configured) else base / "gocache"


def _build(go: str, goos: str, goarch: str, base: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=base) as tmp:
        package = Path(tmp) / "gopath" / "src" / "vz-agent"
        package.mkdir(parents=True)
        for source in _sources():
            shutil.copyfile(source, package / source.name)
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("GO") and key not in ("CGO_ENABLED", "CC", "CGO_CFLAGS", "CGO_LDFLAGS")
        }
        env.update(
            GO111MODULE="off",
            GOPATH=str(Path(tmp) / "gopath"),
            GOCACHE=str(_go_cache(base)),
            GOFLAGS="",
            CGO_ENABLED="0",
            GOOS=goos,
            GOARCH=goarch,
            HOME=env.get("HOME", tmp),
        )
        output = Path(tmp) / "vz-agent"
        try:
            result = subprocess.run(
                [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(output), "."],
                cwd=package,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_BUILD_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise UnavailableError(f"building the guest agent took longer than {_BUILD_TIMEOUT:.0f} s") from None
        if result.returncode != 0:
            diagnostics = (result.stderr or result.stdout).decode(errors="replace").strip()[-4000:]
            raise UnavailableError(
                f"building the guest agent failed (go build exited {result.returncode})",
                runtime_message=diagnostics,
            )
        os.chmod(output, 0o755)
        os.replace(output, target)
