"""The conformance suite through the daemon (``vz-conformance run --through-daemon``, ``Drivers.Connect``).

The external half of a run is the daemon's own warm plugin session: launched by its SessionPool from the pinned
console script, reached through the daemon's byte-for-byte Runtime Protocol proxy. Shown here by process
parentage (the plugin is the daemon's descendant, never the suite's), by the pool's counters (the plugin the
crash case kills is the one the daemon counts as crashed and relaunches) and by the report (the same cases,
outcomes and Info in-process and out of process). A real daemon process in a private ``VZ_HOME`` (fake driver).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from sessions_testlib import run
from vz_conformance._gate import expected_count
from vz_conformance._providers import DaemonProvider, sha256_of
from vz_conformance._remote import DaemonDriver, channel_of, pid_of

from vz_core import RunImageRequest
from vz_core.daemon import DaemonError, connect, stop_daemon
from vz_core.errors import UnavailableError

FAKE_SCRIPT = Path(sys.executable).parent / "vz-driver-fake"


def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plugin_idle: str) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("VZ_HOME", str(home))
    monkeypatch.setenv("VZ_DAEMON_PLUGIN_IDLE", plugin_idle)
    monkeypatch.delenv("VZ_DAEMON_SOCKET", raising=False)
    monkeypatch.delenv("VZ_DAEMON_AUTOSTART", raising=False)
    try:
        yield home
    finally:
        stop_daemon(home)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from _home(tmp_path, monkeypatch, "0")


def status() -> dict[str, Any]:
    with connect(autostart=False) as conn:
        doc: dict[str, Any] = conn.request("System.Status", {})
    return doc


def fake_row(doc: dict[str, Any]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [row for row in doc["plugins"] if row["name"] == "fake" and row.get("options")]
    assert len(rows) == 1, doc["plugins"]
    return rows[0]


def ancestors(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).parents()]


def provider(state: Path) -> DaemonProvider:
    return DaemonProvider("fake", FAKE_SCRIPT, sha256_of(FAKE_SCRIPT), options={"state_dir": state})


async def test_drivers_connect_gives_the_daemons_own_warm_plugin(home: Path, tmp_path: Path) -> None:
    source = provider(tmp_path / "state")
    first = await source.connect()
    second: Any = None
    try:
        assert isinstance(first, DaemonDriver)
        doc = status()
        row = fake_row(doc)
        pid = pid_of(first)
        assert pid is not None
        # The plugin under test is the daemon's: its process, counted by its pool, verified from the pinned script.
        assert pid == row["pid"] and row["launches"] == 1
        assert doc["pid"] in ancestors(pid) and os.getpid() not in ancestors(pid)
        assert row["script"] == str(FAKE_SCRIPT) and row["sha256"] == source.sha256
        assert row["options"] == {"state_dir": str(tmp_path / "state")}
        # Driver calls go to it: a Machine made through one connection is the shared session's.
        await first.run_image(RunImageRequest(workspace_id="through", image="img"))
        out, code = await run(first, "through", "sh", "-c", "echo $PPID; exit 3")
        assert code == 3 and int(out) != os.getpid()
        second = await source.connect()
        assert pid_of(second) == pid and fake_row(status())["launches"] == 1
        found = await second.find("through")
        assert found is not None and found.state.status == "running"
        # The proxy passes the Runtime Protocol and the Machine extensions, not the plugin's controller.
        shutdown = channel_of(first).unary_unary("/plugin.GRPCController/Shutdown", None, None)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await shutdown(b"")
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert (await first.extensions()) is not None
        assert psutil.pid_exists(pid) and fake_row(status())["pid"] == pid
        # The proxy's socket is private, and served only while its Drivers.Connect call is open.
        socket_path = Path(first.session["socket"])
        assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(socket_path.parent).st_mode) == 0o700
        await second.delete("through")
        await first.close()
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(os.path.exists, socket_path.parent):
            assert time.monotonic() < deadline, f"{socket_path} still served after its call ended"
            await asyncio.sleep(0.05)
        assert await second.find("through") is None  # the other connection carries on
        assert fake_row(status())["pid"] == pid  # the plugin stays warm for the next client
    finally:
        await first.close()
        if second is not None:
            await second.close()


async def test_drivers_connect_refuses_bad_requests_before_launching(home: Path, tmp_path: Path) -> None:
    with pytest.raises(DaemonError, match="bogus") as bad_option:
        await DaemonProvider("fake", FAKE_SCRIPT, sha256_of(FAKE_SCRIPT), options={"bogus": 1}).connect()
    assert bad_option.value.kind == "user_error"
    with pytest.raises(DaemonError, match="no-such-driver"):
        await DaemonProvider("no-such-driver", FAKE_SCRIPT, sha256_of(FAKE_SCRIPT)).connect()
    with connect(autostart=False) as conn, pytest.raises(DaemonError, match='give "driver"'):
        conn.request("Drivers.Connect", {"options": {}})
    assert all(row.get("launches", 0) == 0 for row in status()["plugins"])
    # A daemon whose pinned script is not this installation's is refused by the suite, naming both.
    other = DaemonProvider("fake", FAKE_SCRIPT, "0" * 64, options={"state_dir": tmp_path / "s"})
    with pytest.raises(RuntimeError, match="another vz"):
        await other.connect()


@pytest.fixture
def short_idle_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from _home(tmp_path, monkeypatch, "1")


async def test_proxied_calls_keep_the_plugin_warm_and_it_idles_out_after(short_idle_home: Path, tmp_path: Path) -> None:
    driver = await provider(tmp_path / "state").connect()
    try:
        pid = pid_of(driver)
        await driver.run_image(RunImageRequest(workspace_id="long", image="img"))
        # One proxied Exec three times longer than the plugin idle time: the plugin is not stopped under it.
        out, code = await run(driver, "long", "sh", "-c", "sleep 3; echo done")
        assert (out, code) == (b"done\n", 0)
        assert fake_row(status())["pid"] == pid and fake_row(status())["launches"] == 1
        await driver.delete("long")
    finally:
        await driver.close()
    deadline = time.monotonic() + 15
    while fake_row(status())["state"] != "stopped":
        assert time.monotonic() < deadline, "the plugin did not idle out after its last proxied call"
        await asyncio.sleep(0.1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_a_parity_run_through_the_daemon_passes_the_gate_with_the_same_report_both_ways(
    home: Path, tmp_path: Path
) -> None:
    report_path = tmp_path / "parity.json"
    command = ["vz-conformance", "run", "--driver", "fake", "--provider-mode", "parity", "--through-daemon"]
    run_ = subprocess.run(
        [*command, "--report", str(report_path)], capture_output=True, text=True, timeout=900, check=False
    )
    assert run_.returncode == 0, run_.stderr[-6000:]
    count = expected_count("parity")
    verify = ["vz-conformance", "verify-report", str(report_path), "--provider-mode", "parity"]
    gate = subprocess.run(
        [*verify, "--expect-count", str(count)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gate.returncode == 0, gate.stdout
    report = json.loads(report_path.read_text())
    in_process, external = report["runs"]
    assert (in_process["provider_mode"], external["provider_mode"]) == ("in-process", "external")
    assert in_process["info"] == external["info"]

    def outcomes(run: dict[str, Any]) -> dict[str, tuple[str, str | None, str | None]]:
        return {c["id"]: (c["outcome"], c.get("capability"), c.get("refusal")) for c in run["cases"]}

    shared = outcomes(in_process)
    through = outcomes(external)
    # Every case both modes hold has the same outcome, capability and verified refusal; the rest is crash.*.
    assert {case: through[case] for case in shared} == shared
    assert sorted({case.split(".")[0] for case in set(through) - set(shared)}) == ["crash"]
    doc = status()
    row = fake_row(doc)
    assert external["driver"]["plugin_path"] == row["script"] and external["driver"]["sha256"] == row["sha256"]
    assert (in_process["driver"]["source"], external["driver"]["source"]) == ("registry", "daemon")
    # crash.mid_exec SIGKILLed the plugin under test: it was the daemon's (counted as its crash, relaunched by it).
    assert row["crashes"] == 1 and row["launches"] == 2, row
    assert row["pid"] is not None and doc["pid"] in ancestors(row["pid"])


def test_the_pytest_plugin_runs_the_cases_against_the_daemons_plugin(home: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-q"]
    command += ["--pyargs", "vz_conformance.pytest_suite", "--vz-driver", "fake", "--vz-provider-mode", "external"]
    command += ["--vz-through-daemon", "-m", "vz_malformed", "-k", "start", "--basetemp", str(tmp_path / "pytest")]
    run_ = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert run_.returncode == 0, run_.stdout[-4000:] + run_.stderr[-2000:]
    assert "\n2 passed, " in run_.stdout, run_.stdout[-2000:]
    row = fake_row(status())
    # Each case connected again (Drivers.Connect); all of them reached the one plugin the daemon launched.
    assert row["launches"] == 1 and row["crashes"] == 0
    assert str(row["options"]["state_dir"]).startswith(str(tmp_path / "pytest"))


HOSTDIR = Path(__file__).resolve().parents[3] / "examples" / "drivers" / "hostdir"


@pytest.mark.slow
def test_an_external_driver_added_to_the_daemon_passes_through_its_session(home: Path, tmp_path: Path) -> None:
    """An external driver (`vz driver add`, the hostdir example): the daemon launches it from its manifest
    (checksum-verified), and the suite's exec, malformed and crash cases pass against that plugin."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(HOSTDIR / "src")}
    subprocess.run(
        [sys.executable, str(HOSTDIR / "make_manifest.py"), "--out", str(tmp_path / "driver")],
        capture_output=True,
        check=True,
        timeout=60,
    )
    added = subprocess.run(
        ["vz", "driver", "add", str(tmp_path / "driver" / "manifest.json")], env=env, capture_output=True, text=True
    )
    assert added.returncode == 0, added.stderr
    labels = ["--label", "exec", "--label", "malformed", "--label", "crash"]
    report = tmp_path / "hostdir.json"
    command = ["vz-conformance", "run", "--driver", "hostdir", "--provider-mode", "external", "--through-daemon"]
    command += ["--adapter", "vz_driver_hostdir.adapter:ADAPTER", *labels, "--report", str(report)]
    run_ = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run_.returncode == 0, run_.stderr[-6000:]
    count = subprocess.run(
        ["vz-conformance", "list", "--count", *labels], capture_output=True, text=True, check=True
    ).stdout.strip()
    verify = ["vz-conformance", "verify-report", str(report), "--provider-mode", "external", *labels]
    gate = subprocess.run([*verify, "--expect-count", count], capture_output=True, text=True, timeout=60, check=False)
    assert gate.returncode == 0, gate.stdout
    doc = status()
    (row,) = [r for r in doc["plugins"] if r["name"] == "hostdir"]
    recorded = json.loads(report.read_text())["runs"][0]["driver"]
    binary = str(tmp_path / "driver" / "vz-driver-hostdir")
    assert row["origin"] == "external" and recorded["plugin_path"] == row["script"] == binary
    assert recorded["source"] == "daemon"
    assert recorded["sha256"] == row["sha256"]
    assert row["crashes"] == 1 and row["launches"] == 2, row  # crash.mid_exec killed the daemon's plugin
    assert doc["pid"] in ancestors(row["pid"])


