"""Third-party Go clients of vz.api.v1 (grpc-go and the committed Go package under protocol/go): the interop
client tests/go/src/vzinterop/apiclient against a real daemon listener serving the real service on the fake
driver, and the example examples/api/lifecycle.go against a daemon started with `vz daemon start`.

The committed Go package is exactly what ``protoc`` generates from protocol/ today; ``CloseSend()`` on Exec is the
end of the command's input (the command finishes and its result arrives); the RPC's own cancel ends the call
CANCELLED; a failed call carries both typed details (ErrorInfo, RuntimeError); a watch resumed from its last
revision loses and repeats nothing; the example fails at once naming
a missing socket, then runs the whole lifecycle once the daemon is started."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from vz_core.daemon import Daemon, DaemonPaths
from vz_core.daemon._grpc import GrpcFront
from vz_core.daemon._service import Service

ROOT = Path(__file__).resolve().parents[2]
GO_PACKAGE = ROOT / "protocol" / "go"


def go_env(out: Path) -> dict[str, str]:
    return {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{out / 'gopath'}:{GO_PACKAGE}:/usr/share/gocode",
        "GOCACHE": str(out / "gocache"),
        "CGO_ENABLED": "0",
    }


def go_build(out: Path, target: str, binary: Path) -> Path:
    if any(shutil.which(tool) is None for tool in ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")):
        pytest.fail("the Go API clients need golang-go, protobuf-compiler, protoc-gen-go and protoc-gen-go-grpc")
    built = subprocess.run(
        ["go", "build", "-o", str(binary), target],
        env=go_env(out),
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    assert built.returncode == 0, built.stderr
    return binary


@pytest.fixture(scope="module")
def go_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("go-api")
    source = out / "gopath" / "src" / "vzinterop"
    source.mkdir(parents=True)
    shutil.copytree(ROOT / "tests" / "go" / "src" / "vzinterop" / "apiclient", source / "apiclient")
    return out


@pytest.fixture(scope="module")
def go_api(go_out: Path) -> Path:
    return go_build(go_out, "vzinterop/apiclient", go_out / "vz-go-api")


def vz_exe() -> str:
    beside = Path(sys.executable).parent / "vz"
    found = str(beside) if beside.is_file() else shutil.which("vz")
    assert found, "the vz console script is not installed"
    return found


def test_the_go_example_beside_lifecycle_py(go_out: Path, tmp_path: Path) -> None:
    """examples/api/lifecycle.go: fails at once naming a missing socket; after `vz daemon start` it runs up,
    status, exec (CloseSend), stop, delete and reads typed operation events."""
    example = go_build(go_out, "examples/api/lifecycle.go", go_out / "lifecycle")
    env = {**os.environ, "VZ_HOME": str(tmp_path / "home")}
    project = ROOT / "examples" / "fake"

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=env, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, timeout=240
        )

    missing = run(str(example), str(project))
    socket = str(tmp_path / "home" / "daemon" / "vz.sock")
    assert missing.returncode == 1 and f"no vz daemon socket at {socket}" in missing.stderr
    assert "vz daemon start" in missing.stderr
    started = run(vz_exe(), "daemon", "start", "--json")
    try:
        assert started.returncode == 0, started.stderr
        assert json.loads(started.stdout)["socket"] == socket
        done = run(str(example), str(project))
    finally:
        stopped = run(vz_exe(), "daemon", "stop")
    assert done.returncode == 0, done.stderr
    assert stopped.returncode == 0, stopped.stderr
    out = done.stdout
    assert "up: Environment default (env_" in out and "is running" in out and "machine dev: running" in out
    assert 'exec: exit 3, stdout "got hello\\n", stderr "oops\\n"' in out
    assert "stop: stopped" in out and "delete: deleted, 1 Machine(s) removed" in out
    assert "events: 3 operation(s) finished since revision 0" in out
    assert "Environments.Up call " in out and " succeeded" in out


def test_the_committed_go_package_is_what_protoc_generates_today() -> None:
    checked = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr
    assert "the Go package was not checked" not in checked.stdout
    assert (GO_PACKAGE / "src" / "vz.dev" / "protocol" / "vz" / "api" / "v1" / "api_grpc.pb.go").is_file()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    root = tmp_path / "proj"
    root.mkdir()
    machine = {"name": "web", "profile": "developer", "driver": "fake", "image": "vz:default"}
    definition = {"version": 1, "project_id": "goapi", "machines": [{**machine, "workspace": {"projection": "none"}}]}
    (root / "vz.json").write_text(json.dumps(definition))
    return root


@contextlib.asynccontextmanager
async def daemon(home: Path) -> AsyncIterator[DaemonPaths]:
    paths = DaemonPaths(str(home))
    server: Daemon | None = None
    service = Service(warm_sessions=False, daemon_status=lambda: server.status() if server else {})
    await service.start()
    server = Daemon(paths, service.dispatch, handle_signals=False, idle_timeout=0.0, on_shutdown=[service.close])
    front = GrpcFront(server.dispatch, paths.directory)
    server.http2 = front.handle
    server.on_shutdown.insert(0, front.close)
    ready = asyncio.Event()
    serving = asyncio.ensure_future(server.serve(ready=ready.set))
    waiter = asyncio.ensure_future(ready.wait())
    await asyncio.wait([serving, waiter], return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        waiter.cancel()
        serving.result()
    await front.start()
    try:
        yield paths
    finally:
        server.request_shutdown("test over")
        await asyncio.wait_for(serving, 60)


async def test_a_go_client_closesend_cancel_typed_errors_and_watch_resume(
    go_api: Path, tmp_path: Path, project: Path
) -> None:
    from vz_core.api import Client

    async with daemon(tmp_path / "home") as paths:

        def run() -> dict[str, Any]:
            context: dict[str, Any] = {"cwd": str(project), "environ": {}, "definition_file": None}
            with Client(paths.home, autostart=False, transport="grpc", context=context) as client:
                client.up().result()
                try:
                    found = {}
                    for scenario in ("closesend", "cancel", "error", "watch"):
                        done = subprocess.run(
                            [str(go_api), paths.socket, str(project), scenario],
                            capture_output=True,
                            text=True,
                            check=False,
                            stdin=subprocess.DEVNULL,
                            timeout=180,
                        )
                        assert done.returncode == 0, done.stderr
                        found[scenario] = json.loads(done.stdout)
                    found["operations"] = client.daemon_status().operations
                    return found
                finally:
                    client.delete().result()

        found = await asyncio.to_thread(run)
    assert found["closesend"] == {"scenario": "closesend", "code": "OK", "output": "hello\ndone\n", "exit_code": 5}
    assert found["cancel"] == {"scenario": "cancel", "first": "started\n", "code": "Canceled"}
    assert found["error"] == {
        "scenario": "error",
        "code": "NotFound",
        "kind": "not_found",
        "exit_code": 3,
        "runtime_code": "RUNTIME_ERROR_CODE_NOT_FOUND",
    }
    watch = found["watch"]
    assert len(watch["all"]) == 3 and watch["first"] == watch["all"][:2] and watch["resumed"] == watch["all"][2:]
    # The cancelled command is gone: no call of the Go client is still running in the daemon.
    assert [op for op in found["operations"] if op.method == "Machines.Exec"] == []
