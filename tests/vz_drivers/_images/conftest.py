"""Fixtures for the image store tests: a store in a temp dir, a real docker-registry on loopback, and a
counting/auth/corrupting proxy in front of it."""

from __future__ import annotations

import http.client
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from images_testlib import Proxy, push_layout, serve_proxy

from vz_drivers._images import ImageStore

DOCKER_REGISTRY = Path("/usr/bin/docker-registry")


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "store")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(host: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Poll GET /v2/ until it answers 200 (bounded), failing early if the process died."""
    deadline = time.monotonic() + 20.0
    delay = 0.01
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited with {proc.returncode}: {log.read_text()[-2000:]}")
        conn = http.client.HTTPConnection(host, timeout=2)
        try:
            conn.request("GET", "/v2/")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(delay)  # backoff between readiness polls
        delay = min(delay * 2, 0.2)
    raise RuntimeError(f"docker-registry did not become ready: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real docker-registry on 127.0.0.1 with temporary storage; yields ``127.0.0.1:<port>``."""
    if not DOCKER_REGISTRY.exists():
        pytest.fail("docker-registry is not installed: apt-get install docker-registry")
    base = tmp_path_factory.mktemp("registry")
    port = _free_port()
    config = base / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {base / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: {secrets.token_hex(16)}\n"
    )
    log = base / "registry.log"
    with log.open("wb") as log_fh:
        proc = subprocess.Popen([str(DOCKER_REGISTRY), "serve", str(config)], stdout=log_fh, stderr=log_fh)
    try:
        _wait_ready(f"127.0.0.1:{port}", proc, log)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def proxy(registry: str) -> Iterator[Proxy]:
    """A fresh counting proxy in front of the module's registry."""
    with serve_proxy(registry) as state:
        yield state


@pytest.fixture
def pusher(registry: str) -> Callable[[Path, str, str], str]:
    """``push(layout, repo, tag) -> manifest digest`` into the module's registry."""

    def push(layout: Path, repo: str, tag: str) -> str:
        return push_layout(registry, layout, repo, tag)

    return push