@pytest.fixture
def hostdir_binary(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The hostdir example built into a driver directory and added with `vz driver add` (its binary)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    out = tmp_path / "driver"
    built = subprocess.run(
        [sys.executable, str(HOSTDIR / "make_manifest.py"), "--out", str(out)], capture_output=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    added = subprocess.run(["vz", "driver", "add", str(out / "manifest.json")], capture_output=True, text=True)
    assert added.returncode == 0, added.stderr
    return out / "vz-driver-hostdir"


async def test_a_driver_file_changed_under_an_open_session_is_refused_at_the_next_call(hostdir_binary: Path) -> None:
    binary = hostdir_binary
    driver = await DaemonProvider("hostdir", binary, sha256_of(binary)).connect()
    try:
        assert await driver.find("nothing-here") is None
        with binary.open("ab") as handle:
            handle.write(b"\n# changed after vz driver add\n")
        with pytest.raises(UnavailableError, match="SHA-256") as refused:
            await driver.find("nothing-here")
        assert str(binary) in str(refused.value)
        (row,) = [r for r in status()["plugins"] if r["name"] == "hostdir"]
        assert row["launches"] == 1, row  # refused before anything ran again
    finally:
        await driver.close()


def test_the_proxy_passes_application_metadata_and_status_details_but_not_grpcs_own() -> None:
    from vz_core.daemon._sessions import _forwarded

    metadata = [
        ("te", "trailers"),
        ("test-key", "kept"),
        ("user-agent", "grpc-python"),
        ("content-type", "application/grpc"),
        ("grpc-timeout", "1S"),
        ("grpc-status-details-bin", b"\x08\x03"),
        (":authority", "localhost"),
        ("vz-exec-chunk", "262144"),
        ("vz-exec-stop-input", "1"),
    ]
    assert _forwarded(metadata) == [
        ("test-key", "kept"),
        ("grpc-status-details-bin", b"\x08\x03"),
        ("vz-exec-chunk", "262144"),
        ("vz-exec-stop-input", "1"),
    ]
    assert _forwarded(None) == []


def test_drivers_connect_over_grpc_serves_the_same_session(home: Path, tmp_path: Path) -> None:
    """Drivers.Connect is an rpc of api.proto: over gRPC its one progress message names the proxy's private
    socket (Runtime Protocol calls reach the warm plugin there) until the client cancels the call."""
    from google.protobuf import json_format

    from vz_core.api import pb

    with connect(autostart=True):  # the daemon of this home runs
        pass
    spec = pb.method("Drivers.Connect")
    request = pb.api_pb2.ConnectRequest(driver="fake")
    json_format.ParseDict({"state_dir": str(tmp_path / "grpc-state")}, request.options)
    with grpc.insecure_channel("unix:" + str(home / "daemon" / "vz.sock")) as channel:
        stub = channel.unary_stream(
            spec.path, request_serializer=spec.request.SerializeToString, response_deserializer=spec.response.FromString
        )
        responses: Any = stub(request, timeout=120)
        first = next(responses)
        session = pb.to_wire(first.progress)["driver"]
        socket_path = Path(session["socket"])
        assert first.WhichOneof("message") == "progress" and session["name"] == "fake"
        assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600 and session["pid"] == fake_row(status())["pid"]
        with grpc.insecure_channel("unix:" + str(socket_path)) as plugin:  # the Runtime Protocol, proxied
            from vz_core.rpc import pb as runtime

            info = plugin.unary_unary(
                "/devsy.runtime.v1.RuntimeDriver/Info",
                request_serializer=runtime.runtime_pb2.InfoRequest.SerializeToString,
                response_deserializer=runtime.runtime_pb2.InfoResponse.FromString,
            )(runtime.runtime_pb2.InfoRequest(), timeout=60)
            assert info.driver_name == "fake"
        responses.cancel()
    deadline = time.monotonic() + 10
    while socket_path.parent.exists():
        assert time.monotonic() < deadline, f"{socket_path} still served after its call was cancelled"
        time.sleep(0.05)
