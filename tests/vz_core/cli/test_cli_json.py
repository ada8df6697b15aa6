"""`--json` output: the documented, stable shapes of docs/cli.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vzcli import Vz


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_up_emits_json_lines_ending_with_the_result(vz: Vz, project: Path) -> None:
    events = lines(vz.ok("up", "--json", cwd=project))
    assert all(e["command"] == "up" for e in events)
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "result" and "plan" in kinds
    steps = [e for e in events if e["event"] == "step"]
    assert {(e["action"], e["status"]) for e in steps} >= {("create", "started"), ("create", "succeeded")}
    created = [e["machine"] for e in steps if e["action"] == "create" and e["status"] == "succeeded"]
    assert created == ["web", "db"]
    result = events[-1]
    assert set(result) >= {"project_id", "environment", "dry_run", "plan", "machines"}
    assert result["environment"]["name"] == "default" and result["environment"]["state"] == "running"
    assert [(m["name"], m["state"], m["default"]) for m in result["machines"]] == [
        ("web", "running", True),
        ("db", "running", False),
    ]
    plan = next(e for e in events if e["event"] == "plan")["plan"]
    assert [(s["action"], s["machine"]) for s in plan["steps"]] == [("create", "web"), ("create", "db")]


def test_status_json_shape(vz: Vz, running: Path) -> None:
    report = vz.status(running)
    assert report["schema"] == "vz.status/1"
    assert report["project"] == {"id": "demo", "definition": str(running / "vz.json"), "definition_error": None}
    (env,) = report["environments"]
    assert set(env) == {
        "id",
        "name",
        "project_id",
        "state",
        "worktree",
        "bound_worktrees",
        "default_machine",
        "created_at",
        "updated_at",
        "last_operation",
        "interrupted_operations",
        "machines",
        "drift",
        "health",
    }
    assert env["bound_worktrees"] == [str(running)] and env["default_machine"] == "web"
    assert env["drift"] == {"status": "in-sync", "not_created": [], "default_machine": None}
    web = env["machines"][0]
    assert set(web) == {
        "id",
        "name",
        "workspace_id",
        "default",
        "target",
        "profile",
        "image",
        "workspace",
        "driver",
        "state",
        "recorded_state",
        "find",
        "error",
        "drift",
        "health",
        "services",
    }
    assert web["services"] == []  # the fake driver supervises no services
    assert web["workspace_id"] == f"vz-demo-{env['id']}-{web['id']}"
    assert set(web["driver"]) == {
        "name",
        "driver_name",
        "version",
        "api",
        "runtime",
        "capabilities",
        "extensions",
        "accelerator",
        "matrix",
        "provenance",
    }
    assert web["driver"]["extensions"]["profiles"] == ["developer"]
    assert web["driver"]["matrix"]["status"] == "ACTIVE"
    assert web["find"]["status"] == "running" and web["state"] == "running"
    # live health: what the driver answered just now, not only the record
    assert web["health"]["source"] == "driver" and web["health"]["state"] == "running" and web["health"]["checked_at"]
    assert env["health"]["source"] == "driver" and env["health"]["state"] == "running"


def test_status_reports_drift_from_the_definition(vz: Vz, running: Path) -> None:
    data = json.loads((running / "vz.json").read_text())
    data["machines"][1]["image"] = "registry.local/newer:1"
    data["machines"].append({**data["machines"][0], "name": "cache"})
    (running / "vz.json").write_text(json.dumps(data))
    env = vz.status(running)["environments"][0]
    assert env["drift"]["status"] == "drifted" and env["drift"]["not_created"] == ["cache"]
    db = next(m for m in env["machines"] if m["name"] == "db")
    assert db["drift"] == {
        "status": "drifted",
        "changes": [
            {"field": "image", "kind": "creation", "recorded": "vz:default", "desired": "registry.local/newer:1"}
        ],
    }
    human = vz.ok("status", cwd=running)
    assert "drift from vz.json: not created: cache; changed: db" in human


def test_errors_in_json_mode_are_json_too(vz: Vz, running: Path) -> None:
    proc = vz.run("status", "--json", "--environment", "nope", cwd=running)
    assert proc.returncode == 3
    (event,) = lines(proc.stdout.decode())
    assert event["event"] == "error" and event["command"] == "status"
    assert event["error"]["kind"] == "not_found" and event["error"]["exit_code"] == 3
    assert "--environment nope" in event["error"]["message"]


def test_plan_blocked_needs_recreate_and_exits_4(vz: Vz, running: Path) -> None:
    data = json.loads((running / "vz.json").read_text())
    data["machines"][0]["image"] = "registry.local/other:1"
    (running / "vz.json").write_text(json.dumps(data))
    before = vz.status(running)["environments"][0]["machines"][0]["find"]
    err = vz.fails(4, "up", cwd=running)
    assert "machine web: creation-time settings changed: image" in err and "vz up --recreate" in err
    assert vz.status(running)["environments"][0]["machines"][0]["find"] == before
    dry = lines(vz.ok("up", "--recreate", "--dry-run", "--json", cwd=running))[-1]
    assert dry["dry_run"] and [s["action"] for s in dry["plan"]["steps"]] == ["recreate", "keep"]
    assert vz.status(running)["environments"][0]["machines"][0]["find"] == before
    vz.ok("up", "--recreate", cwd=running)
    after = vz.status(running)["environments"][0]["machines"][0]
    assert after["find"]["id"] != before["id"] and after["drift"]["status"] == "in-sync"


def test_status_table_shows_endpoints_when_the_daemon_lists_them() -> None:
    from vz_core.cli._render import render_status

    env = {
        "id": "env_000000000000",
        "name": "default",
        "project_id": "demo",
        "state": "running",
        "bound_worktrees": [],
        "interrupted_operations": [],
        "drift": {"status": "in-sync", "not_created": [], "default_machine": None},
        "machines": [],
    }
    report: dict[str, Any] = {"project": None, "environments": [env]}
    assert "endpoints" not in render_status(report)
    env["endpoints"] = [{"machine": "app", "service": "http", "protocol": "tcp", "host": "127.0.0.1", "port": 3000}]
    assert "  endpoints: app/http → 127.0.0.1:3000\n" in render_status(report)


def test_status_table_shows_each_machines_services() -> None:
    from vz_core.cli._render import render_status

    machine = {
        "id": "mch_000000000000",
        "name": "app",
        "default": True,
        "state": "running",
        "driver": {"name": "linux_native", "version": "1"},
        "target": {"os": "linux", "arch": "amd64"},
        "profile": "developer",
        "drift": {"status": "in-sync"},
        "services": [],
    }
    env = {
        "id": "env_000000000000",
        "name": "default",
        "project_id": "demo",
        "state": "running",
        "bound_worktrees": [],
        "interrupted_operations": [],
        "drift": {"status": "in-sync", "not_created": [], "default_machine": None},
        "machines": [machine],
    }
    report: dict[str, Any] = {"project": None, "environments": [env]}
    assert "services:" not in render_status(report)
    machine["services"] = [
        {
            "name": "http",
            "state": "running",
            "health": "healthy",
            "pid": 12,
            "restarts": 0,
            "last_exit_code": None,
            "last_signal": "",
            "last_error": "",
            "started_at": "",
        },
        {
            "name": "jobs",
            "state": "backoff",
            "health": "",
            "pid": 0,
            "restarts": 3,
            "last_exit_code": 137,
            "last_signal": "SIGKILL",
            "last_error": "",
            "started_at": "",
        },
    ]
    text = render_status(report)
    lines = text.splitlines()
    header = lines.index("  services:")
    assert lines[header + 1].split() == [
        "MACHINE",
        "SERVICE",
        "STATE",
        "HEALTH",
        "PID",
        "RESTARTS",
        "LAST",
        "EXIT",
        "NOTE",
    ]
    assert lines[header + 2].split() == ["app", "http", "running", "healthy", "12", "0", "-"]
    assert lines[header + 3].split() == ["app", "jobs", "backoff", "-", "-", "3", "137", "SIGKILL"]
