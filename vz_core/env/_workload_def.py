"""vz.json's workload fields: what a Machine runs (``machines[].setup``, ``machines[].services[].command`` ...).

The value types live here; ``vz_core.env._definition`` puts them on its ``Machine`` and ``Service`` models, and
``workload_problems`` checks what one field cannot see (a ``depends_on`` naming a service that does not exist,
is not supervised, has no health check, is in another Machine without a declared path, or closes a cycle), each
at its JSON path, before anything changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    from vz_core.env._definition import ProjectDefinition

__all__ = [
    "CONDITIONS",
    "Command",
    "DependsOn",
    "Duration",
    "HealthDef",
    "RestartValue",
    "SetupStep",
    "argv_of",
    "dependency_ref",
    "parse_restart",
    "workload_problems",
]

MAX_DURATION: Final = 86400.0
CONDITIONS: Final = ("service_started", "service_healthy", "service_completed_successfully")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE: Final = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)$")
_RESTART_RE: Final = re.compile(r"^(no|always|unless-stopped|on-failure(?::([1-9][0-9]{0,3}))?)$")


def _duration(value: object) -> object:
    """Seconds as a number, or a string with a unit: "500ms", "10s", "2m", "1h" (as Compose spells them)."""
    if isinstance(value, bool):
        raise ValueError('a duration is a number of seconds or a string such as "10s", "500ms", "2m"')
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION_RE.fullmatch(value.strip())
        if match is None:
            raise ValueError(f'{value!r} is not a duration: give seconds, or a number with ms, s, m or h ("10s")')
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise ValueError('a duration is a number of seconds or a string such as "10s"')
    if not 0 < seconds <= MAX_DURATION:
        raise ValueError(f"a duration must be more than 0 and at most {int(MAX_DURATION)} seconds (1 day)")
    return seconds


Duration = Annotated[
    float,
    BeforeValidator(_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DURATION},
                {"type": "string", "pattern": _DURATION_RE.pattern},
            ],
            "description": 'seconds, or a number with a unit: "500ms", "10s", "2m", "1h"',
        }
    ),
]


def _command(value: object) -> object:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("a command string must not be empty")
        if "\x00" in value:
            raise ValueError("a command must not contain a NUL character")
        return value
    if isinstance(value, list):
        if not value or not all(isinstance(a, str) for a in value) or not value[0]:
            raise ValueError("a command list is a non-empty list of strings whose first item is the program")
        if any("\x00" in a for a in value):
            raise ValueError("a command must not contain a NUL character")
        return value
    raise ValueError("a command is a string (run by /bin/sh -c) or a list of strings (the program and arguments)")


Command = Annotated[
    str | list[str],
    BeforeValidator(_command),
    Field(description="a string, run by /bin/sh -c, or a list: the program and its arguments, verbatim"),
]
SetupStep = Command


def argv_of(command: str | Sequence[str]) -> tuple[str, ...]:
    """The argv of a vz.json command: a string runs through ``/bin/sh -c``."""
    if isinstance(command, str):
        return ("/bin/sh", "-c", command)
    return tuple(command)


def _restart(value: object) -> object:
    if isinstance(value, str) and _RESTART_RE.fullmatch(value):
        return value
    raise ValueError(
        f'restart {value!r} is not one of "no", "on-failure", "on-failure:N" (N = 1..9999), "always", "unless-stopped"'
    )


RestartValue = Annotated[
    str,
    BeforeValidator(_restart),
    Field(
        json_schema_extra={"pattern": _RESTART_RE.pattern},
        description=(
            'when the agent restarts the service: "no" (default), "on-failure" (after a non-zero exit; '
            '"on-failure:N" at most N times), "always", "unless-stopped"'
        ),
    ),
]


def parse_restart(value: str) -> tuple[Literal["no", "on-failure", "always", "unless-stopped"], int]:
    """(policy, most restarts; 0 = no bound) of a checked restart value."""
    match = _RESTART_RE.fullmatch(value)
    assert match is not None, value
    if value.startswith("on-failure"):
        return "on-failure", int(match.group(2) or 0)
    return value, 0  # type: ignore[return-value]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class HealthDef(_Model):
    """How the agent tells the service works: a command that exits 0, or a TCP port that accepts."""

    command: Command | None = Field(default=None, description="exit 0 = healthy (run like the service's command)")
    tcp: int | bool | None = Field(
        default=None,
        description="a TCP port on the Machine's loopback that accepts a connection = healthy; true: its own port",
    )
    interval: Duration = Field(default=30.0, description="time between checks (default 30s)")
    timeout: Duration = Field(default=30.0, description="a check taking longer has failed (default 30s)")
    retries: int = Field(default=3, ge=1, le=100, description="consecutive failures that make it unhealthy")
    start_period: Duration | None = Field(
        default=None, description="failures in this time after each start do not count (default none)"
    )

    @field_validator("tcp")
    @classmethod
    def _tcp(cls, value: int | bool | None) -> int | bool | None:
        if value is False:
            raise ValueError("tcp is a port (1..65535) or true (the service's own port); omit it for none")
        if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= 65535:
            raise ValueError("tcp is a port, 1..65535, or true (the service's own port)")
        return value

    @model_validator(mode="after")
    def _one_check(self) -> HealthDef:
        if (self.command is None) == (self.tcp is None):
            raise ValueError("a health check needs exactly one of command and tcp")
        return self


class DependencyDef(_Model):
    condition: Literal["service_started", "service_healthy", "service_completed_successfully"] = Field(
        default="service_started",
        description="started: it runs; healthy: its health check passed; completed_successfully: it exited 0",
    )


DependsOn = Annotated[
    list[str] | dict[str, DependencyDef],
    Field(
        description=(
            'services to wait for before this one starts: names of services of this Machine, or "machine/service" '
            "for another Machine's (it needs a declared path to it). A list waits for each to have started; an "
            'object gives each a condition: {"db": {"condition": "service_healthy"}}'
        )
    ),
]


def dependency_ref(machine: str, ref: str) -> tuple[str, str]:
    """(machine, service) a depends_on key names, seen from ``machine``."""
    owner, sep, name = ref.partition("/")
    return (owner, name) if sep else (machine, ref)


def dependencies(depends_on: list[str] | Mapping[str, DependencyDef] | None) -> dict[str, str]:
    """A depends_on value as ref -> condition."""
    if depends_on is None:
        return {}
    if isinstance(depends_on, list):
        return dict.fromkeys(depends_on, "service_started")
    return {ref: dep.condition for ref, dep in depends_on.items()}


def workload_problems(definition: ProjectDefinition) -> list[tuple[str, str]]:
    """Problems of the workload declarations, each at its JSON path (empty: all is well)."""
    out: list[tuple[str, str]] = []
    machines = {m.name: m for m in definition.machines}
    where_of: dict[tuple[str, str], str] = {}
    for i, m in enumerate(definition.machines):
        for j, svc in enumerate(m.services):
            where_of[(m.name, svc.name)] = f"$.machines[{i}].services[{j}]"
    edges: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for i, m in enumerate(definition.machines):
        for j, svc in enumerate(m.services):
            where = f"$.machines[{i}].services[{j}]"
            runs = svc.command is not None
            for field in ("health", "depends_on", "restart", "workdir", "user", "stop_timeout", "environment"):
                if not runs and field in svc.model_fields_set:
                    out.append((f"{where}.{field}", f"{field} needs a command: only a service with one is run by vz"))
            if svc.health is not None and svc.health.tcp is True and svc.protocol != "tcp":
                out.append((f"{where}.health.tcp", f"true means the service's own port, but it is {svc.protocol}"))
            for ref, condition in dependencies(svc.depends_on).items():
                here = f"{where}.depends_on"
                owner, name = dependency_ref(m.name, ref)
                if owner not in machines:
                    out.append((here, f"{ref!r}: there is no machine {owner!r}"))
                    continue
                target = next((s for s in machines[owner].services if s.name == name), None)
                if target is None:
                    known = ", ".join(s.name for s in machines[owner].services) or "none declared"
                    out.append((here, f"{ref!r}: machine {owner!r} declares no service {name!r} (it has: {known})"))
                    continue
                if (owner, name) == (m.name, svc.name):
                    out.append((here, f"{ref!r}: a service cannot depend on itself"))
                    continue
                if target.command is None:
                    out.append(
                        (here, f"{ref!r} has no command, so vz does not run it and it never starts; give it one")
                    )
                    continue
                if condition == "service_healthy" and target.health is None:
                    out.append((here, f"{ref!r} has no health check, so it never becomes healthy; give it one"))
                    continue
                if owner != m.name and not _path_allows(definition, m.name, owner, target.name, target.port):
                    out.append(
                        (
                            here,
                            f"{ref!r} is in another machine and no declared path lets {m.name!r} reach it; add "
                            f'{{"from": "{m.name}", "to": "{owner}", "service": "{name}"}} to paths',
                        )
                    )
                    continue
                edges.setdefault((m.name, svc.name), []).append((owner, name))
    cycle = _cycle(edges)
    if cycle:
        spelled = " -> ".join(f"{a}/{b}" for a, b in cycle)
        out.append((f"{where_of[cycle[0]]}.depends_on", f"depends_on forms a cycle: {spelled}"))
    return out


def _path_allows(definition: ProjectDefinition, source: str, to: str, service: str, port: int) -> bool:
    for path in definition.paths:
        if path.source == source and path.to == to and (path.service == service or path.port == port):
            return True
    return False


def _cycle(edges: Mapping[tuple[str, str], list[tuple[str, str]]]) -> list[tuple[str, str]]:
    """One cycle of the graph (its nodes, the first repeated at the end), or []."""
    state: dict[tuple[str, str], int] = {}
    stack: list[tuple[str, str]] = []

    def visit(node: tuple[str, str]) -> list[tuple[str, str]]:
        state[node] = 1
        stack.append(node)
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []
