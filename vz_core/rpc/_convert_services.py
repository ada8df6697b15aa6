"""``vz_core.services`` values <-> ``vz.machine.v1`` service messages (SetServices, ServiceStates)."""

from __future__ import annotations

from collections.abc import Sequence

from vz_core._proto.vz.machine.v1 import extensions_pb2 as ext_pb
from vz_core.errors import InvalidArgumentError
from vz_core.services import RESTART_POLICIES, HealthCheck, RestartPolicy, ServiceSpec, ServiceState

__all__ = ["spec_from_pb", "spec_to_pb", "states_from_pb", "states_to_pb"]


def spec_to_pb(spec: ServiceSpec) -> ext_pb.ServiceSpec:
    msg = ext_pb.ServiceSpec(
        name=spec.name,
        argv=list(spec.argv),
        environment=dict(spec.environment),
        user=spec.user,
        workdir=spec.workdir,
        restart=spec.restart,
        max_retries=spec.max_retries,
        depends_on=dict(spec.depends_on),
        stop_timeout_seconds=spec.stop_timeout,
    )
    if spec.health is not None:
        h = spec.health
        msg.health.CopyFrom(
            ext_pb.HealthCheck(
                argv=list(h.argv),
                tcp_port=h.tcp_port,
                interval_seconds=h.interval,
                timeout_seconds=h.timeout,
                retries=h.retries,
                start_period_seconds=h.start_period,
            )
        )
    return msg


def _restart(value: str, name: str) -> RestartPolicy:
    policy = value or "no"
    if policy not in RESTART_POLICIES:
        raise InvalidArgumentError(f"service {name!r}: restart {value!r} is not one of {', '.join(RESTART_POLICIES)}")
    return policy  # type: ignore[return-value]


def spec_from_pb(msg: ext_pb.ServiceSpec) -> ServiceSpec:
    health = None
    if msg.HasField("health"):
        h = msg.health
        health = HealthCheck(
            argv=tuple(h.argv),
            tcp_port=h.tcp_port,
            interval=h.interval_seconds or 30.0,
            timeout=h.timeout_seconds or 30.0,
            retries=h.retries or 3,
            start_period=h.start_period_seconds,
        )
    return ServiceSpec(
        name=msg.name,
        argv=tuple(msg.argv),
        environment=dict(msg.environment),
        user=msg.user,
        workdir=msg.workdir,
        restart=_restart(msg.restart, msg.name),
        max_retries=msg.max_retries,
        health=health,
        depends_on=dict(msg.depends_on),
        stop_timeout=msg.stop_timeout_seconds or 10.0,
    )


def states_to_pb(states: Sequence[ServiceState]) -> ext_pb.ServiceStatesResponse:
    return ext_pb.ServiceStatesResponse(
        services=[
            ext_pb.ServiceState(
                name=s.name,
                state=s.state,
                health=s.health,
                pid=s.pid,
                restarts=s.restarts,
                exited=s.last_exit_code is not None,
                last_exit_code=s.last_exit_code or 0,
                last_signal=s.last_signal,
                last_error=s.last_error,
                started_at=s.started_at,
                log_bytes=s.log_bytes,
            )
            for s in states
        ]
    )


def states_from_pb(msg: ext_pb.ServiceStatesResponse) -> tuple[ServiceState, ...]:
    return tuple(
        ServiceState(
            name=s.name,
            state=s.state,
            health=s.health,
            pid=s.pid,
            restarts=s.restarts,
            last_exit_code=s.last_exit_code if s.exited else None,
            last_signal=s.last_signal,
            last_error=s.last_error,
            started_at=s.started_at,
            log_bytes=s.log_bytes,
        )
        for s in msg.services
    )
