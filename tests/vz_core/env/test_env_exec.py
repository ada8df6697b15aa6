"""The exec flow of the Environment layer: select (prepare_exec), then execute (driver, ExecSpec, stream), with
driver errors translated once into messages naming the Machine and the fix. No terminal involved."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from vz_core.env import Context, ExecTarget, execute, prepare_exec, stop, up
from vz_core.errors import FailedPreconditionError, NotFoundError


async def _no_stdin() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Context:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    root = tmp_path / "proj"
    root.mkdir()
    machine = {"name": "web", "profile": "developer", "driver": "fake", "image": "vz:default"}
    data = {"version": 1, "project_id": "demo", "machines": [{**machine, "workspace": {"projection": "none"}}]}
    (root / "vz.json").write_text(json.dumps(data))
    context = Context(cwd=root, environ={})
    asyncio.run(up(context))
    return Context(cwd=root, environ={})


def _run(ctx: Context, target: ExecTarget, argv: list[str]) -> tuple[int, dict[str, bytes]]:
    chunks: dict[str, bytes] = {"stdout": b"", "stderr": b""}

    def sink(stream: str, data: bytes) -> None:
        chunks[stream] += data

    event = asyncio.run(execute(ctx, target, argv, _no_stdin(), sink))
    return event.exit_code, chunks


def test_execute_streams_output_to_the_sink_and_returns_the_exit(ctx: Context) -> None:
    target = prepare_exec(ctx)
    assert target.machine.name == "web" and target.workdir == ""
    code, chunks = _run(ctx, target, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (code, chunks) == (3, {"stdout": b"out\n", "stderr": b"err\n"})


def test_a_stopped_machine_is_translated_once_with_the_fix(ctx: Context) -> None:
    target = prepare_exec(ctx)
    asyncio.run(stop(Context(cwd=ctx.cwd, environ={})))
    with pytest.raises(
        FailedPreconditionError, match=r"machine web of Environment default .* is not running; run `vz up"
    ):
        _run(ctx, target, ["true"])


def test_a_machine_its_driver_lost_is_translated_once_with_the_fix(ctx: Context) -> None:
    target = prepare_exec(ctx)
    from vz_conformance.fake import FakeDriver

    asyncio.run(FakeDriver().delete(target.machine.workspace_id))
    with pytest.raises(NotFoundError, match=r"does not exist in driver 'fake'; run `vz up --environment default`"):
        _run(ctx, target, ["true"])


def test_execute_local_runs_the_command_on_the_given_descriptors(ctx: Context, tmp_path: Path) -> None:
    from vz_core.env import execute_local

    target = prepare_exec(ctx)
    source = tmp_path / "in"
    source.write_bytes(b"a\nb\nc\n")
    stdin = os.open(source, os.O_RDONLY)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        event = asyncio.run(
            execute_local(
                ctx,
                target,
                ["sh", "-c", "wc -l; echo $GREETING >&2; exit 4"],
                (stdin, out_w, err_w),
                environment={"GREETING": "hi"},
            )
        )
        os.close(out_w)
        os.close(err_w)
        out_w = err_w = -1
        assert (event.exit_code, os.read(out_r, 100).strip(), os.read(err_r, 100)) == (4, b"3", b"hi\n")
    finally:
        for fd in (stdin, out_r, out_w, err_r, err_w):
            if fd >= 0:
                os.close(fd)


def test_execute_local_refuses_a_terminal(ctx: Context) -> None:
    from vz_core.env import execute_local
    from vz_core.errors import InvalidArgumentError

    target = prepare_exec(ctx)
    leader, follower = os.openpty()
    try:
        with pytest.raises(InvalidArgumentError, match="terminal"):
            asyncio.run(execute_local(ctx, target, ["true"], (follower, follower, follower)))
    finally:
        os.close(leader)
        os.close(follower)


def test_status_says_where_each_state_comes_from(ctx: Context) -> None:
    from vz_conformance.fake import FakeDriver

    from vz_core.env import status

    report = asyncio.run(status(ctx))
    machine = report["environments"][0]["machines"][0]
    assert machine["health"]["source"] == "driver" and machine["health"]["state"] == "running"
    assert report["environments"][0]["health"]["state"] == "running"
    asyncio.run(FakeDriver().delete(machine["workspace_id"]))
    after = asyncio.run(status(ctx))["environments"][0]
    assert (after["machines"][0]["health"]["state"], after["machines"][0]["recorded_state"]) == ("missing", "running")
    assert after["health"] == {**after["health"], "source": "driver", "state": "degraded"}
