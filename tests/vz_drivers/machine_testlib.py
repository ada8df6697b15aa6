"""Helpers shared by the tests of agent-Machine drivers (linux_native, qemu) and the security tests using them."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vz_core import Driver, ExecExit, ExecOutput, ExecSpec, RunImageRequest


@dataclass
class Result:
    stdout: bytes
    stderr: bytes
    exit: ExecExit
    frames: list[int] = field(default_factory=list)
    """Sizes of the output frames, in order."""


async def chunks(data: bytes | Iterable[bytes] = b"") -> AsyncIterator[bytes]:
    """``data`` as an exec's stdin: 32 KiB pieces of one bytes object, or the given pieces."""
    parts = [data[i : i + 32768] for i in range(0, len(data), 32768)] if isinstance(data, bytes) else list(data)
    for part in parts:
        if part:
            yield part


async def run(
    driver: Driver,
    workspace_id: str,
    *argv: str,
    stdin: bytes = b"",
    env: Mapping[str, str] | None = None,
    **spec: object,
) -> Result:
    """Run a command to completion and collect its output; exactly one exit, nothing after it.

    ``spec`` holds further ``ExecSpec`` fields (``user``, ``workdir``, ``tty``; ``environment`` like ``env``).
    """
    out, err = bytearray(), bytearray()
    frames: list[int] = []
    exits: list[ExecExit] = []
    environment = dict(env or spec.pop("environment", None) or {})  # type: ignore[call-overload]
    request = ExecSpec(workspace_id=workspace_id, argv=tuple(argv), environment=environment, **spec)  # type: ignore[arg-type]
    async for event in driver.exec(request, chunks(stdin)):
        assert not exits, "an event arrived after the exit"
        if isinstance(event, ExecOutput):
            assert 1 <= len(event.data) <= 32768
            frames.append(len(event.data))
            (out if event.stream == "stdout" else err).extend(event.data)
        else:
            exits.append(event)
    assert len(exits) == 1, "exactly one exit expected"
    return Result(bytes(out), bytes(err), exits[0], frames)


async def sh(driver: Driver, workspace_id: str, script: str, *args: str, **kw: object) -> Result:
    return await run(driver, workspace_id, "sh", "-c", script, "sh", *args, **kw)  # type: ignore[arg-type]


def request(workspace_id: str, **kw: object) -> RunImageRequest:
    """A Machine request on the embedded default image whose main process keeps running."""
    base: dict[str, object] = {"workspace_id": workspace_id, "image": "vz:default", "args": ("sleep", "1000000")}
    base.update(kw)
    return RunImageRequest(**base)  # type: ignore[arg-type]


