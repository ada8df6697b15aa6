"""Services a Machine's agent supervises: what the host asks for and what it reports.

Plain values shared by drivers, the daemon and the CLI (no protobuf). A ``ServiceSpec`` is one long-running
command of a Machine with its restart policy, health check, dependencies and stop timeout; a ``ServiceState``
is what the agent reports about it. ``environment`` values are secrets (never in ``repr``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

__all__ = [
    "DEPENDENCY_CONDITIONS",
    "RESTART_POLICIES",
    "SERVICE_STATES",
    "HealthCheck",
    "ServiceSpec",
    "ServiceState",
    "spec_to_wire",
    "state_from_wire",
]

RESTART_POLICIES: Final = ("no", "on-failure", "always", "unless-stopped")
DEPENDENCY_CONDITIONS: Final = ("service_started", "service_healthy", "service_completed_successfully")
SERVICE_STATES: Final = ("waiting", "running", "backoff", "exited", "failed", "stopping", "stopped")

RestartPolicy = Literal["no", "on-failure", "always", "unless-stopped"]
_EMPTY: Final[Mapping[str, str]] = MappingProxyType({})


@dataclass(frozen=True)
class HealthCheck:
    """A command (exit 0 = healthy) or a TCP port on the Machine's loopback that accepts a connection."""

    argv: tuple[str, ...] = ()
    tcp_port: int = 0
    interval: float = 30.0
    timeout: float = 30.0
    retries: int = 3
    start_period: float = 0.0


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    argv: tuple[str, ...]
    environment: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    user: str = ""
    workdir: str = ""
    restart: RestartPolicy = "no"
    max_retries: int = 0
    """With ``on-failure``: the most restarts (0 = no bound)."""
    health: HealthCheck | None = None
    depends_on: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    """Service name -> one of ``DEPENDENCY_CONDITIONS`` (services of the same Machine)."""
    stop_timeout: float = 10.0

    def __repr__(self) -> str:
        return (
            f"ServiceSpec(name={self.name!r}, argv={self.argv!r}, environment=<{len(self.environment)} redacted>, "
            f"user={self.user!r}, workdir={self.workdir!r}, restart={self.restart!r}, health={self.health!r}, "
            f"depends_on={dict(self.depends_on)!r}, stop_timeout={self.stop_timeout!r})"
        )


@dataclass(frozen=True)
class ServiceState:
    name: str
    state: str
    """One of ``SERVICE_STATES``."""
    health: str = ""
    """"" (no health check), "starting", "healthy" or "unhealthy"."""
    pid: int = 0
    restarts: int = 0
    last_exit_code: int | None = None
    """``None`` until the service exited once."""
    last_signal: str = ""
    last_error: str = ""
    started_at: str = ""
    log_bytes: int = 0
    """Bytes of output written in all (the agent keeps the newest few MiB)."""


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def spec_to_wire(spec: ServiceSpec) -> dict[str, Any]:
    """The agent's JSON for one service (docs/agent-protocol.md, "Services")."""
    doc: dict[str, Any] = {
        "name": spec.name,
        "argv": list(spec.argv),
        "env": dict(spec.environment),
        "user": spec.user,
        "workdir": spec.workdir,
        "restart": spec.restart,
        "max_retries": spec.max_retries,
        "depends_on": dict(spec.depends_on),
        "stop_timeout_ms": _ms(spec.stop_timeout),
    }
    if spec.health is not None:
        h = spec.health
        doc["health"] = {
            "argv": list(h.argv),
            "tcp_port": h.tcp_port,
            "interval_ms": _ms(h.interval),
            "timeout_ms": _ms(h.timeout),
            "retries": h.retries,
            "start_period_ms": _ms(h.start_period),
        }
    return doc


def state_from_wire(doc: Mapping[str, Any]) -> ServiceState:
    """A ``ServiceState`` from the agent's JSON."""
    exited = bool(doc.get("exited", False))
    return ServiceState(
        name=str(doc.get("name", "")),
        state=str(doc.get("state", "")),
        health=str(doc.get("health", "")),
        pid=int(doc.get("pid", 0)),
        restarts=int(doc.get("restarts", 0)),
        last_exit_code=int(doc.get("last_exit_code", 0)) if exited else None,
        last_signal=str(doc.get("last_signal", "")),
        last_error=str(doc.get("last_error", "")),
        started_at=str(doc.get("started_at", "")),
        log_bytes=int(doc.get("log_bytes", 0)),
    )
