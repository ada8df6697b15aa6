"""A route domain for the fake driver's network tests: a compiled plan, its domain, labelled requests."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from fake_testlib import request

from vz_core import RunImageRequest
from vz_core.env import compile_topology, parse_definition
from vz_core.network import ensure_domain, remove_domain
from vz_core.network.label import LABEL, machine_slice

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def definition() -> dict[str, Any]:
    machines = [
        {"name": "app", "profile": "developer", "driver": "fake", "image": "vz:default"},
        {
            "name": "db",
            "profile": "developer",
            "driver": "fake",
            "image": "vz:default",
            "services": [{"name": "pg", "port": 5432}, {"name": "admin", "port": 8081}],
        },
    ]
    return {
        "version": 2,
        "project_id": "fake-network",
        "machines": machines,
        "paths": [{"from": "app", "to": "db", "service": "pg"}],
    }


def plan_of(environment_id: str) -> dict[str, Any]:
    plan = compile_topology(parse_definition(definition()), environment_id).to_json()
    return json.loads(json.dumps(plan))  # type: ignore[no-any-return]


def environment_id() -> str:
    return "env_" + "".join(secrets.choice(_ALPHABET) for _ in range(12))


def labelled(workspace_id: str, plan: dict[str, Any], machine: str, **overrides: Any) -> RunImageRequest:
    value = machine_slice(plan, machine)
    assert value is not None
    base = request(workspace_id, **overrides)
    return replace(base, labels=(*base.labels, f"{LABEL}={value}"))


@contextlib.asynccontextmanager
async def domain() -> AsyncIterator[dict[str, Any]]:
    env = environment_id()
    plan = plan_of(env)
    await ensure_domain(plan)
    try:
        yield plan
    finally:
        await remove_domain(env)


def machine(plan: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in plan["machines"] if m["name"] == name)


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def leftovers(names: set[str]) -> set[str]:
    """Which of the namespaces ``names`` still exist, as a namespace or as an /etc/netns directory."""
    return (names & namespaces()) | {name for name in names if Path("/etc/netns", name).exists()}
