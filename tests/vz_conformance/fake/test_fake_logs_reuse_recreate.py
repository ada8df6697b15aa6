"""Logs (the Machine's main process), ReusePreflight and recreation of the fake driver."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from fake_testlib import (
    feed,
    identity,
    request,
    run_exec,
    tree_with_marker,
    unique_id,
    wait_dead,
    wait_logs,
    wait_tree,
)
from vz_conformance.fake import FakeDriver, _driver
from vz_conformance.fake._main import stop_main_process

from vz_core import MAX_CHUNK, ExecExit, ExecOutput, ExecSpec, HostRequirements, Mount, MountType
from vz_core.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError, UnsupportedError


async def _logs(driver: FakeDriver, workspace_id: str) -> list[bytes]:
    return [chunk async for chunk in driver.logs(workspace_id)]


# Logs --------------------------------------------------------------------------------------------------------


async def test_logs_are_the_merged_main_process_output(driver: FakeDriver) -> None:
    ws = unique_id()
    script = "printf out; printf err >&2; printf '\\0\\377'"
    await driver.run_image(request(ws, entrypoint="sh", args=("-c", script)))
    assert await wait_logs(driver, ws, b"\x00\xff") == b"outerr\x00\xff"


async def test_args_alone_are_the_main_process(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, args=("echo", "from args")))
    await wait_logs(driver, ws, b"from args\n")
    assert await _logs(driver, ws) == [b"from args\n"]


async def test_no_main_process_means_empty_logs(driver: FakeDriver, machine: str) -> None:
    assert await _logs(driver, machine) == []


async def test_main_process_runs_again_on_start_and_appends(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, entrypoint="echo", args=("boot",), environment={"X": "1"}))
    await wait_logs(driver, ws, b"boot\n")
    await driver.stop(ws)
    await driver.start(ws)
    await driver.start(ws)  # already running: no new run
    assert await wait_logs(driver, ws, b"boot\n") in (b"boot\n", b"boot\nboot\n")
    assert await wait_logs(driver, ws, b"boot\nboot\n") == b"boot\nboot\n"


async def test_main_process_sees_the_machine_environment_and_root(driver: FakeDriver) -> None:
    ws = unique_id()
    args = ("-c", 'echo "$GREETING"; pwd')
    await driver.run_image(request(ws, entrypoint="sh", args=args, environment={"GREETING": "hi"}))
    details = await driver.find(ws)
    assert details is not None
    assert await wait_logs(driver, ws, b"/root\n") == f"hi\n{details.config.working_dir}\n".encode()


async def test_logs_keep_a_bounded_tail(driver: FakeDriver) -> None:
    ws = unique_id()
    script = "head -c 3000000 /dev/zero; printf tail-marker"
    await driver.run_image(request(ws, entrypoint="sh", args=("-c", script)))
    data = await wait_logs(driver, ws, b"tail-marker")
    assert len(data) == _driver.LOG_LIMIT
    chunks = await _logs(driver, ws)
    assert all(1 <= len(chunk) <= MAX_CHUNK for chunk in chunks)
    log_file = driver._store.machine_dir(driver._store.key(ws)) / "log"
    assert log_file.stat().st_size <= 2 * _driver.LOG_LIMIT


async def test_main_process_runs_until_stop_and_restarts_on_start(driver: FakeDriver) -> None:
    ws = unique_id()
    marker = f"vz-main-{ws}"
    await driver.run_image(request(ws, entrypoint="sh", args=("-c", "echo up; sleep 1000 & wait", marker)))
    await wait_logs(driver, ws, b"up\n")
    first = [identity(p) for p in await wait_tree(marker, 2)]
    await driver.stop(ws)
    assert await wait_dead(first) == []
    await driver.start(ws)
    await wait_logs(driver, ws, b"up\nup\n")
    second = [identity(p) for p in await wait_tree(marker, 2)]
    assert set(second).isdisjoint(first)
    await driver.delete(ws)
    assert await wait_dead(second) == []


async def test_a_relaunched_driver_stops_the_main_process(state_dir: Path) -> None:
    ws = unique_id()
    marker = f"vz-main-{ws}"
    args = ("-c", "echo up; sleep 1000 & wait", marker)
    await FakeDriver(state_dir).run_image(request(ws, entrypoint="sh", args=args))
    relaunched = FakeDriver(state_dir)
    await wait_logs(relaunched, ws, b"up\n")
    tree = [identity(p) for p in await wait_tree(marker, 2)]
    await relaunched.stop(ws)
    assert await wait_dead(tree) == []


async def test_recreation_replaces_the_main_process_and_its_log(driver: FakeDriver) -> None:
    ws = unique_id()
    marker = f"vz-main-{ws}"
    chatty = "while :; do echo old; sleep 0.005; done"
    await driver.run_image(request(ws, entrypoint="sh", args=("-c", chatty, marker)))
    await wait_logs(driver, ws, b"old\n")
    old = [identity(p) for p in await wait_tree(marker, 1)]
    await driver.run_image(request(ws, allow_recreate=True, entrypoint="echo", args=("new",)))
    assert await wait_dead(old) == []
    assert await wait_logs(driver, ws, b"new\n") == b"new\n"


async def test_main_process_that_cannot_start_is_reported_in_the_log(driver: FakeDriver, tmp_path: Path) -> None:
    script = tmp_path / "entry.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)
    ws = unique_id()
    await driver.run_image(request(ws, entrypoint=str(script)))
    await wait_logs(driver, ws, b"ran\n")
    await driver.stop(ws)
    script.unlink()
    await driver.start(ws)
    data = await wait_logs(driver, ws, b"No such file or directory\n")
    assert data.startswith(b"ran\nvz-fake: cannot start the main process")
    details = await driver.find(ws)
    assert details is not None and details.state.status == "running"


def test_stopping_a_main_process_checks_its_identity() -> None:
    proc = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    try:
        started = psutil.Process(proc.pid).create_time()
        stop_main_process(proc.pid, started + 1)  # a recycled pid: left alone
        assert proc.poll() is None
        stop_main_process(proc.pid, started)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


async def test_logs_on_missing(driver: FakeDriver) -> None:
    with pytest.raises(NotFoundError):
        await _logs(driver, unique_id())


async def test_logs_of_a_stopped_machine_are_kept_and_do_not_start_it(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, entrypoint="sh", args=("-c", "echo first; exec sleep 1000")))
    running = await wait_logs(driver, ws, b"first\n")
    await driver.stop(ws)
    assert b"".join(await _logs(driver, ws)) == running == b"first\n"
    details = await driver.find(ws)
    assert details is not None and details.state.status == "stopped"
    with pytest.raises(FailedPreconditionError):  # really still stopped, not only reported so
        await run_exec(driver, ws, ["true"])
    await driver.start(ws)  # the next run's output follows the last one's
    assert await wait_logs(driver, ws, b"first\nfirst\n") == b"first\nfirst\n"
    await driver.delete(ws)


# ReusePreflight ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "remote_user", "identity"),
    [("", "", "root"), ("nobody", "", "nobody"), ("nobody", "dev", "dev"), ("", "dev", "dev")],
)
async def test_reuse_preflight_same_identity(driver: FakeDriver, user: str, remote_user: str, identity: str) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, user=user, remote_user=remote_user))
    await driver.reuse_preflight(ws, identity)
    if identity == "root":
        await driver.reuse_preflight(ws, "")  # an unresolved identity is root


async def test_reuse_preflight_changed_identity_needs_recreate(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, remote_user="alice"))
    before = await driver.find(ws)
    with pytest.raises(FailedPreconditionError) as caught:
        await driver.reuse_preflight(ws, "bob")
    assert "--recreate" in caught.value.message
    assert "alice" in caught.value.message and "bob" in caught.value.message
    assert repr(await driver.find(ws)) == repr(before)


async def test_reuse_preflight_never_mutates(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, remote_user="alice"))
    await driver.stop(ws)
    record = driver._store.machine_dir(driver._store.key(ws)) / "machine.json"
    raw_before, details_before = record.read_bytes(), await driver.find(ws)
    await driver.reuse_preflight(ws, "alice")
    with pytest.raises(FailedPreconditionError):
        await driver.reuse_preflight(ws, "mallory")
    assert record.read_bytes() == raw_before
    assert await driver.find(ws) == details_before


async def test_reuse_preflight_missing(driver: FakeDriver) -> None:
    with pytest.raises(NotFoundError):
        await driver.reuse_preflight(unique_id(), "root")


# Recreation --------------------------------------------------------------------------------------------------


async def _marked_machine(driver: FakeDriver, *, stopped: bool = False) -> str:
    ws = unique_id()
    await driver.run_image(request(ws, entrypoint="echo", args=("old log",)))
    await wait_logs(driver, ws, b"old log\n")
    await run_exec(driver, ws, ["sh", "-c", "echo old > marker"])
    if stopped:
        await driver.stop(ws)
    return ws


async def test_valid_recreation_changes_identity_and_resets_root(driver: FakeDriver) -> None:
    ws = await _marked_machine(driver)
    before = await driver.find(ws)
    await driver.run_image(request(ws, allow_recreate=True, labels=("gen=2",), remote_user="bob"))
    after = await driver.find(ws)
    assert before is not None and after is not None
    assert after.id != before.id
    assert after.created_at >= before.created_at
    assert dict(after.config.labels) == {"gen": "2"}
    assert after.state.status == "running"
    result = await run_exec(driver, ws, ["ls", "-A"])
    assert result.stdout == b""
    assert await _logs(driver, ws) == []
    await driver.reuse_preflight(ws, "bob")


async def test_recreation_of_a_stopped_machine(driver: FakeDriver) -> None:
    ws = await _marked_machine(driver, stopped=True)
    await driver.run_image(request(ws, allow_recreate=True))
    after = await driver.find(ws)
    assert after is not None and after.state.status == "running"


async def test_allow_recreate_on_a_missing_machine_creates_it(driver: FakeDriver) -> None:
    ws = unique_id()
    await driver.run_image(request(ws, allow_recreate=True))
    assert await driver.find(ws) is not None


INVALID_REPLACEMENTS: list[tuple[dict[str, object], type[Exception]]] = [
    ({"image": "invalid/x"}, InvalidArgumentError),
    ({"image": ""}, InvalidArgumentError),
    ({"mounts": (Mount(MountType.BIND, "/a", "/b"),)}, UnsupportedError),
    ({"host_requirements": HostRequirements(cpus=4)}, UnsupportedError),
    ({"user": "no-such-user-vz"}, InvalidArgumentError),
    ({"entrypoint": "no-such-command-vz"}, InvalidArgumentError),
]


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped"])
@pytest.mark.parametrize(
    ("overrides", "error"), INVALID_REPLACEMENTS, ids=["image", "empty-image", "mount", "cpus", "user", "entrypoint"]
)
async def test_invalid_replacement_leaves_the_old_machine_exactly_as_it_was(
    driver: FakeDriver, stopped: bool, overrides: dict[str, object], error: type[Exception]
) -> None:
    ws = await _marked_machine(driver, stopped=stopped)
    before = await driver.find(ws)
    with pytest.raises(error):
        await driver.run_image(request(ws, allow_recreate=True, **overrides))
    assert await driver.find(ws) == before
    if stopped:
        await driver.start(ws)
    assert (await run_exec(driver, ws, ["cat", "marker"])).stdout == b"old\n"
    assert await wait_logs(driver, ws, b"old log\n" * (2 if stopped else 1)) == b"old log\n" * (2 if stopped else 1)


async def test_recreation_kills_commands_of_the_old_machine(driver: FakeDriver, machine: str) -> None:
    marker = f"vz-old-{machine}"
    events = driver.exec(ExecSpec(machine, ("sh", "-c", "echo ready; sleep 1000", marker)), feed(()))
    assert await anext(events) == ExecOutput("stdout", b"ready\n")
    tree = [identity(p) for p in tree_with_marker(marker)]
    await driver.run_image(request(machine, allow_recreate=True))
    assert [event async for event in events] == [ExecExit(137, "SIGKILL")]
    assert await wait_dead(tree) == []
