"""Container peers measured in the same run as vz: ``docker exec`` and ``podman exec`` of the same command.

Each peer runs entirely inside the benchmark's scratch directory and is removed afterwards:

* docker: a private ``dockerd`` (Debian's docker.io) with its own data root, exec root, socket, pid file and
  containerd namespace, started with ``--iptables=false --bridge=none`` so it touches no host networking; the
  container runs with ``--network none``. A system docker, if any, is never used.
* podman (Debian's podman 4.3): its own ``--root``/``--runroot`` (vfs storage, cgroupfs manager, no events
  log); here its runc refuses the default rlimits (raising RLIMIT_NOFILE/NPROC above what the host grants), so
  the container gets ``--ulimit nofile=1024:1024 --ulimit nproc=1024:1024``.

The image of both is a one-layer import of the host's static busybox (``sh``, ``true``, ``sleep``, ``cat``):
no download. A peer that is not installed or does not start is reported with the reason, never faked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Peer", "busybox_rootfs_tar", "docker_peer", "podman_peer"]

DOCKER = "/usr/bin/docker"
DOCKERD = "/usr/sbin/dockerd"
PODMAN = "/usr/bin/podman"
IMAGE = "vzbench:busybox"
APPLETS = ("sh", "true", "sleep", "cat")


@dataclass(frozen=True)
class Peer:
    """A running peer container: ``exec_argv(*cmd)`` is the host command that runs ``cmd`` in it."""

    name: str
    version: str
    base: tuple[str, ...]
    container: str

    def exec_argv(self, *cmd: str, interactive: bool = False) -> list[str]:
        return [*self.base, "exec", *(["-i"] if interactive else []), self.container, *cmd]


def busybox_rootfs_tar(workdir: Path) -> Path:
    """A tarball of a minimal root filesystem: the host's static busybox and a few applet links."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not Path(busybox).is_file():
        raise RuntimeError("busybox is not installed (Debian: busybox-static)")
    tar_path = workdir / "busybox-rootfs.tar"
    if tar_path.exists():
        return tar_path
    with tarfile.open(tar_path, "w") as tar:
        info = tarfile.TarInfo("bin")
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    return tar_path


def _run(argv: list[str], timeout: float = 120.0) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return proc.stdout.strip()


def _unmount_under(root: Path) -> None:
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _start_dockerd(root: Path) -> tuple[subprocess.Popen[bytes], tuple[str, ...], str]:
    sock = root / "docker.sock"
    with open(root / "dockerd.log", "wb") as log:
        daemon = subprocess.Popen(
            [
                DOCKERD,
                f"--data-root={root / 'data'}",
                f"--exec-root={root / 'exec'}",
                f"--host=unix://{sock}",
                f"--pidfile={root / 'docker.pid'}",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-forward=false",
                "--ip-masq=false",
                "--bridge=none",
                "--containerd-namespace=vzbench",
                "--containerd-plugins-namespace=vzbench-plugins",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = (DOCKER, f"--host=unix://{sock}")
    deadline = time.monotonic() + 60
    while True:
        if daemon.poll() is not None:
            raise RuntimeError(f"dockerd exited {daemon.returncode}; see {root / 'dockerd.log'}")
        probe = subprocess.run([*base, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
        if probe.returncode == 0:
            return daemon, base, probe.stdout.strip()
        if time.monotonic() > deadline:
            _stop_dockerd(daemon)
            raise RuntimeError("dockerd did not answer within 60 s")
        time.sleep(0.2)


def _stop_dockerd(daemon: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.pid, signal.SIGTERM)
    try:
        daemon.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()


def _remove(base: tuple[str, ...], *argv: str) -> None:
    subprocess.run([*base, *argv], capture_output=True, check=False, timeout=60)


@contextlib.asynccontextmanager
async def docker_peer(workdir: Path, notes: list[str]) -> AsyncIterator[Peer | None]:
    """A private dockerd and one running busybox container; None (with a note) where docker cannot run."""
    if not (os.access(DOCKER, os.X_OK) and os.access(DOCKERD, os.X_OK)):
        notes.append("docker exec not measured: Debian's docker.io is not installed (scripts/install-bench-peers.sh)")
        yield None
        return
    root = workdir / "docker"
    root.mkdir(parents=True, exist_ok=True)
    daemon: subprocess.Popen[bytes] | None = None
    base: tuple[str, ...] = ()
    container = ""
    try:
        daemon, base, version = await asyncio.to_thread(_start_dockerd, root)
        tar = busybox_rootfs_tar(workdir)
        await asyncio.to_thread(_run, [*base, "import", str(tar), IMAGE])
        container = await asyncio.to_thread(
            _run, [*base, "run", "-d", "--network", "none", IMAGE, "/bin/sleep", "1000000"]
        )
        yield Peer("docker", f"docker {version}", base, container)
    except RuntimeError as exc:
        notes.append(f"docker exec not measured: {exc}")
        yield None
    finally:
        if container:
            await asyncio.to_thread(_remove, base, "rm", "-f", container)
        if daemon is not None:
            await asyncio.to_thread(_stop_dockerd, daemon)
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def podman_peer(workdir: Path, notes: list[str]) -> AsyncIterator[Peer | None]:
    """One running busybox container under a private podman store; None (with a note) where podman cannot run."""
    if not os.access(PODMAN, os.X_OK):
        notes.append("podman exec not measured: Debian's podman is not installed (scripts/install-bench-peers.sh)")
        yield None
        return
    root = workdir / "podman"
    root.mkdir(parents=True, exist_ok=True)
    base = (
        PODMAN,
        f"--root={root / 'root'}",
        f"--runroot={root / 'run'}",
        "--storage-driver=vfs",
        "--cgroup-manager=cgroupfs",
        "--events-backend=none",
    )
    container = ""
    try:
        version = await asyncio.to_thread(_run, [PODMAN, "--version"])
        tar = busybox_rootfs_tar(workdir)
        await asyncio.to_thread(_run, [*base, "import", str(tar), IMAGE])
        container = await asyncio.to_thread(
            _run,
            [
                *base,
                "run",
                "-d",
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                IMAGE,
                "/bin/sleep",
                "1000000",
            ],
        )
        container = container.splitlines()[-1]
        yield Peer("podman", version, base, container)
    except RuntimeError as exc:
        notes.append(f"podman exec not measured: {exc}")
        yield None
    finally:
        if container:
            await asyncio.to_thread(_remove, base, "rm", "-f", "-t", "0", container)
        await asyncio.to_thread(_remove, base, "system", "reset", "-f")
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)
