"""The vz.api.v1 messages ARE the local wire's JSON: real reports from the Environment layer (fake driver,
in-process) parse into their proto message without unknown fields and convert back to the identical object."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from vz_core.api import pb
from vz_core.env import Context, Progress, delete, list_volumes, status, stop, up

api = pb.api_pb2


class Recorder(Progress):
    """Records progress exactly as the daemon sends it: today's --json line without "command"."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    @contextmanager
    def step(self, action: str, message: str, **fields: Any) -> Iterator[None]:
        line = {"event": "step", "action": action, "message": message}
        self.sent.append({**line, "status": "started", **fields})
        try:
            yield
        except BaseException:
            self.sent.append({**line, "status": "failed", "seconds": 0.5, **fields})
            raise
        self.sent.append({**line, "status": "succeeded", "seconds": 0.25, **fields})

    def note(self, kind: str, message: str, **fields: Any) -> None:
        self.sent.append({"event": kind if kind == "plan" else "note", "kind": kind, "message": message, **fields})


def roundtrip(data: dict[str, Any], cls: type[Any]) -> None:
    # JSON text first: the daemon sends JSON, never Python objects.
    wire = json.loads(json.dumps(data))
    message = pb.from_wire(wire, cls)
    assert pb.to_wire(message) == wire


def fake_machine(name: str, **extra: Any) -> dict[str, Any]:
    base = {"name": name, "profile": "developer", "driver": "fake", "image": "vz:default"}
    return {**base, "workspace": {"projection": "none"}, **extra}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VZ_HOME", str(tmp_path / "home"))
    root = tmp_path / "proj"
    root.mkdir()
    machines = [fake_machine("web"), fake_machine("db", environment={"A": "1"})]
    definition = {"version": 1, "project_id": "demo", "default_machine": "web", "machines": machines}
    (root / "vz.json").write_text(json.dumps(definition))
    return root


async def test_up_status_stop_delete_reports_roundtrip(project: Path) -> None:
    progress = Recorder()
    ctx = Context(cwd=project, environ={}, progress=progress)
    first = await up(ctx)
    roundtrip(first, api.UpResult)
    dry = await up(ctx, dry_run=True)
    roundtrip(dry, api.UpResult)
    # A creation-time change gives a plan with changes (recorded/desired values, environment keys).
    data = json.loads((project / "vz.json").read_text())
    data["machines"][1]["environment"] = {"A": "2"}
    data["machines"][0]["image"] = "registry.local/other:1"
    (project / "vz.json").write_text(json.dumps(data))
    changed = await up(ctx, dry_run=True, recreate=True)
    assert {c["field"] for s in changed["plan"]["steps"] for c in s["changes"]} == {"image", "environment"}
    roundtrip(changed, api.UpResult)
    report = await status(ctx)
    assert report["environments"][0]["drift"]["status"] == "drifted"
    roundtrip(report, api.StatusReport)
    roundtrip(await status(ctx, all_environments=True), api.StatusReport)
    roundtrip(await stop(ctx), api.StopResult)
    roundtrip(await delete(ctx, keep_volumes=True), api.DeleteResult)
    roundtrip(await list_volumes(ctx), api.VolumeList)
    assert progress.sent and {p["event"] for p in progress.sent} >= {"step", "note", "plan"}
    for message in progress.sent:
        roundtrip(message, api.Progress)


def test_an_unknown_key_fails_loudly() -> None:
    with pytest.raises(json_format.ParseError, match="surprise"):
        pb.from_wire({"project_id": "p", "surprise": 1}, api.UpResult)


async def test_a_version_2_environments_network_step_and_endpoints_roundtrip(project: Path) -> None:
    """What the daemon adds for a version 2 Environment: its `network` progress step (with the route domain)
    and the status document's endpoints (the exports it listens on)."""
    ctx = Context(cwd=project, environ={}, progress=Recorder())
    await up(ctx)
    report = await status(ctx)
    report["environments"][0]["endpoints"] = [
        {"machine": "web", "service": "http", "protocol": "tcp", "host": "127.0.0.1", "port": 3000}
    ]
    roundtrip(report, api.StatusReport)
    step = {
        "event": "step",
        "action": "network",
        "status": "started",
        "message": "preparing route domain vzd-0123456789ab",
        "environment": "default",
        "environment_id": "env_0123456789ab",
        "route_domain": "vzd-0123456789ab",
    }
    roundtrip(step, api.Progress)
    await delete(ctx)