async def wait_pid_exit(pid: int) -> None:
    """Wait (on a pidfd, no polling) until process ``pid`` has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    loop.add_reader(fd, exited.set)
    try:
        await asyncio.wait_for(exited.wait(), 10)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return True
    return data[data.rfind(b")") + 2 : data.rfind(b")") + 3] in (b"Z", b"X")


def plugin_driver(tmp_path: Path, name: str, state_dir: Path, image_dir: Path, agent_binary: str) -> Driver:
    """The built-in driver ``name`` served by its plugin main, as a RemoteDriver (launched on first use)."""
    from vz_core.rpc import RemoteDriver
    from vz_core.transport import LaunchSpec, PluginLauncher

    script = tmp_path / f"vz-driver-{name}"
    script.write_text(f"#!{sys.executable}\nfrom vz_drivers.{name}.registration import main\nmain()\n")
    script.chmod(0o755)
    argv = [str(script), "--state-dir", str(state_dir), "--image-dir", str(image_dir)]
    argv += ["--option", f"agent_binary={agent_binary}"]
    return RemoteDriver(PluginLauncher(lambda: LaunchSpec(name, argv), name=name))


def parity_run(
    tmp_path: Path, driver: str, *extra: str, timeout: float, through_daemon: bool = False
) -> dict[str, Any]:
    """``vz-conformance run --provider-mode parity`` for ``driver`` exactly as CI runs it, gated by
    ``verify-report``; returns the report.

    ``through_daemon``: the external side is the vz daemon's own plugin of ``driver`` (``--through-daemon``), the
    daemon of a private VZ_HOME under ``tmp_path`` (plugins never idle out during the run), stopped afterwards."""
    from vz_conformance._gate import expected_count

    report = tmp_path / f"{driver}-parity.json"
    command = [
        "vz-conformance",
        "run",
        "--driver",
        driver,
        *extra,
        "--provider-mode",
        "parity",
        *(["--through-daemon"] if through_daemon else []),
        "--report",
        str(report),
    ]
    env = dict(os.environ)
    home = tmp_path / "home"
    if through_daemon:
        env.update(VZ_HOME=str(home), VZ_DAEMON_PLUGIN_IDLE="0")
    try:
        run_ = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    finally:
        if through_daemon:
            from vz_core.daemon import stop_daemon

            stop_daemon(home, env)
    assert run_.returncode == 0, run_.stdout[-4000:] + run_.stderr[-6000:]
    count = expected_count("parity")
    gate = subprocess.run(
        ["vz-conformance", "verify-report", str(report), "--provider-mode", "parity", "--expect-count", str(count)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gate.returncode == 0, gate.stdout + gate.stderr
    doc: dict[str, Any] = json.loads(report.read_text())
    return doc


def not_passed(report: dict[str, Any]) -> list[str]:
    """Ids of the cases of a report that did not pass (in any run)."""
    return sorted({c["id"] for r in report["runs"] for c in r["cases"] if c["outcome"] != "passed"})


def not_applicable(report: dict[str, Any]) -> list[str]:
    """Ids of the cases of a report that were verified refusals (``not-applicable``) in some run."""
    return sorted({c["id"] for r in report["runs"] for c in r["cases"] if c["outcome"] == "not-applicable"})


CHECKPOINT_CASES = ["checkpoint.corrupt_refused", "checkpoint.delete_removes_state", "checkpoint.resume_keeps_process"]
"""The ``checkpoint`` label's cases: not applicable to a driver that declares ``save_state`` false."""


async def check_machines_outlive_the_plugin(
    tmp_path: Path,
    name: str,
    state_dir: Path,
    image_dir: Path,
    agent_binary: str,
    *,
    while_detached: Callable[[], None] = lambda: None,
) -> None:
    """A Machine made through ``name``'s plugin keeps running (and its files) when the plugin exits; a relaunched
    plugin finds it as it was, execs in it and deletes it. ``while_detached`` checks the host in between."""
    first = plugin_driver(tmp_path, name, state_dir, image_dir, agent_binary)
    second: Driver | None = None
    try:
        info = await first.info()
        assert info.driver_name == name
        await first.run_image(request("plugin-machine"))
        result = await run(
            first, "plugin-machine", "sh", "-c", "echo out; echo err >&2; echo kept > /var/tmp/f; exit 3"
        )
        assert (result.stdout, result.stderr, result.exit.exit_code) == (b"out\n", b"err\n", 3)
        before = await first.find("plugin-machine")
        assert before is not None and before.state.status == "running"
        await first.close()  # the plugin process exits; the Machine keeps running
        while_detached()
        second = plugin_driver(tmp_path, name, state_dir, image_dir, agent_binary)
        assert await second.find("plugin-machine") == before
        assert (await run(second, "plugin-machine", "cat", "/var/tmp/f")).stdout == b"kept\n"
        await second.delete("plugin-machine")
        assert await second.find("plugin-machine") is None
    finally:
        if second is not None:
            await second.close()
        await first.close()
        cleanup = importlib.import_module(f"vz_drivers.{name}").cleanup_state
        await cleanup(str(state_dir), image_dir=str(image_dir), agent_binary=agent_binary)
