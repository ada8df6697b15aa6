"""Setup steps and services through the real `vz` (CLI, daemon, driver plugin), for every driver of the shared
agent layer: setup runs once and is skipped while unchanged, rerun in place when changed, a failing step fails
`vz up` naming it; services start in order (a one-shot that must complete, then a service with a health check),
a service that cannot start fails `vz up` naming it, and services removed from vz.json stop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from topology_testlib import ProjectVz, vz_project


def _definition(driver: str) -> dict[str, Any]:
    return {
        "version": 2,
        "project_id": f"workload-{driver.replace('_', '-')}",
        "machines": [
            {
                "name": "m",
                "profile": "developer",
                "driver": driver,
                "image": "vz:default",
                "workspace": {"projection": "none"},
                "environment": {"SETUP_VAR": "yes"},
                "setup": ["echo setup ran $SETUP_VAR >> /var/tmp/setup.log", ["echo", "from-setup"]],
                "services": [
                    {"name": "once", "port": 9001, "command": "echo done > /var/tmp/once"},
                    {
                        "name": "web",
                        "port": 9002,
                        "command": ["sh", "-c", "echo web up; exec sleep 100001"],
                        "depends_on": {"once": {"condition": "service_completed_successfully"}},
                        "health": {"command": "test -e /var/tmp/once", "interval": "500ms", "retries": 2},
                        "stop_timeout": "2s",
                    },
                ],
            }
        ],
    }


def _services(vz: ProjectVz) -> dict[str, dict[str, Any]]:
    (machine,) = vz.status()["machines"]
    return {s["name"]: s for s in machine["services"]}


def _running(vz: ProjectVz, pattern: str) -> int:
    """How many processes of the Machine have a command line matching ``pattern`` (a regular expression that
    does not match itself, such as ``sleep 10000[1]``)."""
    script = (
        f"for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '{pattern}' || true"
    )
    return int(vz.sh("m", script))


def _write(vz: ProjectVz, definition: dict[str, Any]) -> None:
    (vz.cwd / "vz.json").write_text(json.dumps(definition))


def check_workload_through_vz(tmp_path: Path, driver: str) -> None:
    definition = _definition(driver)
    with vz_project(tmp_path, definition) as vz:
        out = vz.ok("up", stderr=True)
        assert "setup 1/2: echo setup ran $SETUP_VAR >> /var/tmp/setup.log" in out, out
        assert "from-setup" in out, out  # the step's output is vz up's progress
        services = _services(vz)
        assert list(services) == ["once", "web"]
        assert (services["once"]["state"], services["once"]["last_exit_code"]) == ("exited", 0)
        assert (services["web"]["state"], services["web"]["health"]) == ("running", "healthy")
        web_pid = services["web"]["pid"]
        assert _running(vz, "sleep 10000[1]") == 1
        assert vz.sh("m", "cat /var/tmp/setup.log") == "setup ran yes"  # the Machine's environment
        # Each service's own output (vz status --logs --service; Machines.Logs with a service).
        assert vz.ok("status", "--logs", "--service", "web") == "web up\n"
        assert vz.ok("status", "--logs", "--service", "web", "--tail", "0") == ""
        assert vz.ok("status", "--logs", "--service", "once") == "vz-agent: service once exited (code 0)\n"
        unknown = vz.run("status", "--logs", "--service", "nope")
        assert unknown.returncode != 0 and "no service 'nope' (its services: once, web)" in unknown.stderr

        # Unchanged: setup skipped, the running service untouched.
        again = vz.ok("up", stderr=True)
        assert "setup steps unchanged" in again and "setup 1/2" not in again, again
        assert _services(vz)["web"]["pid"] == web_pid
        assert vz.sh("m", "cat /var/tmp/setup.log") == "setup ran yes"

        # A changed setup runs again in place; its failing step fails vz up, naming it; the Machine stays.
        definition["machines"][0]["setup"].append("echo about to fail; exit 3")
        _write(vz, definition)
        failed = vz.run("up")
        assert failed.returncode != 0
        assert "setup steps (or the image, user or environment they run with) changed" in failed.stderr
        assert "$.machines[0].setup[2] (echo about to fail; exit 3) failed in machine m with exit code 3" in (
            failed.stderr
        ), failed.stderr
        assert vz.sh("m", "cat /var/tmp/setup.log") == "setup ran yes\nsetup ran yes"

        # A service that cannot start fails vz up with its state.
        definition["machines"][0]["setup"][2] = "true"
        definition["machines"][0]["services"][1]["command"] = "echo broken; exit 4"
        _write(vz, definition)
        broken = vz.run("up")
        assert broken.returncode != 0
        assert "service web of machine m did not start: exited" in broken.stderr, broken.stderr
        assert "last exit code 4" in broken.stderr, broken.stderr
        assert _running(vz, "sleep 10000[1]") == 0  # the changed service was stopped
        # The service's log is kept across its restarts (and its change): both runs are in it.
        log = vz.ok("status", "--logs", "--service", "web")
        assert log.startswith("web up\n") and "broken\n" in log and "exited (code 4)" in log, log

        # Services removed from vz.json stop; what they were is gone from vz status.
        definition["machines"][0]["services"][1]["command"] = ["sh", "-c", "exec sleep 100002"]
        _write(vz, definition)
        vz.ok("up")
        running = _services(vz)["web"]
        assert running["state"] == "running"
        assert _running(vz, "sleep 10000[2]") == 1
        for svc in definition["machines"][0]["services"]:
            for key in ("command", "depends_on", "health", "stop_timeout"):
                svc.pop(key, None)
        _write(vz, definition)
        vz.ok("up")
        assert _services(vz) == {}
        assert _running(vz, "sleep 10000[2]") == 0
