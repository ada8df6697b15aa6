"""vz.json's workload fields (``machines[].setup``, ``machines[].services[].command`` ...): what is read, and the
refusals, each naming its JSON path, before anything runs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from vz_core.env._definition import parse_definition
from vz_core.env._errors import DefinitionError
from vz_core.env._workload_def import argv_of, parse_restart


def project(**machine_b: Any) -> dict[str, Any]:
    return {
        "version": 2,
        "project_id": "shop-1",
        "default_machine": "app",
        "machines": [
            {
                "name": "kv",
                "profile": "developer",
                "driver": "linux_native",
                "image": "vz:default",
                "setup": ["mkdir -p /srv/kv", ["touch", "/srv/kv/ready"]],
                "services": [
                    {
                        "name": "db",
                        "port": 6379,
                        "command": ["/srv/kv/server", "--port", "6379"],
                        "restart": "on-failure:5",
                        "health": {"tcp": True, "interval": "500ms", "retries": 5, "start_period": "2s"},
                        "stop_timeout": "3s",
                    }
                ],
            },
            {
                "name": "app",
                "profile": "developer",
                "driver": "linux_native",
                "image": "vz:default",
                "services": [
                    {
                        "name": "web",
                        "port": 8080,
                        "command": "exec python3 -m http.server 8080",
                        "workdir": "/srv",
                        "environment": {"MODE": "dev"},
                        "depends_on": {"kv/db": {"condition": "service_healthy"}},
                        "restart": "always",
                        "health": {"command": ["wget", "-qO-", "http://127.0.0.1:8080/"], "interval": 2},
                    }
                ],
                **machine_b,
            },
        ],
        "paths": [{"from": "app", "to": "kv", "service": "db"}],
        "exports": [{"machine": "app", "service": "web"}],
    }


def problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(DefinitionError) as info:
        parse_definition(data)
    return list(info.value.problems)


def test_every_field_is_read() -> None:
    d = parse_definition(project())
    kv, app = d.machines
    assert kv.setup == ["mkdir -p /srv/kv", ["touch", "/srv/kv/ready"]]
    db = kv.services[0]
    assert db.restart == "on-failure:5" and parse_restart(db.restart) == ("on-failure", 5)
    assert db.health is not None and db.health.tcp is True and db.health.interval == 0.5
    assert db.health.start_period == 2.0 and db.stop_timeout == 3.0
    web = app.services[0]
    assert argv_of(web.command or "") == ("/bin/sh", "-c", "exec python3 -m http.server 8080")
    assert web.health is not None and web.health.interval == 2.0 and web.health.timeout == 30.0
    assert parse_restart("always") == ("always", 0)
    # Setup and service commands are not creation-time settings: changing them never recreates the Machine.
    assert "setup" not in kv.recorded() and "services" not in kv.recorded()


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        (lambda d: d["machines"][1]["services"][0].update(restart="sometimes"), "services[0].restart", "sometimes"),
        (
            lambda d: d["machines"][1]["services"][0].update(restart="on-failure:0"),
            "services[0].restart",
            "on-failure:N",
        ),
        (lambda d: d["machines"][1]["services"][0].update(stop_timeout="3 weeks"), "stop_timeout", "not a duration"),
        (lambda d: d["machines"][1]["services"][0].update(stop_timeout=0), "stop_timeout", "more than 0"),
        (lambda d: d["machines"][1]["services"][0].update(workdir="srv"), "services[0].workdir", "absolute"),
        (lambda d: d["machines"][1]["services"][0].update(command=[]), "services[0].command", "non-empty"),
        (lambda d: d["machines"][1]["services"][0].update(command=""), "services[0].command", "empty"),
        (
            lambda d: d["machines"][1]["services"][0].update(health={"interval": 1}),
            "services[0].health",
            "exactly one of command and tcp",
        ),
        (
            lambda d: d["machines"][1]["services"][0].update(depends_on=["kv/nope"]),
            "$.machines[1].services[0].depends_on",
            "declares no service 'nope'",
        ),
        (
            lambda d: d["machines"][1]["services"][0].update(depends_on=["cache/db"]),
            "$.machines[1].services[0].depends_on",
            "no machine 'cache'",
        ),
        (lambda d: d.update(paths=[]), "$.machines[1].services[0].depends_on", "no declared path"),
        (
            lambda d: (
                d["machines"][0]["services"][0].update(depends_on=["app/web"]),
                d["paths"].append({"from": "kv", "to": "app", "service": "web"}),
            ),
            "services[0].depends_on",
            "cycle: ",
        ),
        (
            lambda d: d["machines"][0]["services"][0].pop("health"),
            "$.machines[1].services[0].depends_on",
            "no health check",
        ),
        (
            lambda d: d["machines"][0]["services"][0].pop("command"),
            "$.machines[0].services[0].restart",
            "needs a command",
        ),
        (lambda d: d["machines"][0].update(setup=["ok", 3]), "$.machines[0].setup[1]", "command"),
    ],
)
def test_refusals_name_the_path(change: Any, path: str, message: str) -> None:
    data = copy.deepcopy(project())
    if "needs a command" in message:
        data["machines"][1]["services"][0].pop("depends_on")  # else the missing command is found there first
    change(data)
    found = problems(data)
    assert any(path in p and message in m for p, m in found), found


def test_a_cycle_inside_one_machine_is_spelled_out() -> None:
    data = project()
    svc = data["machines"][1]["services"]
    svc.append({"name": "worker", "port": 9000, "command": "true", "depends_on": ["web"]})
    svc[0]["depends_on"] = ["worker"]
    found = problems(data)
    assert found == [
        ("$.machines[1].services[0].depends_on", "depends_on forms a cycle: app/web -> app/worker -> app/web")
    ]
