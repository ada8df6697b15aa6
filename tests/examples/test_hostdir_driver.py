"""The external example driver (examples/drivers/hostdir), used the way its author and its users would use it.

Its plugin is built with the example's own ``make_manifest.py`` into a temporary driver directory, added with
``vz driver add`` under a private VZ_HOME, driven by ``vz up`` / ``vz exec``, refused once its bytes change, and
run through the conformance suite out of process (``vz-conformance run --plugin`` + ``verify-report``) and
in-process, with the parity gate over both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from vz_core import ExecExit, ExecOutput, ExecSpec, RunImageRequest
from vz_core.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedError,
)
from vz_core.trust import host_platform, parse_manifest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "drivers" / "hostdir"
SRC = EXAMPLE / "src"
ADAPTER_SPEC = "vz_driver_hostdir.adapter:ADAPTER"
BIN = Path(sys.executable).parent  # vz, vz-conformance and vz-driver-fake of this environment


@pytest.fixture
def hostdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The example package, importable the way its own checkout would make it (src/ on sys.path)."""
    monkeypatch.syspath_prepend(str(SRC))
    import vz_driver_hostdir

    yield vz_driver_hostdir


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VZ_") and k != "PYTEST_CURRENT_TEST"}
    env.update(
        VZ_HOME=str(tmp / "vz-home"),
        XDG_STATE_HOME=str(tmp / "xdg-state"),  # not used: with VZ_HOME set, hostdir keeps its Machines there
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        # SRC for the conformance adapter only (the plugin is a self-contained zip application); a PYTHONPATH
        # already set (a source checkout under test) stays after it.
        PYTHONPATH=os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p),
        VZ_PLAIN="1",
    )
    return env


