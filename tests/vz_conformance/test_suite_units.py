"""The suite's building blocks: error categories, failure texts, frame rules, adapters, capability names."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from suite_testlib import EXTENSIONS, INFO, ON_RUN
from vz_conformance import _capabilities as cap
from vz_conformance import _hostfs
from vz_conformance._adapter import Adapter
from vz_conformance._exec import ExecResult
from vz_conformance._expect import category_of, ensure, expect_error, expect_ok
from vz_conformance._outcome import NotApplicable
from vz_conformance._report import info_record
from vz_conformance.adapters import FakeAdapter, adapter_for, load_adapter

from vz_core import Capabilities, DriverInfo, ExecExit, ExecOutput, Extensions, MountType, RecreateMode
from vz_core.errors import NotFoundError, RuntimeTimeoutError, UnsupportedError
from vz_core.registry import BuiltinDriver, DriverRegistry, hookimpl


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (NotFoundError("gone"), "NOT_FOUND"),
        (RuntimeTimeoutError("slow"), "TIMEOUT"),
        (asyncio.CancelledError(), "CANCELLED"),
        (TimeoutError(), "TIMEOUT"),
        (ValueError("bug"), "NOT_A_DRIVER_ERROR"),
    ],
)
def test_category_of(exc: BaseException, category: str) -> None:
    assert category_of(exc) == category


async def _raise(exc: Exception) -> None:
    raise exc


async def _ok() -> int:
    return 7


async def test_expect_error_texts_name_rpc_expected_and_actual() -> None:
    with pytest.raises(AssertionError, match=r"^Start: expected an error of category NOT_FOUND; got success \(7\)"):
        await expect_error("Start", _ok, "NOT_FOUND")
    with pytest.raises(AssertionError, match=r"Stop: expected an error of category NOT_FOUND; got UNSUPPORTED"):
        await expect_error("Stop", lambda: _raise(UnsupportedError("no")), "NOT_FOUND")
    exc = await expect_error("Find", lambda: _raise(NotFoundError("gone")), {"NOT_FOUND", "UNSUPPORTED"})
    assert isinstance(exc, NotFoundError)
    assert await expect_ok("Info", _ok) == 7
    with pytest.raises(AssertionError, match=r"^Info: expected success; got NOT_FOUND \(NotFoundError: gone\)"):
        await expect_ok("Info", lambda: _raise(NotFoundError("gone")))
    with pytest.raises(AssertionError, match=r"^Find: expected status 'x'; got 'y' \(ws\)$"):
        ensure(False, "Find", "status 'x'", "'y'", note="ws")


def test_frame_rules() -> None:
    good = ExecResult(argv=("cat",))
    for event in (ExecOutput("stdout", b"a"), ExecOutput("stderr", b"b" * 32768), ExecExit(0)):
        good.record(event)
    assert good.frame_problems() == []
    assert good.stdout == b"a" and good.require_success() is good

    bad = ExecResult(argv=("cat",))
    for event in (
        ExecOutput("stdout", b""),
        ExecOutput("stdout", b"x" * 32769),
        ExecExit(0),
        ExecOutput("stdout", b"z"),
    ):
        bad.record(event)
    problems = bad.frame_problems()
    assert "frame 0 (stdout) carries 0 bytes, allowed 1..32768" in problems
    assert "frame 1 (stdout) carries 32769 bytes, allowed 1..32768" in problems
    assert "1 frame(s) after the exit frame, expected none" in problems
    assert bad.stdout == b"x" * 32769  # output after the exit is not part of the result
    assert bad.frame_problems(sizes_only=True) == problems[:2]

    missing = ExecResult(argv=("true",))
    with pytest.raises(AssertionError, match="the stream ended without an exit"):
        missing.require_exit()
    assert "0 exit frames, expected exactly 1" in missing.frame_problems()

    signalled = ExecResult(argv=("sh",))
    signalled.record(ExecExit(137, "SIGKILL"))
    with pytest.raises(AssertionError, match="exit_code=137, signal='SIGKILL'"):
        signalled.require_success()


def test_not_applicable_needs_capability_and_refusal() -> None:
    with pytest.raises(ValueError):
        NotApplicable("", "refused")
    with pytest.raises(ValueError):
        NotApplicable(cap.LOGS, "")


def test_declared_capabilities() -> None:
    assert cap.declared(cap.LOGS, INFO, EXTENSIONS, ON_RUN)
    assert not cap.declared(cap.MOUNT_BIND, INFO, EXTENSIONS, ON_RUN)
    assert cap.declared(cap.RECREATE_ON_RUN, INFO, EXTENSIONS, ON_RUN)
    assert not cap.declared(cap.RECREATE_ON_RUN, INFO, EXTENSIONS, RecreateMode.DELETE)
    assert not cap.declared(cap.EGRESS, INFO, None, ON_RUN)
    bare = DriverInfo("d", "1", "r", capabilities=None)
    assert not cap.declared(cap.REUSE_PREFLIGHT, bare, None, None)
    with pytest.raises(KeyError):
        cap.declared("capabilities.nope", INFO, EXTENSIONS, ON_RUN)


def test_info_record_round_trips_unknown_enum_values() -> None:
    info = DriverInfo("d", "1", "r", capabilities=Capabilities(mount_types=(MountType.BIND, 99)))  # type: ignore[arg-type]
    ext = Extensions(resource_limits=True)
    record = info_record(info, ext, RecreateMode.ON_RUN)
    back, back_ext, on_run = record.to_values()
    assert back == info and back_ext == ext and on_run == RecreateMode.ON_RUN


def _run(argv: tuple[str, ...], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, input=stdin, capture_output=True, check=False, timeout=20)


def test_default_scenarios_work_in_a_posix_shell(tmp_path: Path) -> None:
    adapter = Adapter()
    args = ["two words", "$HOME;$(echo unwanted)", "", "ünï"]
    assert _run(adapter.print_args(args)).stdout == b"".join(a.encode() + b"\0" for a in args)
    argv, expected = adapter.shell_command()
    assert _run(argv).stdout == expected
    failing = _run(adapter.fail_with(3, "diagnostic"))
    assert failing.returncode == 3 and b"diagnostic" in failing.stderr
    assert _run(adapter.kill_self()).returncode == -9
    both = _run(adapter.tee_both(), b"data")
    assert both.stdout == both.stderr == b"data"
    assert _run(adapter.cat_to_stderr(), b"x").stderr == b"x"
    target = tmp_path / "f"
    assert _run(adapter.write_file(str(target), "v")).returncode == 0
    assert _run(adapter.read_file(str(target))).stdout == b"v"
    assert _run(adapter.read_file(str(tmp_path / "missing"))).returncode == 3
    assert _run(adapter.owner_of(str(target))).stdout.strip() == b"root"


def test_fake_adapter_local_files_live_under_the_machine_root(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    env = {"VZ_MACHINE_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"}
    assert subprocess.run(adapter.write_local("marker", "data"), env=env, check=True, timeout=20).returncode == 0
    assert (tmp_path / "marker").read_text() == "data"
    read = subprocess.run(adapter.read_local("marker"), env=env, capture_output=True, check=False, timeout=20)
    assert read.stdout == b"data"
    gone = subprocess.run(adapter.read_local("nope"), env=env, capture_output=True, check=False, timeout=20)
    assert gone.returncode == 3


class _Registered:
    """A registration whose driver package ships ``adapter.ADAPTER`` (this test module plays the package)."""

    @staticmethod
    @hookimpl
    def vz_builtin_drivers() -> list[BuiltinDriver]:
        return [
            BuiltinDriver(name="with-adapter", summary="t", factory=f"{__name__}_pkg:Driver"),
            BuiltinDriver(name="without-adapter", summary="t", factory="vz_conformance:Nothing"),
        ]


def test_adapter_found_beside_a_registered_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    package = types.ModuleType(f"{__name__}_pkg")
    package.__path__ = []
    module = types.ModuleType(f"{__name__}_pkg.adapter")

    class Custom(Adapter):
        image = "custom"

    module.ADAPTER = Custom()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, package.__name__, package)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    registry = DriverRegistry(load_entry_points=False)
    registry.register(_Registered())
    found = adapter_for("with-adapter", registry=registry)
    assert isinstance(found, Custom) and found is not module.ADAPTER  # type: ignore[attr-defined]
    assert type(adapter_for("without-adapter", registry=registry)) is Adapter


def test_find_processes_reports_identity_and_marker_but_not_itself() -> None:
    adapter = Adapter()
    marker = "vzc-marker-unit-test-0001"
    argv, _ = adapter.blocking_tree(marker)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while "ready" not in lines or sum(x.startswith("pid ") for x in lines) < 4:
            lines.append(proc.stdout.readline().decode().strip())
        pids = [int(x.split()[1]) for x in lines if x.startswith("pid ")]
        scan = _run(adapter.find_processes(pids, marker)).stdout.decode().splitlines()
        alive = {int(x.split()[0]) for x in scan if x.split()[0].isdigit()}
        marked = {int(x.split()[1]) for x in scan if x.startswith("marker ")}
        assert alive == set(pids)
        assert proc.pid in marked and marked <= set(pids)
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def test_adapters_by_name_and_by_spec() -> None:
    assert isinstance(adapter_for("fake"), FakeAdapter)
    assert type(adapter_for("anything-else")) is Adapter
    assert adapter_for("fake") is not adapter_for("fake")
    assert isinstance(load_adapter("vz_conformance.adapters:FakeAdapter"), FakeAdapter)
    with pytest.raises(ValueError, match="module:attribute"):
        load_adapter("vz_conformance.adapters")
    with pytest.raises(TypeError, match="could not be called without arguments"):
        load_adapter("vz_conformance.adapters:adapter_for")
    with pytest.raises(TypeError, match=r"is a list, not a vz_conformance\.Adapter"):
        load_adapter("vz_conformance.adapters:__all__")


def test_every_adapter_subclasses_the_one_public_adapter_class() -> None:
    import vz_conformance
    import vz_conformance.adapters as adapters
    from vz_conformance.adapters.linux_native import ADAPTER as LINUX_NATIVE
    from vz_conformance.adapters.qemu import ADAPTER as QEMU

    assert vz_conformance.Adapter is adapters.Adapter is Adapter
    for adapter in (LINUX_NATIVE, QEMU, FakeAdapter()):
        assert isinstance(adapter, vz_conformance.Adapter)


def test_host_file_requirement_names_the_file_and_what_was_found(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "data.txt"
    with pytest.raises(AssertionError, match=r"host filesystem: expected .*data.txt with the data; got no such file"):
        _hostfs.require(path, "data", "the data")
    _hostfs.write(path, "other")
    with pytest.raises(AssertionError, match="got other"):
        _hostfs.require(path, "data", "the data")
    _hostfs.write(path, "data")
    _hostfs.require(path, "data", "the data")