def _run(args: list[str], env: dict[str, str], *, cwd: Path | None = None, timeout: float = 120) -> Any:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def _build(out: Path) -> tuple[Path, str, Path]:
    """Build the plugin and its manifest with the example's script; (binary, sha256, manifest)."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "make_manifest.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    binary = out / "vz-driver-hostdir"
    sha = hashlib.sha256(binary.read_bytes()).hexdigest()
    assert sha in done.stdout
    return binary, sha, out / "manifest.json"


# -- the manifest -------------------------------------------------------------------------------------------


def test_the_committed_template_is_refused_because_its_checksums_are_placeholders(tmp_path: Path) -> None:
    env = _env(tmp_path)
    added = _run([str(BIN / "vz"), "driver", "add", str(EXAMPLE / "manifest.json")], env)
    assert added.returncode == 1  # a TrustError: nothing recorded
    assert "binaries.linux/amd64.sha256: must be 64 hexadecimal digits" in added.stderr
    listed = _run([str(BIN / "vz"), "driver", "list", "--json"], env)
    assert "hostdir" not in [row["name"] for row in json.loads(listed.stdout)["drivers"]]


def test_make_manifest_builds_a_reproducible_plugin_and_a_manifest_vz_accepts(tmp_path: Path) -> None:
    binary, sha, manifest_path = _build(tmp_path / "one")
    again, sha_again, _ = _build(tmp_path / "two")
    assert sha_again == sha, "same sources and interpreter must give the same checksum"
    manifest = parse_manifest(manifest_path.read_text())
    assert list(manifest.binaries) == [host_platform()]
    entry = manifest.entry_for()
    assert (entry.path, entry.sha256) == ("vz-driver-hostdir", sha)
    assert (manifest.name, manifest.api_version, manifest.plaintext) == ("hostdir", "1.3", False)
    assert os.access(binary, os.X_OK)
    assert binary.read_bytes().startswith(f"#!{sys.executable} -I\n".encode())
    # Started by hand (no magic cookie) it is a plugin that says so and exits 1, with nothing on stdout.
    by_hand = subprocess.run([str(again)], capture_output=True, text=True, timeout=30, check=False)
    assert (by_hand.returncode, by_hand.stdout) == (1, "")
    assert "This binary is a plugin" in by_hand.stderr


def test_add_verify_list_up_exec_and_a_changed_binary_is_refused_at_the_next_operation(tmp_path: Path) -> None:
    binary, sha, manifest = _build(tmp_path / "driver")
    env = _env(tmp_path)
    vz = str(BIN / "vz")
    added = _run([vz, "driver", "add", str(manifest)], env)
    assert added.returncode == 0, added.stderr
    assert f"added driver hostdir ({binary})" in added.stdout
    rows = json.loads(_run([vz, "driver", "list", "--json"], env).stdout)["drivers"]
    row = next(r for r in rows if r["name"] == "hostdir")
    assert (row["origin"], row["sha256"], row["binary"], row["plaintext"]) == ("external", sha, str(binary), False)
    verified = _run([vz, "driver", "verify", "hostdir", "--json"], env)
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["drivers"][0]["ok"] is True

    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(EXAMPLE / "vz.json", project / "vz.json")
    up = _run([vz, "up"], env, cwd=project)
    assert up.returncode == 0, up.stderr
    said = _run([vz, "exec", "--", "sh", "-c", 'printf "%s|%s" "$GREETING" "$PWD"'], env, cwd=project)
    assert said.returncode == 0, said.stderr
    greeting, cwd = said.stdout.split("|")
    assert greeting == "hello from hostdir"
    assert Path(cwd).is_relative_to(tmp_path / "vz-home" / "drivers" / "hostdir" / "machines")
    assert not (tmp_path / "xdg-state").exists()

    original = binary.read_bytes()
    binary.write_bytes(original + b"\n# changed after vz driver add\n")
    failed = _run([vz, "driver", "verify", "hostdir"], env)
    assert failed.returncode == 1
    assert "SHA-256 mismatch" in failed.stdout + failed.stderr
    refused = _run([vz, "exec", "--", "true"], env, cwd=project)
    assert refused.returncode == 125  # vz exec's own failure (docker's 125)
    assert "SHA-256 mismatch" in refused.stderr

    binary.write_bytes(original)  # the right bytes again: the same manifest works again
    deleted = _run([vz, "delete"], env, cwd=project)
    assert deleted.returncode == 0, deleted.stderr
    assert not list((tmp_path / "vz-home" / "drivers" / "hostdir" / "machines").iterdir())


# -- the conformance gate -----------------------------------------------------------------------------------


NOT_APPLICABLE = {  # what hostdir declares absent, each refusal verified by the suite
    "capabilities.logs",
    "capabilities.mount_types.bind",
    "capabilities.mount_types.volume",
    "capabilities.mount_types.tmpfs",
    "capabilities.reuse_preflight",
    "capabilities.recreate_mode.on_run",
    "extensions.egress_policies.deny",
    "extensions.resource_limits",
    "extensions.storage_limits",
    "extensions.facts.topology",
    "extensions.services",
    "extensions.save_state",
}


@pytest.mark.slow
def test_conformance_gate_out_of_process_and_parity_with_the_in_process_driver(
    tmp_path: Path, hostdir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:

    binary, sha, _ = _build(tmp_path / "driver")
    env = _env(tmp_path)
    conformance = str(BIN / "vz-conformance")
    external = tmp_path / "external.json"
    run = _run(
        [
            conformance,
            "run",
            "--plugin",
            str(binary),
            "--sha256",
            sha,
            "--adapter",
            ADAPTER_SPEC,
            "--report",
            str(external),
        ],
        env,
        timeout=280,
    )
    failures = [line for line in run.stderr.splitlines() if line.startswith(("FAIL", "     "))]
    assert run.returncode == 0, "\n".join(failures) or run.stderr[-3000:]
    count = _run([conformance, "list", "--count", "--provider-mode", "external"], env).stdout.strip()
    gate = _run(
        [conformance, "verify-report", str(external), "--provider-mode", "external", "--expect-count", count], env
    )
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert f"PASS: external report verified ({count} cases)" in gate.stdout

    cases = json.loads(external.read_text())["runs"][0]["cases"]
    skipped = {case["capability"] for case in cases if case["outcome"] == "not-applicable"}
    assert skipped == NOT_APPLICABLE
    passed = {case["id"] for case in cases if case["outcome"] == "passed"}
    assert {"exec.duplex_backpressure", "cancel.cancelled", "crash.mid_exec", "crash.checksum_changed"} <= passed

    # The same driver object in-process must behave exactly like its plugin (parity gate over both reports), run
    # by the guide's own snippet, as written (docs/driver-authors.md, "Running the conformance suite").
    section = (ROOT / "docs" / "driver-authors.md").read_text().split("## Running the conformance suite", 1)[1]
    snippet = next(block for block in re.findall(r"```python\n(.*?)```", section, re.S) if "run_suite" in block)
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "driver-authors.md", "exec"), {})
    in_process = tmp_path / "in-process.json"
    n = _run([conformance, "list", "--count", "--provider-mode", "parity"], env).stdout.strip()
    parity = _run(
        [conformance, "verify-report", str(in_process), str(external), "--provider-mode=parity", f"--expect-count={n}"],
        env,
    )
    assert parity.returncode == 0, parity.stdout + parity.stderr


# -- behaviour specific to hostdir (in-process) -------------------------------------------------------------


async def _no_input() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover


async def _exec(driver: Any, workspace_id: str, *argv: str, **spec: Any) -> tuple[bytes, bytes, ExecExit]:
    out, err, exit_ = b"", b"", None
    async for event in driver.exec(ExecSpec(workspace_id, argv, **spec), _no_input()):
        if isinstance(event, ExecOutput):
            if event.stream == "stdout":
                out += event.data
            else:
                err += event.data
        else:
            exit_ = event
    assert isinstance(exit_, ExecExit)
    return out, err, exit_


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"image": "debian:12"}, InvalidArgumentError),
        ({"entrypoint": "sleep", "args": ("1000",)}, UnsupportedError),
        ({"user": "a-user-hostdir-cannot-be"}, UnsupportedError),
        ({"platform": "windows/amd64"}, UnsupportedError),
        ({"labels": ("vz.egress=deny",)}, UnsupportedError),
        ({"labels": ("vz.profile=hardened",)}, UnsupportedError),
        ({"privileged": True}, UnsupportedError),
        ({"environment": {"A=B": "x"}}, InvalidArgumentError),
    ],
    ids=["image", "entrypoint", "user", "platform", "egress", "profile", "privileged", "env-name"],
)
async def test_requests_hostdir_cannot_honour_are_refused_before_anything_exists(
    tmp_path: Path, hostdir: Any, change: dict[str, Any], error: type[Exception]
) -> None:
    driver = hostdir.HostdirDriver(tmp_path)
    request = RunImageRequest(**{"workspace_id": "refused", "image": "host", **change})
    with pytest.raises(error) as caught:
        await driver.run_image(request)
    assert caught.value.args[0]
    assert await driver.find("refused") is None
    assert not (tmp_path / "machines").exists()


async def test_machine_root_environment_and_shell_style_exits(tmp_path: Path, hostdir: Any) -> None:
    driver = hostdir.HostdirDriver(tmp_path / "state")
    await driver.run_image(RunImageRequest("a/../b", "host", environment={"SECRET": "s3cr3t"}))
    details = await driver.find("a/../b")
    root = Path(details.config.working_dir)
    assert root.parent.name == hashlib.sha256(b"a/../b").hexdigest()
    out, _, exit_ = await _exec(
        driver, "a/../b", "sh", "-c", 'printf "%s %s %s %s" "$PWD" "$HOME" "$HOSTDIR_ROOT" "$SECRET"'
    )
    assert (out.decode(), exit_) == (f"{root} {root} {root} s3cr3t", ExecExit(0))
    assert stat.S_IMODE((root.parent / "machine.json").stat().st_mode) == 0o600  # it holds environment values
    _, err, exit_ = await _exec(driver, "a/../b", "no-such-command-here")
    assert exit_ == ExecExit(127) and b"no-such-command-here" in err
    _, _, exit_ = await _exec(driver, "a/../b", "sh", "-c", "kill -TERM $$")
    assert exit_ == ExecExit(143, "SIGTERM")
    with pytest.raises(UnsupportedError):
        await _exec(driver, "a/../b", "id", user="a-user-hostdir-cannot-be")
    with pytest.raises(AlreadyExistsError):
        await driver.run_image(RunImageRequest("a/../b", "host", allow_recreate=True))
    # A new driver object (a relaunched plugin) finds the Machine exactly as it was.
    assert await hostdir.HostdirDriver(tmp_path / "state").find("a/../b") == details


async def test_stop_ends_running_commands_and_stopped_machines_refuse_exec(tmp_path: Path, hostdir: Any) -> None:
    driver = hostdir.HostdirDriver(tmp_path)
    await driver.run_image(RunImageRequest("m", "host"))
    events = driver.exec(ExecSpec("m", ("sh", "-c", "echo ready; sleep 1000")), _no_input())
    first = await anext(events)
    assert first == ExecOutput("stdout", b"ready\n")
    await driver.stop("m")
    rest = [event async for event in events]
    assert rest == [ExecExit(137, "SIGKILL")]
    assert (await driver.find("m")).state.status == "stopped"
    with pytest.raises(FailedPreconditionError):
        await _exec(driver, "m", "true")
    await driver.start("m")
    assert (await _exec(driver, "m", "true"))[2] == ExecExit(0)
    await driver.delete("m")
    await driver.delete("m")
    with pytest.raises(NotFoundError):
        await driver.start("m")


def test_make_manifest_appends_args_and_the_default_state_follows_vz_home(
    tmp_path: Path, hostdir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "make_manifest.py"),
            "--out",
            str(tmp_path),
            "--arg=--state-dir",
            "--arg=/srv/x",
        ],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert json.loads((tmp_path / "manifest.json").read_text())["args"] == ["--state-dir", "/srv/x"]
    from vz_driver_hostdir.plugin import default_state_dir

    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "home" / "drivers" / "hostdir"
    monkeypatch.delenv("VZ_HOME")
    assert default_state_dir() == tmp_path / "xdg" / "vz-driver-hostdir"
